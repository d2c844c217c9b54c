"""Faults 1-4 of issue 8 at the process level, inside the real ``cpu-tcp`` image: each container
first lays out what a GPU, EFA or Gaudi node of an older stack has (NCCL 2.4.8, aws-ofi-nccl
1.6.0, PyTorch 1.4, Gaudi devices, Habana's HCCL wrapper, DeepSpeed 0.6.1, pdsh) as files, then
runs the installed entrypoint's dry run, which probes them as it would on that node. The checks
read the dry run's text ("full environment" and "command" lines), which the entrypoint printed
before this issue too, so each test failed on the old entrypoint and passes now."""

import pytest

from tests.entrypoint.test_ep_fabric import PLUGIN_TAGS, embedded

pytestmark = [pytest.mark.docker]

MAIN = {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_NUM_NODES": "2", "MNP_SECRET": "s", "MNP_DRY_RUN": "1",
        # these faults are about the environment the plan sets; the stand-in devices do not match
        # an instance row (8 GPUs, /dev/shm), which the health gate (tested elsewhere) would stop
        "MNP_HEALTH": "off"}
SITE = "/usr/local/lib/python3.11/dist-packages"
GPUS = "for i in 0 1 2 3 4 5 6 7; do touch /dev/nvidia$i; done"
# aws-ofi-nccl 1.6.0 as its .so carries it: the string its tag's configure.ac makes
# (test_ep_fabric.PLUGIN_TAGS), written byte for byte with printf's octal escapes
PLUGIN_160 = "".join(f"\\{byte:03o}" for byte in embedded(
    next(t.ac_init_version for t in PLUGIN_TAGS if t.tag == "v1.6.0")))
P3DN = " && ".join([
    GPUS, "mkdir -p /dev/infiniband", "touch /dev/infiniband/uverbs0",
    "touch /usr/lib/x86_64-linux-gnu/libnccl.so.2.4.8",
    "mkdir -p /opt/aws-ofi-nccl/lib",
    f"printf '{PLUGIN_160}' > /opt/aws-ofi-nccl/lib/libnccl-net.so",
    "rm -rf /usr/lib/python3/dist-packages/torch-*-info",
    f"mkdir -p {SITE}/torch-1.4.0.dist-info",
])
DL1 = " && ".join([
    "for i in 0 1 2 3 4 5 6 7; do touch /dev/hl$i; done",
    "mkdir -p /dev/infiniband", "touch /dev/infiniband/uverbs0",
    "mkdir -p /usr/lib/habanalabs", "touch /usr/lib/habanalabs/libhccl_ofi_wrapper.so",
    f"rm -rf {SITE}/deepspeed-*-info", f"mkdir -p {SITE}/deepspeed-0.6.1.dist-info",
    "printf '#!/bin/sh\\n' > /usr/local/bin/pdsh", "chmod 0755 /usr/local/bin/pdsh",
])


def dry_run(docker_client, image, setup, **env):
    script = setup + " && exec /usr/local/bin/mnp-entrypoint python3 train.py"
    out = docker_client.containers.run(image, entrypoint=["sh", "-c", script],
                                       environment=dict(MAIN, **env), remove=True,
                                       stdout=True, stderr=True)
    text = out.decode("utf-8")
    full = text.split("full environment of the command:", 1)[1].splitlines()
    command = next(line for line in text.splitlines() if line.startswith("command: "))
    return {line.strip() for line in full if line.strip()}, command, text


def test_fault1_nccl_248_gets_a_plain_socket_ifname(docker_client, cluster_image):
    env, _, text = dry_run(docker_client, cluster_image, P3DN, MNP_FABRIC="efa",
                           MNP_INSTANCE_TYPE="p3dn.24xlarge")
    assert "NCCL_SOCKET_IFNAME=eth0" in env, text


def test_fault2_torchrun_on_pytorch_14_is_distributed_launch(docker_client, cluster_image):
    _, command, text = dry_run(docker_client, cluster_image, P3DN, MNP_FABRIC="efa",
                               MNP_LAUNCHER="torchrun", MNP_SLOTS_PER_NODE="8")
    assert command.startswith("command: python3 -m torch.distributed.launch "), text
    assert "--nproc_per_node 8" in command


def test_fault3_dl1_hccl_over_ofi_with_deepspeed_06_and_pdsh(docker_client, cluster_image):
    env, command, text = dry_run(docker_client, cluster_image, DL1, MNP_FABRIC="efa",
                                 MNP_LAUNCHER="deepspeed", MNP_INSTANCE_TYPE="dl1.24xlarge")
    for needed in ("HCCL_OVER_OFI=1", "HCCL_OVER_TCP=0", "HCCL_SOCKET_IFNAME=eth0"):
        assert needed in env, text
    assert any(v.startswith("LD_LIBRARY_PATH=") and "/usr/lib/habanalabs" in v for v in env)
    assert "--launcher pdsh" in command and "--launcher_args" not in command
    assert not any(v.startswith("DS_ENV_FILE=") for v in env)
    assert "file /root/.deepspeed_env" in text


def test_fault4_no_fi_provider_or_proto_simple_with_plugin_16(docker_client, cluster_image):
    env, _, text = dry_run(docker_client, cluster_image, P3DN, MNP_FABRIC="efa",
                           MNP_INSTANCE_TYPE="p3dn.24xlarge")
    assert not any(v.startswith(("FI_PROVIDER=", "NCCL_PROTO=")) for v in env), text


def test_fault4_socket_tuning_with_mnp_slots_per_node(docker_client, cluster_image):
    # the container's eth0 is a veth, not an AWS ENA: NCCL would use 1 thread x 1 socket
    env, _, text = dry_run(docker_client, cluster_image, GPUS, MNP_FABRIC="tcp",
                           MNP_SLOTS_PER_NODE="8")
    assert "NCCL_SOCKET_NTHREADS=2" in env and "NCCL_NSOCKS_PERTHREAD=8" in env, text
