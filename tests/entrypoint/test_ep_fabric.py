"""Fabric decision and environment, from fixture trees."""

import os
from collections import namedtuple

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


# -- the aws-ofi-nccl version probe against the plugin's own strings ----------------------------
# The plugin logs (and so embeds in its .so, as one C string literal) "Initializing "
# PACKAGE_STRING: src/nccl_ofi_net.c, nccl_net_ofi_create_plugin (its first NCCL_OFI_INFO
# call), whose NCCL_OFI_INFO macro puts "NET/OFI " before the format (include/nccl_ofi_log.h).
# Autoconf makes PACKAGE_STRING "<name> <version>" from configure.ac's AC_INIT, line 9:
# AC_INIT([aws-ofi-nccl], [<version>], ...). The versions below are AC_INIT's at each tag we pin
# (stacks.yaml aws-ofi-nccl, and the EFA installers' bundled plugin), plus strings the probe must
# not mistake for a release.
Tag = namedtuple("Tag", "tag ac_init_version expected source")
AC_INIT = "https://github.com/aws/aws-ofi-nccl/blob/%s/configure.ac#L9"
PLUGIN_TAGS = [
    # built from source by the aws-ofi-nccl layer (stacks.yaml download.url names the tag)
    Tag("v1.6.0", "1.6.0", (1, 6, 0), AC_INIT % "v1.6.0"),
    Tag("v1.7.4-aws", "1.7.4-aws", (1, 7, 4), AC_INIT % "v1.7.4-aws"),
    Tag("v1.12.1-aws", "1.12.1-aws", (1, 12, 1), AC_INIT % "v1.12.1-aws"),
    # bundled by the EFA installers 1.50.0 and 1.51.0 (stacks.yaml efa provides); the release
    # tarballs' AC_INIT, as NCCL logs it on real nodes ("NET/OFI Initializing aws-ofi-nccl 1.21.1")
    Tag("v1.21.1", "1.21.1", (1, 21, 1), AC_INIT % "v1.21.1"),
    Tag("v1.22.0", "1.22.0", (1, 22, 0), AC_INIT % "v1.22.0"),
    # AC_INIT between releases: [1.8.1a1-aws] (commit d6bde377361e; a pre-release reads as its
    # release), [1.11.0-aws] (01f16dd350c8)
    Tag("d6bde377361e", "1.8.1a1-aws", (1, 8, 1), AC_INIT % "d6bde377361ec22d0aeafdd0ce043939df0a4546"),
    Tag("01f16dd350c8", "1.11.0-aws", (1, 11, 0), AC_INIT % "01f16dd350c8529b0a3674a9309882e3c7f23ef7"),
    # the development branch's AC_INIT: a plugin built from it has no release number
    Tag("master", "GitHub-dev", None, AC_INIT % "master"),
]


def embedded(version, name="aws-ofi-nccl"):
    """The bytes around the plugin's init message in its .so (other strings and NULs around)."""
    return (b"\x7fELF\x02\x01\x01\0" + b"NET/OFI Selected Provider is %s (found %d nics)\0"
            + b"NET/OFI Initializing " + f"{name} {version}".encode() + b"\0"
            + b"NET/OFI Using CUDA runtime version %d\0")


@pytest.mark.parametrize("tag", PLUGIN_TAGS, ids=[t.tag for t in PLUGIN_TAGS])
def test_plugin_version_of_each_pinned_tag(tmp_path, tag):
    path = touch(tmp_path, "/opt/aws-ofi-nccl/lib/libnccl-net.so", embedded(tag.ac_init_version))
    assert fabric.plugin_version(path) == tag.expected, tag.source


def test_every_pinned_plugin_version_has_its_tag():
    """Each aws-ofi-nccl version stacks.yaml builds or an EFA installer there provides is in
    PLUGIN_TAGS: a new pin without its real string fails here."""
    import yaml

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "stacks.yaml")) as handle:
        data = yaml.safe_load(handle)
    pinned = set(data["components"]["aws-ofi-nccl"]["versions"])
    for version in data["components"]["efa"]["versions"].values():
        provided = (version.get("provides") or {}).get("aws-ofi-nccl")
        if provided:
            pinned.add(provided)
    released = {".".join(map(str, t.expected)) for t in PLUGIN_TAGS if t.tag.startswith("v")}
    assert pinned <= released, sorted(pinned - released)
