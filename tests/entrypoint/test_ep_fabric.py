"""Fabric decision and environment, from fixture trees."""

import os

import pytest

from entrypoint import fabric


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


def test_no_device_is_tcp(tmp_path):
    result = fabric.decide("auto", root=str(tmp_path), run=fake_run())
    assert result.kind == "tcp"
    assert "no /dev/infiniband/uverbs" in result.evidence


def test_device_and_provider_is_efa(tmp_path):
    touch(tmp_path, "/dev/infiniband/uverbs0")
    touch(tmp_path, "/dev/infiniband/uverbs1")
    result = fabric.decide("auto", root=str(tmp_path), run=fake_run())
    assert result.kind == "efa"
    assert "uverbs0, uverbs1" in result.evidence and "fi_info" in result.evidence


def test_device_without_provider_is_tcp(tmp_path):
    touch(tmp_path, "/dev/infiniband/uverbs0")
    result = fabric.decide("auto", root=str(tmp_path), run=fake_run(fi_info="provider: tcp\n"))
    assert result.kind == "tcp" and "no efa provider" in result.evidence
    result = fabric.decide("auto", root=str(tmp_path), run=lambda argv: None)
    assert result.kind == "tcp" and "fi_info -p efa failed" in result.evidence


def test_forced_modes(tmp_path):
    assert fabric.decide("tcp", root=str(tmp_path)).kind == "tcp"
    forced = fabric.decide("efa", root=str(tmp_path))
    assert forced.kind == "efa" and "no /dev/infiniband" in forced.evidence


def test_tcp_env(tmp_path):
    result = fabric.configure(fabric.Fabric("tcp", "x"), "eth0", root=str(tmp_path))
    assert result.env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert result.env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert ("btl_tcp_if_include", "eth0") in result.mca
    assert ("oob_tcp_if_include", "eth0") in result.mca
    assert ("pml", "ob1") in result.mca and ("btl", "^openib") in result.mca
    assert "FI_PROVIDER" not in result.env
    assert "NCCL_SOCKET_NTHREADS" not in result.env  # no GPU


def test_tcp_socket_threads_only_for_gpus_off_ena(tmp_path):
    gpu = fabric.configure(fabric.Fabric("tcp", "x"), "eth0", slots_kind="gpu",
                           root=str(tmp_path))
    assert gpu.env["NCCL_SOCKET_NTHREADS"] == "2" and gpu.env["NCCL_NSOCKS_PERTHREAD"] == "8"
    touch(tmp_path, "/sys/class/net/eth0/device/vendor", b"0x1d0f\n")
    ena = fabric.configure(fabric.Fabric("tcp", "x"), "eth0", slots_kind="gpu",
                           root=str(tmp_path))
    assert "NCCL_SOCKET_NTHREADS" not in ena.env


def test_tcp_with_plugin_installed_pins_nccl_to_sockets(tmp_path):
    touch(tmp_path, "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so",
          b"\0NET/OFI Initializing aws-ofi-nccl 1.13.2-aws\0")
    result = fabric.configure(fabric.Fabric("tcp", "x"), "eth0", root=str(tmp_path))
    assert result.env["NCCL_NET"] == "Socket"


def efa_tree(tmp_path, plugin_version="1.7.4-aws", plugin_dir="/opt/aws-ofi-nccl/lib",
             name="libnccl-net.so"):
    touch(tmp_path, "/opt/amazon/efa_installed_packages",
          b"# EFA installer version: 1.29.0\n# Debug packages installed: no\n")
    os.makedirs(str(tmp_path / "opt/amazon/efa/lib"))
    os.makedirs(str(tmp_path / "opt/amazon/openmpi/lib"))
    if plugin_version:
        touch(tmp_path, plugin_dir + "/" + name,
              b"\x7fELF...NET/OFI Initializing aws-ofi-nccl %s\0" % plugin_version.encode())


def test_efa_env_new_plugin_on_p4d(tmp_path):
    efa_tree(tmp_path)
    result = fabric.configure(fabric.Fabric("efa", "x"), "eth0", instance_type="p4d.24xlarge",
                              root=str(tmp_path), run=fake_run())
    env = result.env
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "NCCL_PROTO" not in env
    assert env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert env["LD_LIBRARY_PATH"].split(":") == [
        "/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib", "/opt/aws-ofi-nccl/lib"]
    assert result.versions == {"aws-ofi-nccl": "1.7.4", "efa-installer": "1.29.0",
                               "libfabric": "1.18.2amzn1.0"}


def test_efa_env_old_plugin_on_p3dn(tmp_path):
    efa_tree(tmp_path, plugin_version="1.1.3-aws")
    result = fabric.configure(fabric.Fabric("efa", "x"), "eth0", instance_type="p3dn.24xlarge",
                              root=str(tmp_path), run=fake_run())
    assert result.env["NCCL_PROTO"] == "simple"
    assert "FI_EFA_USE_DEVICE_RDMA" not in result.env
    assert any("no EFA RDMA" in n for n in result.notes)


def test_efa_rdma_from_gpu_model_and_imds(tmp_path):
    efa_tree(tmp_path)
    by_gpu = fabric.configure(fabric.Fabric("efa", "x"), "eth0",
                              gpu_names=["NVIDIA H100 80GB HBM3"], root=str(tmp_path))
    assert by_gpu.env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    v100 = fabric.configure(fabric.Fabric("efa", "x"), "eth0",
                            gpu_names=["Tesla V100-SXM2-32GB"], root=str(tmp_path))
    assert "FI_EFA_USE_DEVICE_RDMA" not in v100.env
    by_imds = fabric.configure(fabric.Fabric("efa", "x"), "eth0", root=str(tmp_path),
                               imds=lambda: "p5.48xlarge")
    assert by_imds.env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    unknown = fabric.configure(fabric.Fabric("efa", "x"), "eth0", root=str(tmp_path),
                               imds=lambda: None)
    assert "FI_EFA_USE_DEVICE_RDMA" not in unknown.env
    assert any("MNP_INSTANCE_TYPE" in n for n in unknown.notes)


def test_efa_bundled_plugin_with_ofi_name(tmp_path):
    efa_tree(tmp_path, plugin_version="1.15.0", plugin_dir="/opt/amazon/ofi-nccl/lib",
             name="libnccl-net-ofi.so")
    result = fabric.configure(fabric.Fabric("efa", "x"), "eth0", root=str(tmp_path))
    assert result.env["NCCL_NET_PLUGIN"] == "ofi"
    assert "/opt/amazon/ofi-nccl/lib" in result.env["LD_LIBRARY_PATH"]


def test_efa_without_plugin(tmp_path):
    efa_tree(tmp_path, plugin_version=None)
    result = fabric.configure(fabric.Fabric("efa", "x"), "eth0", root=str(tmp_path))
    assert any("no aws-ofi-nccl" in n for n in result.notes)
    assert "NCCL_PROTO" not in result.env


@pytest.mark.parametrize("itype,expected", [
    ("p4d.24xlarge", True), ("p4de.24xlarge", True), ("p5.48xlarge", True),
    ("p5en.48xlarge", True), ("p3dn.24xlarge", False), ("g5.48xlarge", False),
    ("trn1.32xlarge", True),
])
def test_rdma_capable_by_instance_type(itype, expected):
    assert fabric.rdma_capable(itype)[0] is expected


def test_user_variables_win():
    env, kept = fabric.merge_env(
        {"NCCL_SOCKET_IFNAME": "ens5", "LD_LIBRARY_PATH": "/mine", "X": "1"},
        {"NCCL_SOCKET_IFNAME": "=eth0", "FI_PROVIDER": "efa",
         "LD_LIBRARY_PATH": "/opt/amazon/efa/lib:/mine"})
    assert env["NCCL_SOCKET_IFNAME"] == "ens5"
    assert env["FI_PROVIDER"] == "efa"
    assert env["LD_LIBRARY_PATH"] == "/mine:/opt/amazon/efa/lib"
    assert kept == ["NCCL_SOCKET_IFNAME=ens5 (ours: =eth0)"]


def test_user_mca_variables_drop_our_flags():
    mca = [("pml", "ob1"), ("btl", "^openib")]
    assert fabric.mca_flags(mca, {}) == ["-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    assert fabric.mca_flags(mca, {"OMPI_MCA_pml": "cm"}) == ["-mca", "btl", "^openib"]


def test_installer_version_missing(tmp_path):
    assert fabric.installer_version(str(tmp_path)) is None
