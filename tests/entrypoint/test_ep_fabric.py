"""Fabric decision and environment, from fixture trees."""

import os

import pytest

from entrypoint.probe import fabric


def touch(root, path, data=b""):
    full = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as handle:
        handle.write(data)
    return full


EFA_INFO = "provider: efa\n    fabric: efa\n    domain: rdmap0s6-rdm\n"


def fake_run(fi_info=EFA_INFO, version="fi_info: 1.18.2\nlibfabric: 1.18.2amzn1.0\n"):
    def run(argv):
        if argv[:2] == ["fi_info", "--version"]:
            return version
        if argv[:3] == ["fi_info", "-p", "efa"]:
            return fi_info
        return None
    return run


def test_uverbs_devices(tmp_path):
    assert fabric.uverbs_devices(str(tmp_path)) == []
    touch(tmp_path, "/dev/infiniband/uverbs1")
    touch(tmp_path, "/dev/infiniband/uverbs0")
    assert [os.path.basename(d) for d in fabric.uverbs_devices(str(tmp_path))] == [
        "uverbs0", "uverbs1"]


def test_interface_vendor(tmp_path):
    assert fabric.interface_vendor("eth0", str(tmp_path)) is None
    touch(tmp_path, "/sys/class/net/eth0/device/vendor", b"0x1d0f\n")
    assert fabric.interface_vendor("eth0", str(tmp_path)) == "0x1d0f"


def efa_tree(tmp_path, plugin_version="1.7.4-aws", plugin_dir="/opt/aws-ofi-nccl/lib",
             name="libnccl-net.so"):
    touch(tmp_path, "/opt/amazon/efa_installed_packages",
          b"# EFA installer version: 1.29.0\n# Debug packages installed: no\n")
    os.makedirs(str(tmp_path / "opt/amazon/efa/lib"))
    os.makedirs(str(tmp_path / "opt/amazon/openmpi/lib"))
    if plugin_version:
        touch(tmp_path, plugin_dir + "/" + name,
              b"\x7fELF...NET/OFI Initializing aws-ofi-nccl %s\0" % plugin_version.encode())


def test_versions_from_the_tree(tmp_path):
    efa_tree(tmp_path)
    assert fabric.installer_version(str(tmp_path)) == "1.29.0"
    path, version = fabric.find_plugin(str(tmp_path))
    assert path.endswith("/opt/aws-ofi-nccl/lib/libnccl-net.so") and version == (1, 7, 4)
    assert fabric.libfabric_version(fake_run()) == "1.18.2amzn1.0"
    assert fabric.libfabric_version(lambda argv: None) is None


def test_bundled_plugin_is_found(tmp_path):
    efa_tree(tmp_path, plugin_version="1.15.0", plugin_dir="/opt/amazon/ofi-nccl/lib",
             name="libnccl-net-ofi.so")
    path, version = fabric.find_plugin(str(tmp_path))
    assert path.endswith("libnccl-net-ofi.so") and version == (1, 15, 0)


@pytest.mark.parametrize("itype,expected", [
    ("p4d.24xlarge", True), ("p4de.24xlarge", True), ("p5.48xlarge", True),
    ("p5en.48xlarge", True), ("p3dn.24xlarge", False), ("g5.48xlarge", False),
    ("trn1.32xlarge", True),
])
def test_rdma_capable_by_instance_type(itype, expected):
    assert fabric.rdma_capable(itype)[0] is expected


def test_installer_version_missing(tmp_path):
    assert fabric.installer_version(str(tmp_path)) is None
