"""Node facts from a fixture tree: devices, versions, programs; the plan then reads only these."""

import os

from entrypoint.plan import make as plan
from entrypoint.probe import facts, netaddr
from entrypoint.settings import config

EFA_INFO = "provider: efa\n    fabric: efa\n"


def touch(root, path, data=b""):
    full = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as handle:
        handle.write(data)


def fake_run(argv):
    if argv[:3] == ["fi_info", "-p", "efa"]:
        return EFA_INFO
    if argv[:2] == ["fi_info", "--version"]:
        return "fi_info: 1.11.1\nlibfabric: 1.11.1amzn1.0\n"
    return None


def probe(tmp_path, env=None, binaries=("mpirun", "fi_info", "sshd")):
    cfg = config.load(env or {})
    return facts.probe(cfg, {"PATH": "/bin"}, root=str(tmp_path), run=fake_run,
                       which=lambda n: "/usr/bin/" + n if n in binaries else None,
                       address=netaddr.Choice("10.0.0.5", "eth0", "test"))


def test_p3dn_like_tree(tmp_path):
    for i in range(8):
        touch(tmp_path, f"/dev/nvidia{i}")
    touch(tmp_path, "/dev/infiniband/uverbs0")
    touch(tmp_path, "/opt/amazon/efa_installed_packages", b"# EFA installer version: 1.10.0\n")
    os.makedirs(str(tmp_path / "opt/amazon/efa/lib"))
    touch(tmp_path, "/opt/aws-ofi-nccl/lib/libnccl-net.so",
          b"\0NET/OFI Initializing aws-ofi-nccl 1.6.0\0")
    touch(tmp_path, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.4.8")
    touch(tmp_path, "/usr/local/lib/python3.6/dist-packages/torch-1.4.0.dist-info/METADATA")
    touch(tmp_path, "/sys/class/net/eth0/device/vendor", b"0x1d0f\n")
    found = probe(tmp_path, {"MNP_INSTANCE_TYPE": "p3dn.24xlarge"})
    assert (found.gpus, found.hpus, found.accelerator) == (8, 0, "gpu")
    assert found.efa_devices == ["uverbs0"] and found.fi_info_efa is True
    assert found.versions == {"aws-ofi-nccl": "1.6.0", "efa-installer": "1.10.0",
                              "libfabric": "1.11.1amzn1.0", "nccl": "2.4.8",
                              "pytorch": "1.4.0"}
    assert found.plugin_path == "/opt/aws-ofi-nccl/lib/libnccl-net.so"
    assert found.libdirs == ["/opt/amazon/efa/lib"] and found.nic_vendor == "0x1d0f"
    assert found.instance_type == "p3dn.24xlarge"
    assert found.binaries["mpirun"] == "/usr/bin/mpirun" and found.binaries["torchrun"] is None
    # the plan built from these facts: plain interface name for NCCL 2.4.8, no FI_PROVIDER
    p = plan.make_plan(config.load({"MNP_INSTANCE_TYPE": "p3dn.24xlarge"}), found,
                       ["python3", "train.py"], {})
    assert p.value("NCCL_SOCKET_IFNAME") == "eth0" and "FI_PROVIDER" not in p.environment


def test_dl1_like_tree(tmp_path):
    for i in range(8):
        touch(tmp_path, f"/dev/hl{i}")
    touch(tmp_path, "/dev/infiniband/uverbs0")
    touch(tmp_path, "/usr/lib/habanalabs/libhccl_ofi_wrapper.so")
    touch(tmp_path, "/var/lib/dpkg/status",
          b"Package: habanalabs-graph\nStatus: install ok installed\nVersion: 1.6.0-439\n\n")
    touch(tmp_path, "/usr/local/lib/python3.8/dist-packages/deepspeed-0.6.1+1.6.0.dist-info/x")
    found = probe(tmp_path, binaries=("pdsh", "deepspeed", "sshd"))
    assert found.hpus == 8 and found.accelerator == "hpu"
    assert found.hccl_wrapper == "/usr/lib/habanalabs/libhccl_ofi_wrapper.so"
    assert found.versions["synapseai"] == "1.6.0"
    assert found.versions["deepspeed"] == "0.6.1+1.6.0"
    assert found.fi_info_efa is None  # no fi_info on PATH in this tree: a fact, not a failure
    assert "hccl-ofi-wrapper" in found.installed()


def test_bare_tree_has_no_versions_and_one_slot(tmp_path):
    found = probe(tmp_path, binaries=())
    assert found.versions == {} and found.slots == 1 and found.accelerator == "none"
    assert found.binaries["mpirun"] is None and found.efa_devices == []
    assert set(found.to_dict()) == set(facts.FIELDS)
