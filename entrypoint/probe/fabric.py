"""Fabric probes: what the node has for EFA, and which instance types do RDMA over EFA.

The decision (EFA or TCP, and every variable that goes with it) is in ``plan`` and the
version-dependent rows of ``envtable``; this module only reads the machine:

- ``uverbs_devices``: ``/dev/infiniband/uverbs*`` (one per EFA passed into the container);
- ``installer_version``: ``/opt/amazon/efa_installed_packages``;
- ``find_plugin`` / ``plugin_version``: the aws-ofi-nccl library and the release its init message
  names, or None and why (a build from git between releases names none);
- ``libfabric_version``: ``fi_info --version``;
- ``interface_vendor``: the PCI vendor of the job's interface (``0x1d0f``: AWS ENA);
- ``imds_instance_type``: one IMDSv2 query (1 s budget), only asked when EFA devices exist;
- ``rdma_capable``: RDMA reads over EFA by instance type (``INSTANCE_RDMA_READ``, read from
  ``instances``, the instance table rendered from ``matrix/model/instances.yaml``: the entrypoint
  cannot import ``matrix``), then by family (``RDMA_FAMILIES``, and the table's rows of the
  family), else by GPU model;
- ``INSTANCE_TYPES``: the instance table's names; ``KNOWN_FAMILIES``: their families and
  ``RDMA_FAMILIES``. ``MNP_INSTANCE_TYPE`` is a table type or an EC2 type of a known family
  (``unknown_type`` says what is wrong with any other), and ``family_note`` names the family a
  type outside the table goes by.
"""

import difflib
import glob
import os
import re
import stat

from .instances import INSTANCES

# instance type -> EFA RDMA read (the table's efa_rdma_read; its rows cite
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html "Supported instance types").
INSTANCE_RDMA_READ = dict((name, row.efa_rdma_read) for name, row in INSTANCES.items())
INSTANCE_TYPES = tuple(sorted(INSTANCE_RDMA_READ))
# Families whose EFA sizes all do RDMA reads (same page and tables), for a type the instance
# metadata reports that the table does not list: the table's families plus the newer P6, Trn.
RDMA_FAMILIES = ("c6i", "c7gn", "dl1", "g6", "g6e", "hpc6a", "hpc7g", "p4d", "p4de", "p5", "p5e",
                 "p5en", "p6-b200", "p6-b300", "p6e-gb200", "trn1", "trn1n", "trn2", "trn2u")
# "The instance family is everything before the period (.) in the instance type name": the EC2
# API's PerformanceFactorReference.InstanceFamily, e.g. https://docs.aws.amazon.com/sdk-for-kotlin/
# api/latest/ec2/aws.sdk.kotlin.services.ec2.model/-performance-factor-reference/instance-family.html
FAMILY_SEPARATOR = "."
KNOWN_FAMILIES = tuple(sorted(set(name.split(FAMILY_SEPARATOR, 1)[0] for name in INSTANCE_RDMA_READ)
                              | set(RDMA_FAMILIES)))
# EC2's instance sizes (the AWS CDK's InstanceSize enum lists every one: nano ... xlarge, 2xlarge ...
# 112xlarge, metal, metal-16xl ... metal-48xl; https://docs.aws.amazon.com/cdk/api/v2/docs/
# aws-cdk-lib.aws_ec2.InstanceSize.html): "48xlarg" is a typo, not a size the table lacks.
SIZE_RE = re.compile(r"^(?:nano|micro|small|medium|large|xlarge|[1-9][0-9]*xlarge|"
                     r"metal|metal-[1-9][0-9]*xl)$")
TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
RDMA_GPUS = ("A100", "H100", "H200", "B200", "B300", "GB200")
ENA_VENDOR = "0x1d0f"
PLUGIN_GLOBS = (
    "/opt/amazon/ofi-nccl/lib*/libnccl-net*.so*",
    "/opt/amazon/ofi-nccl/lib*/*/libnccl-net*.so*",
    "/opt/aws-ofi-nccl/lib*/libnccl-net*.so*",
    "/usr/local/lib/libnccl-net*.so*",
    "/usr/lib/x86_64-linux-gnu/libnccl-net*.so*",
    "/usr/lib64/libnccl-net*.so*",
)
# The plugin's first log line is "Initializing " PACKAGE_STRING, one C string literal in the .so
# (src/nccl_ofi_net.cpp, nccl_net_ofi_create_plugin; src/nccl_ofi_net.c before the sources became
# C++), and autoconf makes PACKAGE_STRING
# "aws-ofi-nccl <AC_INIT version>". Only that string says which build this is: any other
# "aws-ofi-nccl-1.2.3" in the file (a versioned install prefix such as
# /opt/aws-ofi-nccl-1.7.4/share/aws-ofi-nccl/xml, a source path) may name an older release than
# the code, so nothing else is read.
_PLUGIN_INIT_RE = re.compile(rb"Initializing aws-ofi-nccl ([\x21-\x7e]{1,64})")
# AC_INIT's version at a release tag (1.7.4-aws, 1.21.1; from m4/get_version.sh: the tag less its
# "v") or, on a branch between releases, the next release's alpha: 1.8.1a1-aws, "the version
# that will eventually become" the next release (https://github.com/aws/aws-ofi-nccl/pull/536),
# on master from https://github.com/aws/aws-ofi-nccl/pull/809 (2025-03-14). Either has every
# change of the releases before it, so its numbers are read as its release.
_PLUGIN_RELEASE_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?![\d.])")
# What builds from git embed instead of a release: "GitHub-dev", the development branch's fixed
# AC_INIT before release numbers came from git; "git-<short hash>", m4/get_version.sh at
# commit 159c97397cd0 lines 49-55 (configure.ac lines 12-14 there take AC_INIT's version from it)
# for a commit no tag points at, e.g. NCCL's log "NET/OFI Initializing aws-ofi-nccl git-6e504db".
_PLUGIN_GIT_RE = re.compile(r"^git-([0-9a-f]{4,40})$")
_PLUGIN_DEV = "GitHub-dev"


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _inside(root, path):
    """The path as the container sees it (``_under`` reversed)."""
    if os.path.abspath(root) == "/":
        return path
    return "/" + os.path.relpath(path, root)


def uverbs_devices(root="/"):
    return sorted(glob.glob(_under(root, "/dev/infiniband/uverbs[0-9]*")))


# The NVIDIA IMEX channel devices a multi-node NVLink job needs in its container: the driver
# registers the character device nvidia-caps-imex-channels, and /dev/nvidia-caps-imex-channels/
# channelN "must be handled by the administrator" (NVIDIA IMEX guide, imexchannels.html,
# "IMEX Channels"). Slurm's switch/nvidia_imex gives each job one channelN with N >= 1
# (channel 0 reserved); the DRA driver's ComputeDomain and NVreg_CreateImexChannel0 give
# channel0: any channel<N> will do.
IMEX_CHANNELS = "/dev/nvidia-caps-imex-channels"


def imex_channels(root="/"):
    """Names of the IMEX channel character devices the container sees (``channel0``...)."""
    found = []
    for path in sorted(glob.glob(_under(root, IMEX_CHANNELS + "/channel[0-9]*"))):
        try:
            if stat.S_ISCHR(os.stat(path).st_mode):
                found.append(os.path.basename(path))
        except OSError:
            continue
    return found


def installer_version(root="/"):
    try:
        with open(_under(root, "/opt/amazon/efa_installed_packages")) as handle:
            text = handle.read(65536)
    except (OSError, IOError):
        return None
    match = re.search(r"installer version:\s*([0-9][0-9.]*)", text, re.IGNORECASE)
    return match.group(1) if match else None


def find_plugin(root="/"):
    """``(path, (major, minor, patch) or None, why)`` of aws-ofi-nccl (``plugin_version``), or
    ``(None, None, why)`` when none is installed."""
    for pattern in PLUGIN_GLOBS:
        for path in sorted(glob.glob(_under(root, pattern))):
            if os.path.islink(path) and not os.path.exists(path):
                continue
            version, why = plugin_version(path)
            return path, version, why
    return None, None, "no aws-ofi-nccl library (libnccl-net*.so)"


def plugin_version(path, limit=64 * 1024 * 1024):
    """``((major, minor, patch), where)`` when the plugin's init message names a release, else
    ``(None, why)``: a build from git between releases, no init message, an unreadable file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit)
    except (OSError, IOError) as exc:
        return None, "cannot read %s: %s" % (path, exc.strerror or exc)
    match = _PLUGIN_INIT_RE.search(data)
    if not match:
        return None, "no 'Initializing aws-ofi-nccl' message in %s" % path
    embedded = match.group(1).decode("ascii")
    return _plugin_release(embedded)


def _plugin_release(embedded):
    said = "'Initializing aws-ofi-nccl %s'" % embedded
    release = _PLUGIN_RELEASE_RE.match(embedded)
    if release:
        return tuple(int(x) for x in release.groups()), said
    commit = _PLUGIN_GIT_RE.match(embedded)
    if commit:
        return None, ("%s: a build of git commit %s, at no release tag, so no release number"
                      % (said, commit.group(1)))
    if embedded == _PLUGIN_DEV:
        return None, "%s: a build of the development branch, so no release number" % said
    return None, "%s: not a release number" % said


def libfabric_version(run):
    out = run(["fi_info", "--version"]) if run else None
    if not out:
        return None
    match = re.search(r"libfabric:\s*([0-9][0-9A-Za-z.]*)", out)
    return match.group(1) if match else None


def interface_vendor(interface, root="/"):
    try:
        with open(_under(root, "/sys/class/net/%s/device/vendor" % interface)) as handle:
            return handle.read().strip()
    except (OSError, IOError):
        return None


def family(instance_type):
    return instance_type.split(FAMILY_SEPARATOR, 1)[0]


def family_rows(name):
    """The instance table's types of family ``name``."""
    return sorted(t for t in INSTANCE_RDMA_READ if family(t) == name)


def family_note(instance_type):
    """For a type the table lacks whose family it knows: which family (and rows) it goes by;
    else None (a table type needs no note, an unknown family is ``unknown_type``'s)."""
    if not instance_type or instance_type in INSTANCE_RDMA_READ:
        return None
    name = family(instance_type)
    if name not in KNOWN_FAMILIES:
        return None
    rows = family_rows(name)
    basis = ("the table's rows %s" % ", ".join(rows)) if rows else "RDMA_FAMILIES"
    return ("instance type %s is not in the instance table: it goes by its family %s (%s): EFA "
            "RDMA read %s" % (instance_type, name, basis,
                              "yes" if name in RDMA_FAMILIES else "no"))


def unknown_type(instance_type):
    """Why ``instance_type`` cannot be planned for, one clause, with the closest name; None when
    it is a table type or an EC2 type of a family the table or ``RDMA_FAMILIES`` knows."""
    if instance_type in INSTANCE_RDMA_READ:
        return None
    closest = _closest(instance_type, INSTANCE_TYPES, "")
    if not TYPE_RE.match(instance_type):
        return "%r is not an EC2 instance type like p4d.24xlarge%s" % (instance_type, closest)
    size = instance_type.split(FAMILY_SEPARATOR, 1)[1]
    if not SIZE_RE.match(size):
        return "%r: %s is not an EC2 instance size (large, xlarge, 24xlarge, metal, ...)%s" % (
            instance_type, size, closest)
    name = family(instance_type)
    if name in KNOWN_FAMILIES:
        return None
    return ("%r is not in the instance table and its family %s is not one the table or "
            "RDMA_FAMILIES knows (%s)%s" % (instance_type, name, ", ".join(KNOWN_FAMILIES),
                                            _closest(name, KNOWN_FAMILIES, "family ")))


def _closest(word, choices, what):
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return " (did you mean %s%s?)" % (what, close[0]) if close else ""


def rdma_capable(instance_type=None, gpu_names=()):
    """``(True/False/None, why)``: can this node's EFA do RDMA reads?"""
    if instance_type in INSTANCE_RDMA_READ:
        return INSTANCE_RDMA_READ[instance_type], "instance type %s" % instance_type
    if instance_type:
        name = family(instance_type)
        if name in KNOWN_FAMILIES:
            return name in RDMA_FAMILIES, family_note(instance_type)
        return False, ("instance type %s: its family %s is neither in the instance table nor in "
                       "RDMA_FAMILIES, so no RDMA read" % (instance_type, name))
    for name in gpu_names:
        upper = name.upper()
        for model in RDMA_GPUS:
            if re.search(r"\b%s\b" % model, upper):
                return True, "GPU %s" % name
        if "V100" in upper:
            return False, "GPU %s (p3dn: no EFA RDMA)" % name
    return None, "instance type unknown"


def imds_instance_type(timeout=1.0):
    """The EC2 instance type from IMDSv2, or ``None`` (unreachable, e.g. hop limit 1)."""
    try:
        from urllib.request import Request, urlopen

        token_req = Request("http://169.254.169.254/latest/api/token", method="PUT",
                            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        token = urlopen(token_req, timeout=timeout / 2).read().decode("ascii")
        req = Request("http://169.254.169.254/latest/meta-data/instance-type",
                      headers={"X-aws-ec2-metadata-token": token})
        value = urlopen(req, timeout=timeout / 2).read().decode("ascii").strip()
        return value if re.match(r"^[a-z0-9-]+\.[a-z0-9-]+$", value) else None
    except Exception:  # noqa: BLE001 - any failure just means "unknown"
        return None
