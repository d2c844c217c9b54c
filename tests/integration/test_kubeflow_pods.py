"""Containers of the cpu-tcp image playing the pods of Kubeflow jobs (``pods``): a 2-node
PyTorchJob, a 2-node TrainJob and an MPIJob (launcher + 2 workers). Each container has the pod's
host name and DNS names (network aliases), exactly the environment its controller sets (every
value below names the controller source it copies), and its command in ``args:`` form, so the
image's ENTRYPOINT (``mnp-entrypoint``) runs as it does in a pod. No Kubernetes API server can
run here: the controllers' reconcile loops, webhooks and CNI are not covered.

Sources read (public repositories; line numbers are those of the version read):
- PyTorchJob: kubeflow/training-operator pkg/controller.v1/pytorch/envvar.go (the version with
  EnvNodeRank, release 1.8/1.9) and master.go at 2c099d5d; the default port is
  PytorchJobDefaultPort = 23456 in pkg/apis/kubeflow.org/v1/pytorch_types.go.
- TrainJob: kubeflow/trainer pkg/runtime/framework/plugins/torch/torch.go at 06b555d6
  (EnforceMLPolicy), port constants.ContainerTrainerPort = 29500.
- MPIJob v2beta1: kubeflow/mpi-operator pkg/controller/mpi_job_controller.go at cbe4f8aa (lines as
  there; the
  ``launcherEnvVars``, ``workerEnvVars``, ``ompiEnvVars`` and ``sshVolumeItems`` variables, the
  hostfile ConfigMap and the worker's default ``/usr/sbin/sshd -De`` command).

The last test runs a GPU MPIJob exactly as ``invoke k8s --kind mpijob`` writes it, with the
stand-ins this machine needs for what a p4d node and the cuda11.7-efa image would have.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .pods import Pods

pytestmark = [pytest.mark.docker, pytest.mark.slow]

DDP = """\
import os, socket
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("ddp rank=%d world=%d sum=%g host=%s" % (dist.get_rank(), dist.get_world_size(), t.item(),
                                               socket.gethostname()), flush=True)
# As PyTorch's distributed docs (Shutdown) ask: a gloo process group left to interpreter
# exit can abort the rank with 'terminate called without an active exception'
# (pytorch/pytorch#190489), failing a job that trained.
dist.destroy_process_group()
"""
ALLREDUCE = """\
import socket
from mpi4py import MPI
c = MPI.COMM_WORLD
print("rank=%d size=%d sum=%d host=%s" % (c.Get_rank(), c.Get_size(),
                                          c.allreduce(c.Get_rank() + 1), socket.gethostname()))
"""


@pytest.fixture
def pods(docker_client, cluster_image, tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    (share / "ddp.py").write_text(DDP)
    (share / "allreduce.py").write_text(ALLREDUCE)
    group = Pods(docker_client, cluster_image, share)
    try:
        yield group
    finally:
        group.cleanup()


def _ddp_lines(logs):
    return sorted(re.findall(r"ddp rank=\d world=\d sum=[\d.]+", logs))


def pytorchjob_env(rank):
    """What training-operator gives replica ``rank`` (Master 0, Worker 0 is rank 1) of PyTorchJob
    ``pj`` with one Master, one Worker and ``nprocPerNode: "1"``."""
    return {
        "PYTHONUNBUFFERED": "1",  # envvar.go lines 58-59 (Value: "1", v1.7.0 to v1.9.0)
        "MASTER_PORT": "23456",  # master.go line 43 (the pytorchjob-port, default 23456)
        "MASTER_ADDR": "pj-master-0",  # master.go lines 40 and 47: <job>-master-0
        "WORLD_SIZE": "2",  # envvar.go line 86: replicas x nprocPerNode
        "RANK": str(rank),  # envvar.go line 90 (a Worker's index + 1, line 82)
        "PET_NPROC_PER_NODE": "1",  # envvar.go line 94: spec.nprocPerNode
        "PET_NODE_RANK": str(rank),  # envvar.go line 98
        "PET_NNODES": "2",  # envvar.go line 117: the total replicas (no elasticPolicy)
    }


def test_a_two_node_pytorchjob_runs_through_the_entrypoint(pods):
    pods.pod("pj-master-0", ["python3", "/share/ddp.py"], pytorchjob_env(0))
    pods.pod("pj-worker-0", ["python3", "/share/ddp.py"], pytorchjob_env(1))
    codes = [pods.wait_exit(name, 240) for name in ("pj-master-0", "pj-worker-0")]
    logs = pods.logs()
    assert codes == [0, 0], logs
    assert _ddp_lines(logs) == ["ddp rank=0 world=2 sum=3", "ddp rank=1 world=2 sum=3"], logs
    assert logs.count("scheduler: pytorchjob (detected from MASTER_ADDR)") == 2, logs
    for rank in (0, 1):
        assert f"--nnodes 2 --node_rank {rank} --nproc_per_node 1 --master_addr pj-master-0 " \
               "--master_port 23456" in logs, logs
    assert "cleared PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE" in logs


def trainjob_env(index):
    """What the Trainer's torch plugin gives the ``node`` container of TrainJob ``tj``, node
    ``index`` (numNodes 2, numProcPerNode 1)."""
    return {
        "PET_NNODES": "2",  # torch.go line 158: the trainer PodSet's count (numNodes)
        "PET_NPROC_PER_NODE": "1",  # torch.go line 161: numProcPerNode
        # torch.go line 164-167: from the Indexed Job's completion index, which Kubernetes also
        # sets as JOB_COMPLETION_INDEX
        "PET_NODE_RANK": str(index),
        "JOB_COMPLETION_INDEX": str(index),
        "PET_MASTER_ADDR": "tj-node-0-0.tj",  # torch.go lines 169-170: <tj>-node-0-0.<tj>
        "PET_MASTER_PORT": "29500",  # torch.go line 172: constants.ContainerTrainerPort
    }


def test_a_two_node_trainjob_runs_through_the_entrypoint(pods):
    for index in (0, 1):  # JobSet pod host name <tj>-node-0-<i>, subdomain <tj>
        name = f"tj-node-0-{index}"
        pods.pod(name, ["python3", "/share/ddp.py"], trainjob_env(index), aliases=(f"{name}.tj",))
    codes = [pods.wait_exit(f"tj-node-0-{i}", 240) for i in (0, 1)]
    logs = pods.logs()
    assert codes == [0, 0], logs
    assert _ddp_lines(logs) == ["ddp rank=0 world=2 sum=3", "ddp rank=1 world=2 sum=3"], logs
    assert logs.count("scheduler: trainjob (detected from PET_NODE_RANK)") == 2, logs
    assert logs.count("--master_addr tj-node-0-0.tj --master_port 29500") == 2, logs


def _ssh_secret(pods, tmp_path):
    """The operator's SSH Secret as the kubelet mounts it at sshAuthMountPath (/root/.ssh):
    id_rsa (an ECDSA P-521 key in PEM, newSSHAuthSecret), id_rsa.pub, and authorized_keys (the
    public key again), each file mode 0600 (sshVolumeItems, setupSSHOnPod), read-only, in a
    directory anyone may write, as a Secret volume's tmpfs is (mode 1777): what an sshd with
    StrictModes refuses. Made with the image's ssh-keygen, so the test needs no SSH tools."""
    keys = tmp_path / "ssh"
    keys.mkdir()
    script = ("ssh-keygen -q -t ecdsa -b 521 -m PEM -N '' -C mj -f /keys/id_rsa && "
              "cp /keys/id_rsa.pub /keys/authorized_keys && chmod 600 /keys/* && "
              f"chown -R {os.getuid()}:{os.getgid()} /keys")
    pods.client.containers.run(pods.image, ["-c", script], entrypoint=["/bin/sh"], remove=True,
                               volumes={str(keys): {"bind": "/keys", "mode": "rw"}},
                               labels={"mnp-test": "1"})
    keys.chmod(0o1777)
    return keys


def _mpijob_workers(pods, tmp_path, entrypoint):
    """Workers mj-worker-0 and -1 as the operator makes them (newWorker): host name and DNS
    names, K_MPI_JOB_ROLE=worker (workerEnvVars), the SSH Secret at /root/.ssh and nothing else:
    the hostfile ConfigMap goes to the launcher only (newLauncherPodTemplate). ``entrypoint``:
    the pod's command, None for the image's ENTRYPOINT. Returns the launcher's volumes."""
    keys = _ssh_secret(pods, tmp_path)
    config = tmp_path / "mpi"
    config.mkdir()
    # the hostfile ConfigMap: <job>-worker-<i>.<job>.<ns>.svc slots=<slotsPerWorker>
    (config / "hostfile").write_text("mj-worker-0.mj.default.svc slots=1\n"
                                     "mj-worker-1.mj.default.svc slots=1\n")
    secret = {str(keys): {"bind": "/root/.ssh", "mode": "ro"}}
    for i in (0, 1):
        name = f"mj-worker-{i}"
        pods.pod(name, None, {"K_MPI_JOB_ROLE": "worker"},
                 aliases=(f"{name}.mj", f"{name}.mj.default.svc"), volumes=secret,
                 entrypoint=entrypoint)
    return {**secret, str(config): {"bind": "/etc/mpi", "mode": "ro"}}


def _run_launcher(pods, volumes):
    launcher_env = {
        "K_MPI_JOB_ROLE": "launcher",  # mpi_job_controller.go:164-169 launcherEnvVars
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",  # mpi_job_controller.go:179-180 ompiEnvVars
        # mpi_job_controller.go:183-184 ompiEnvVars: configMountPath (:74) / hostfileName (:75)
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",  # mpi_job_controller.go:187-188
    }
    pods.pod("mj-launcher", ["python3", "/share/allreduce.py"], launcher_env,
             aliases=("mj-launcher.mj",), volumes=volumes)
    code = pods.wait_exit("mj-launcher", 120)
    logs = pods.logs("mj-launcher")
    assert code == 0, pods.logs()
    found = sorted(re.findall(r"rank=\d size=\d sum=\d host=\S+", logs))
    assert found == ["rank=0 size=2 sum=3 host=mj-worker-0", "rank=1 size=2 sum=3 host=mj-worker-1"
                     ], logs
    assert "scheduler: mpijob (detected from K_MPI_JOB_ROLE)" in logs
    assert re.search(r"running: \S*mpirun --allow-run-as-root -np 2 ", logs), logs


def test_an_mpijob_launcher_and_two_workers_run_mpirun_through_the_entrypoint(pods, tmp_path):
    # As `invoke k8s --kind mpijob` writes the workers: the job's command in args, so the
    # image's ENTRYPOINT runs and serves SSH (the operator's default command would bypass it).
    volumes = _mpijob_workers(pods, tmp_path, entrypoint=None)
    for i in (0, 1):
        pods.wait_log(f"mj-worker-{i}", "sshd listening on port 22", 60)
    _run_launcher(pods, volumes)
    # the workers stay up until the pod is stopped, as sshd -De would
    for i in (0, 1):
        worker = pods.containers[f"mj-worker-{i}"]
        worker.reload()
        assert worker.status == "running", pods.logs(f"mj-worker-{i}")
    pods.containers["mj-worker-0"].stop(timeout=10)
    assert pods.wait_exit("mj-worker-0", 30) == 128 + 15


def test_the_operators_default_worker_command_serves_our_image(pods, tmp_path):
    """A worker template with neither command nor args gets `command: /usr/sbin/sshd -De`
    (mpi_job_controller.go, newWorker, at cbe4f8aa): the ENTRYPOINT never runs there. The
    image's /usr/sbin/sshd makes the container's host keys at its first start, and accepts the
    operator's key despite the Secret volume's modes."""
    volumes = _mpijob_workers(pods, tmp_path, entrypoint=["/usr/sbin/sshd", "-De"])
    for i in (0, 1):
        pods.wait_log(f"mj-worker-{i}", "Server listening on 0.0.0.0 port 22", 60)
    _run_launcher(pods, volumes)
    for i in (0, 1):
        logs = pods.logs(f"mj-worker-{i}")
        assert "generating new host keys" in logs and "mnp-entrypoint" not in logs, logs
        assert "Accepted publickey for root" in logs, logs
    # each container made its own keys: no two workers share a host key
    fingerprints = {pods.containers[f"mj-worker-{i}"].exec_run(
        ["ssh-keygen", "-lf", "/etc/ssh/ssh_host_ed25519_key.pub"]).output for i in (0, 1)}
    assert len(fingerprints) == 2, fingerprints


# -- A GPU MPIJob as `invoke k8s` writes it ----------------------------------------------------

GPU_JOB = ("--stack", "cuda11.7-efa", "--nodes", "2", "--instance-type", "p4d.24xlarge")
NCCL_TEST = ["/opt/nccl-tests/bin/all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "1"]
# Stand-ins bound into the containers: an mpirun that records that it started (and with what),
# and the job's program, which records any run of it (neither launcher nor worker may run it).
STANDIN_MPIRUN = '#!/bin/sh\nprintf "%s\\n" "$@" > /share/mpirun-started\n'
STANDIN_PROGRAM = '#!/bin/sh\ntouch "/share/program-ran-on-$(hostname)"\n'


def _written_mpijob(tmp_path):
    """The manifest `invoke k8s --kind mpijob` writes for seed job 8 (nccl-tests on 2 x
    p4d.24xlarge), through the task users call."""
    out = tmp_path / "mpijob.yaml"
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cuda@sha256:" + "f" * 64
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "invoke", "k8s", "--kind", "mpijob", *GPU_JOB,
                           "--image-uri", image, "--output", str(out), "--", *NCCL_TEST],
                          cwd=root, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(out.read_text())


def _as_kubelet_gives(container):
    """The container's env and args as the kubelet hands them over (``$$`` is ``$``)."""
    env = {e["name"]: e["value"].replace("$$", "$") for e in container.get("env", [])}
    return env, [word.replace("$$", "$") for word in container.get("args", [])]


def _standin(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


NVIDIA_SMI = ("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"GPU $i: NVIDIA A100-SXM4-40GB "
              "(UUID: GPU-$i)\"; done\n")
FI_INFO_EFA = "#!/bin/sh\necho 'provider: efa'\necho '    fabric: efa'\n"


def _passed_devices(tmp_path, limits):
    """Stand-ins for what the device plugins pass a pod with these limits: one
    ``/dev/nvidiaN`` per ``nvidia.com/gpu`` and one ``/dev/infiniband/uverbsN`` per
    ``vpc.amazonaws.com/efa`` (empty files where the probe looks for the device nodes), with the
    driver's nvidia-smi and the EFA installer's fi_info, which the cpu-tcp image lacks."""
    found = tmp_path / "devices"
    (found / "infiniband").mkdir(parents=True)
    binds = {}
    for index in range(int(limits.get("nvidia.com/gpu", 0))):
        (found / f"nvidia{index}").write_text("")
        binds[str(found / f"nvidia{index}")] = {"bind": f"/dev/nvidia{index}", "mode": "rw"}
    for index in range(int(limits.get("vpc.amazonaws.com/efa", 0))):
        (found / "infiniband" / f"uverbs{index}").write_text("")
    binds[str(found / "infiniband")] = {"bind": "/dev/infiniband", "mode": "rw"}
    binds[_standin(tmp_path, "nvidia-smi", NVIDIA_SMI)] = {"bind": "/usr/local/bin/nvidia-smi",
                                                           "mode": "ro"}
    binds[_standin(tmp_path, "fi_info", FI_INFO_EFA)] = {"bind": "/usr/bin/fi_info", "mode": "ro"}
    return binds


def _dshm(tmp_path, role, container):
    """The manifest's ``dshm`` volume (an emptyDir in memory, sizeLimit 8192Mi) at /dev/shm: a
    folder of this host's disk stands in for it, as large as the limit or larger."""
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    folder = tmp_path / f"{mount['name']}-{role}"
    folder.mkdir()
    return {str(folder): {"bind": "/dev/shm", "mode": "rw"}}


def _standin_plugin(tmp_path):
    """A loadable ``libnccl-net.so`` naming itself as the stack's aws-ofi-nccl 1.7.4 does (the
    string the probe reads), where cuda11.7-efa installs the plugin (its options.prefix)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this host")
    source = tmp_path / "plugin.c"
    source.write_text('const char *mnp_banner = "Initializing aws-ofi-nccl 1.7.4-aws";\n')
    folder = tmp_path / "aws-ofi-nccl-lib"
    folder.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / "libnccl-net.so"), str(source)],
                   check=True)
    return {str(folder): {"bind": "/opt/aws-ofi-nccl/lib", "mode": "ro"}}


def test_a_gpu_mpijob_as_written_starts_mpirun_and_its_workers_only_serve_ssh(pods, tmp_path):
    """The launcher of a GPU MPIJob has no GPU and no EFA device (its template asks for none, and
    the operator blanks NVIDIA_VISIBLE_DEVICES on it), yet its instance type says 8 GPUs: it must
    still start mpirun. Each worker, run as written (the job's command as args, the ``MNP_*``
    settings), must serve SSH and never run the command. The cpu-tcp image stands in for
    cuda11.7-efa (no GPU image can be built here); the launcher's and workers' containers get
    exactly the env, args and command of the manifest plus what the MPI operator adds
    (kubeflow/mpi-operator pkg/controller/mpi_job_controller.go at cbe4f8aa):
    K_MPI_JOB_ROLE (:164-175, launcherEnvVars/workerEnvVars), the Open MPI variables (:176-190
    ompiEnvVars, and OMPI_MCA_orte_set_default_slots = slotsPerWorker, newLauncherPodTemplate),
    NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES blank on the launcher (:211-214
    nvidiaDisableEnvVars, appended by newLauncherPodTemplate unless runLauncherAsWorker), the
    hostfile ConfigMap at /etc/mpi (:73-74, newConfigMap: <worker>.<job>.<ns>.svc slots=N) and
    the SSH Secret at /root/.ssh (setupSSHOnPod); a worker with args keeps them (newWorker)."""
    manifest = _written_mpijob(tmp_path)
    job, spec = manifest["metadata"]["name"], manifest["spec"]
    slots = spec["slotsPerWorker"]
    (launcher,) = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    (worker,) = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert "resources" not in launcher and "command" not in worker  # as the issue describes
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "8"

    keys = _ssh_secret(pods, tmp_path)
    secret = {str(keys): {"bind": "/root/.ssh", "mode": "ro"}}
    program = {_standin(tmp_path, "program", STANDIN_PROGRAM):
               {"bind": NCCL_TEST[0], "mode": "ro"}}
    workers = [f"{job}-worker-{i}" for i in range(spec["mpiReplicaSpecs"]["Worker"]["replicas"])]
    worker_env, worker_args = _as_kubelet_gives(worker)
    devices = {**_passed_devices(tmp_path, worker["resources"]["limits"]),
               **_standin_plugin(tmp_path)}
    for name in workers:
        pods.pod(name, worker_args, {**worker_env, "K_MPI_JOB_ROLE": "worker"},
                 aliases=(f"{name}.{job}", f"{name}.{job}.default.svc"),
                 volumes={**secret, **program, **devices, **_dshm(tmp_path, name, worker)},
                 entrypoint=worker.get("command"))
    for name in workers:  # launcherCreationPolicy WaitForWorkersReady: port 22 answers
        pods.wait_log(name, "sshd listening on port 22", 60)

    config = tmp_path / "mpi"
    config.mkdir()
    (config / "hostfile").write_text("".join(f"{name}.{job}.default.svc slots={slots}\n"
                                             for name in workers))
    launcher_env, launcher_args = _as_kubelet_gives(launcher)
    launcher_env.update({
        "K_MPI_JOB_ROLE": "launcher",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "OMPI_MCA_orte_set_default_slots": str(slots),
        "NVIDIA_VISIBLE_DEVICES": "",
        "NVIDIA_DRIVER_CAPABILITIES": "",
    })
    mpirun = {_standin(tmp_path, "mpirun", STANDIN_MPIRUN): {"bind": "/usr/bin/mpirun",
                                                              "mode": "ro"}}
    pods.pod(f"{job}-launcher", launcher_args, launcher_env, aliases=(f"{job}-launcher.{job}",),
             volumes={**secret, **program, **mpirun, **_dshm(tmp_path, "launcher", launcher),
                      str(config): {"bind": "/etc/mpi", "mode": "ro"}},
             entrypoint=launcher.get("command"))
    code = pods.wait_exit(f"{job}-launcher", 120)
    logs = pods.logs()
    assert code == 0, logs
    started = (pods.share / "mpirun-started").read_text().splitlines()
    assert started[:3] == ["--allow-run-as-root", "-np", str(slots * len(workers))], started
    assert started[-len(NCCL_TEST):] == NCCL_TEST, started
    for name in workers:
        container = pods.containers[name]
        container.reload()
        assert container.status == "running", pods.logs(name)
        assert "scheduler: mpijob (detected from K_MPI_JOB_ROLE)" in pods.logs(name)
    assert sorted(p.name for p in pods.share.iterdir() if p.name.startswith("program-ran")) == []
