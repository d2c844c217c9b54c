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
    path, version, why = fabric.find_plugin(str(tmp_path))
    assert path.endswith("/opt/aws-ofi-nccl/lib/libnccl-net.so") and version == (1, 7, 4)
    assert why == "'Initializing aws-ofi-nccl 1.7.4-aws'"
    assert fabric.libfabric_version(fake_run()) == "1.18.2amzn1.0"
    assert fabric.libfabric_version(lambda argv: None) is None


def test_bundled_plugin_is_found(tmp_path):
    efa_tree(tmp_path, plugin_version="1.15.0", plugin_dir="/opt/amazon/ofi-nccl/lib",
             name="libnccl-net-ofi.so")
    path, version, _ = fabric.find_plugin(str(tmp_path))
    assert path.endswith("libnccl-net-ofi.so") and version == (1, 15, 0)


def test_no_plugin_says_so(tmp_path):
    assert fabric.find_plugin(str(tmp_path)) == (None, None,
                                                 "no aws-ofi-nccl library (libnccl-net*.so)")


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
# Autoconf makes PACKAGE_STRING "<name> <version>" from configure.ac's AC_INIT: a fixed version
# at line 9 up to the releases whose version m4/get_version.sh prints (configure.ac lines 12-14
# at commit 159c97397cd0): the tag less its "v" at a tagged commit (get_version.sh lines 43-46),
# "git-<short hash>" anywhere else (lines 49-55). The versions below are AC_INIT's at each tag we
# pin (stacks.yaml aws-ofi-nccl, and the EFA installers' bundled plugin), plus what builds from
# git embed, which the probe must not mistake for a release.
Tag = namedtuple("Tag", "tag ac_init_version expected source")
AC_INIT = "https://github.com/aws/aws-ofi-nccl/blob/%s/configure.ac#L9"
GET_VERSION = ("https://github.com/aws/aws-ofi-nccl/blob/159c97397cd0aac9c157327e2d031f58c74e5593/"
               "m4/get_version.sh#L%s")
PLUGIN_TAGS = [
    # built from source by the aws-ofi-nccl layer (stacks.yaml download.url names the tag)
    Tag("v1.6.0", "1.6.0", (1, 6, 0), AC_INIT % "v1.6.0"),
    Tag("v1.7.4-aws", "1.7.4-aws", (1, 7, 4), AC_INIT % "v1.7.4-aws"),
    Tag("v1.12.1-aws", "1.12.1-aws", (1, 12, 1), AC_INIT % "v1.12.1-aws"),
    # bundled by the EFA installers 1.50.0 and 1.51.0 (stacks.yaml efa provides); the release
    # tarballs' version, as NCCL logs it on real nodes ("NET/OFI Initializing aws-ofi-nccl 1.21.1")
    Tag("v1.21.1", "1.21.1", (1, 21, 1), AC_INIT % "v1.21.1"),
    Tag("v1.22.0", "1.22.0", (1, 22, 0), AC_INIT % "v1.22.0"),
    # AC_INIT between releases: [1.8.1a1-aws] (commit d6bde377361e; a pre-release reads as its
    # release), [1.11.0-aws] (01f16dd350c8)
    Tag("d6bde377361e", "1.8.1a1-aws", (1, 8, 1), AC_INIT % "d6bde377361ec22d0aeafdd0ce043939df0a4546"),
    Tag("01f16dd350c8", "1.11.0-aws", (1, 11, 0), AC_INIT % "01f16dd350c8529b0a3674a9309882e3c7f23ef7"),
    # master's next-release alpha (https://github.com/aws/aws-ofi-nccl/pull/809, 2025-03-14)
    Tag("master-2025", "1.14.1a1", (1, 14, 1), "https://github.com/aws/aws-ofi-nccl/pull/809"),
    # the development branch's fixed AC_INIT before get_version.sh: no release number
    Tag("master", "GitHub-dev", None, AC_INIT % "master"),
    # a commit no tag points at, since get_version.sh: no release number (NCCL logs it as
    # "NET/OFI Initializing aws-ofi-nccl git-6e504db"); a hash of digits only is no release either
    Tag("git-6e504db", "git-6e504db", None, GET_VERSION % "49-L55"),
    Tag("git-1234567", "git-1234567", None, GET_VERSION % "49-L55"),
]


def embedded(version, name="aws-ofi-nccl", extra=b""):
    """The bytes around the plugin's init message in its .so (other strings and NULs around)."""
    return (b"\x7fELF\x02\x01\x01\0" + extra
            + b"NET/OFI Selected Provider is %s (found %d nics)\0"
            + b"NET/OFI Initializing " + f"{name} {version}".encode() + b"\0"
            + b"NET/OFI Using CUDA runtime version %d\0")


@pytest.mark.parametrize("tag", PLUGIN_TAGS, ids=[t.tag for t in PLUGIN_TAGS])
def test_plugin_version_of_each_pinned_tag(tmp_path, tag):
    path = touch(tmp_path, "/opt/aws-ofi-nccl/lib/libnccl-net.so", embedded(tag.ac_init_version))
    version, why = fabric.plugin_version(path)
    assert version == tag.expected, tag.source
    assert why.startswith(f"'Initializing aws-ofi-nccl {tag.ac_init_version}'")
    assert (version is None) == ("no release number" in why), why


def test_a_git_build_says_which_commit_and_why_it_has_no_release(tmp_path):
    path = touch(tmp_path, "/opt/aws-ofi-nccl/lib/libnccl-net.so", embedded("git-6e504db"))
    assert fabric.plugin_version(path) == (None, "'Initializing aws-ofi-nccl git-6e504db': a build "
                                                 "of git commit 6e504db, at no release tag, so no "
                                                 "release number")
    dev = touch(tmp_path, "/opt/dev/libnccl-net.so", embedded("GitHub-dev"))
    assert fabric.plugin_version(dev)[1].endswith("a build of the development branch, so no "
                                                  "release number")


def test_a_git_build_in_an_old_versioned_prefix_is_not_that_release(tmp_path):
    """A build of master installed under a prefix named for an older release embeds that name
    (its topology folder, <prefix>/share/aws-ofi-nccl/xml): only the init message counts, so it
    is not read as 1.7.4 (which would pick 1.7.4's settings for a newer plugin)."""
    prefix = b"/opt/aws-ofi-nccl-1.7.4/share/aws-ofi-nccl/xml\0"
    path = touch(tmp_path, "/opt/aws-ofi-nccl-1.7.4/lib/libnccl-net.so",
                 embedded("git-6e504db", extra=prefix))
    assert fabric.plugin_version(path)[0] is None
    released = touch(tmp_path, "/opt/r/libnccl-net.so", embedded("1.22.0", extra=prefix))
    assert fabric.plugin_version(released)[0] == (1, 22, 0)


def test_no_init_message_and_unreadable_say_why(tmp_path):
    other = touch(tmp_path, "/opt/x/libnccl-net.so", b"\x7fELF aws-ofi-nccl-1.7.4 \0")
    assert fabric.plugin_version(other) == (
        None, f"no 'Initializing aws-ofi-nccl' message in {other}")
    version, why = fabric.plugin_version(str(tmp_path / "gone.so"))
    assert version is None and why.startswith("cannot read ")


def test_a_git_build_gets_the_settings_every_release_takes(tmp_path):
    """What the plan does with no release: NCCL_NET is the name every release answers to ("AWS
    Libfabric": the pre-1.13 name, which later releases still accept, nvidia_plugin_name_fixup in
    src/nccl_ofi_interface_nvidia.cpp at commit 02a874dc8b1a), and none of the old plugins' own
    settings (FI_PROVIDER=efa and NCCL_PROTO=simple are for <= 1.5.0 only)."""
    from entrypoint.plan import envtable

    context = {"fabric": "efa", "accelerator": "gpu", "rdma": True, "nic": "ena",
               "present": {"aws-ofi-nccl"}, "nccl_node": True}
    chosen = {row.setting: (value, guesses) for row, value, guesses
              in envtable.select(context, {"nccl": "2.27.7", "libfabric": "2.4.0"}, "eth0")}
    assert chosen["NCCL_NET"] == ("AWS Libfabric", ["aws-ofi-nccl version unknown"])
    assert "FI_PROVIDER" not in chosen and "NCCL_PROTO" not in chosen
    known = {row.setting: value for row, value, _ in envtable.select(
        context, {"nccl": "2.27.7", "libfabric": "2.4.0", "aws-ofi-nccl": "1.22.0"}, "eth0")}
    assert known["NCCL_NET"] == "Libfabric"


def test_the_facts_keep_why_a_plugin_has_no_release(tmp_path):
    from entrypoint.probe import facts as facts_mod

    touch(tmp_path, "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", embedded("git-6e504db"))
    found = facts_mod.NodeFacts()
    facts_mod._versions(found, str(tmp_path), lambda argv: None)
    assert "aws-ofi-nccl" not in found.versions
    assert found.version_sources["aws-ofi-nccl"] == (
        "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so: release unknown ('Initializing aws-ofi-nccl "
        "git-6e504db': a build of git commit 6e504db, at no release tag, so no release number)")
    assert "aws-ofi-nccl" in found.installed()


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
