"""Fabric: EFA or TCP, the evidence in one line, and the environment and MPI flags that go with it.

Decision (``decide``):

- ``MNP_FABRIC=tcp`` / ``efa``: as told (EFA without a ``uverbs`` device is logged as suspicious).
- ``auto``: EFA when ``/dev/infiniband/uverbs*`` exists *and* ``fi_info -p efa`` prints
  ``provider: efa``; otherwise TCP. The evidence names what was (not) found.

EFA environment (``efa_env``), following the versions found in the image, not a fixed list:

- ``FI_PROVIDER=efa``.
- ``FI_EFA_USE_DEVICE_RDMA=1`` only when the device can do RDMA reads: p4d/p4de, p5/p5e/p5en, p6,
  trn1/trn2. The instance type comes from ``MNP_INSTANCE_TYPE``, else from the instance metadata
  service (one IMDSv2 query, 1 s budget, only when EFA was found), else from the GPU model that
  ``nvidia-smi -L`` reports (A100/H100/H200/B200 imply those families; V100 means p3dn: not set).
  Unknown: not set (aws-ofi-nccl >= 1.7 with libfabric >= 1.18 enables it by itself).
- ``NCCL_PROTO=simple`` only when the aws-ofi-nccl plugin found is older than 1.7 (EFA did not
  support NCCL's LL protocols); not set for newer or unknown plugins.
- ``NCCL_NET_PLUGIN=ofi`` only when the plugin ships ``libnccl-net-ofi.so`` without the
  ``libnccl-net.so`` name NCCL looks for by default.
- ``LD_LIBRARY_PATH`` gains ``/opt/amazon/efa/lib{,64}``, ``/opt/amazon/openmpi/lib{,64}`` and the
  plugin's directory, where they exist.
- Versions are read from ``/opt/amazon/efa_installed_packages`` (installer), the plugin library's
  own strings (``aws-ofi-nccl X.Y.Z``) and ``fi_info --version`` (libfabric).

Both fabrics: ``NCCL_SOCKET_IFNAME==<if>`` (``=`` means exact match, so ``eth0`` does not also match
``eth01``), ``GLOO_SOCKET_IFNAME=<if>``, and for Open MPI ``pml ob1``, ``btl ^openib``,
``btl_tcp_if_include`` and ``oob_tcp_if_include`` set to the interface. MPI's own messages go over
TCP; NCCL's traffic goes over EFA through the plugin. TCP only: ``NCCL_SOCKET_NTHREADS=2`` and
``NCCL_NSOCKS_PERTHREAD=8`` on GPU nodes whose interface is not an AWS ENA (NCCL tunes ENA itself),
and ``NCCL_NET=Socket`` when an OFI plugin is installed, so NCCL does not take libfabric's tcp
provider instead of its own sockets.

Any variable the user already set wins (``merge_env``); an ``OMPI_MCA_<name>`` variable in the
environment drops the matching ``-mca`` flag.
"""

import glob
import os
import re

from .log import log

RDMA_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "p6e-gb200",
                 "trn1", "trn1n", "trn2", "trn2n")
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
_PLUGIN_VERSION_RES = (
    re.compile(rb"Initializing aws-ofi-nccl (\d+)\.(\d+)\.(\d+)"),
    re.compile(rb"aws-ofi-nccl[ /-]v?(\d+)\.(\d+)\.(\d+)"),
)


class Fabric(object):
    def __init__(self, kind, evidence):
        self.kind = kind  # "efa" | "tcp"
        self.evidence = evidence
        self.env = {}  # what we would set (before the user's variables win)
        self.mca = []  # [(name, value)] Open MPI parameters
        self.notes = []  # one-line remarks for the log / dry run
        self.versions = {}

    def line(self):
        return "fabric %s: %s" % (self.kind.upper(), self.evidence)


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _inside(root, path):
    """The path as the container sees it (``_under`` reversed)."""
    if os.path.abspath(root) == "/":
        return path
    return "/" + os.path.relpath(path, root)


def uverbs_devices(root="/"):
    return sorted(glob.glob(_under(root, "/dev/infiniband/uverbs[0-9]*")))


def decide(mode, root="/", run=None):
    """Return a ``Fabric`` with ``kind`` and ``evidence`` (env filled in by ``configure``)."""
    devices = uverbs_devices(root)
    names = ", ".join(os.path.basename(d) for d in devices) or "none"
    if mode == "tcp":
        return Fabric("tcp", "MNP_FABRIC=tcp (uverbs devices: %s)" % names)
    if mode == "efa":
        if not devices:
            return Fabric("efa", "MNP_FABRIC=efa, although no /dev/infiniband/uverbs* device is "
                                 "visible (pass it to the container)")
        return Fabric("efa", "MNP_FABRIC=efa (uverbs devices: %s)" % names)
    if not devices:
        return Fabric("tcp", "no /dev/infiniband/uverbs* device in the container")
    out = run(["fi_info", "-p", "efa"]) if run else None
    if out is None:
        return Fabric("tcp", "%d uverbs device(s) (%s) but fi_info -p efa failed or is not "
                             "installed" % (len(devices), names))
    if "provider: efa" not in out:
        return Fabric("tcp", "%d uverbs device(s) (%s) but fi_info -p efa lists no efa provider"
                      % (len(devices), names))
    return Fabric("efa", "%d uverbs device(s) (%s) and fi_info -p efa finds the efa provider"
                  % (len(devices), names))


def installer_version(root="/"):
    try:
        with open(_under(root, "/opt/amazon/efa_installed_packages")) as handle:
            text = handle.read(65536)
    except (OSError, IOError):
        return None
    match = re.search(r"installer version:\s*([0-9][0-9.]*)", text, re.IGNORECASE)
    return match.group(1) if match else None


def find_plugin(root="/"):
    """``(path, (major, minor, patch) or None)`` of aws-ofi-nccl, or ``(None, None)``."""
    for pattern in PLUGIN_GLOBS:
        for path in sorted(glob.glob(_under(root, pattern))):
            if os.path.islink(path) and not os.path.exists(path):
                continue
            return path, plugin_version(path)
    return None, None


def plugin_version(path, limit=64 * 1024 * 1024):
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit)
    except (OSError, IOError):
        return None
    for regex in _PLUGIN_VERSION_RES:
        match = regex.search(data)
        if match:
            return tuple(int(x) for x in match.groups())
    return None


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


def rdma_capable(instance_type=None, gpu_names=()):
    """``(True/False/None, why)``: can this node's EFA do RDMA reads?"""
    if instance_type:
        family = instance_type.split(".", 1)[0]
        return family in RDMA_FAMILIES, "instance type %s" % instance_type
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


def configure(fabric, interface, slots_kind="default", gpu_names=(), instance_type=None,
              root="/", run=None, imds=None):
    """Fill ``fabric.env``, ``fabric.mca`` and ``fabric.notes``. Returns ``fabric``."""
    env = fabric.env
    if interface:
        env["NCCL_SOCKET_IFNAME"] = "=" + interface
        env["GLOO_SOCKET_IFNAME"] = interface
        fabric.mca.extend([("btl_tcp_if_include", interface), ("oob_tcp_if_include", interface)])
    fabric.mca.extend([("pml", "ob1"), ("btl", "^openib")])

    plugin_path, plugin_ver = find_plugin(root)
    if plugin_path:
        fabric.versions["aws-ofi-nccl"] = ".".join(map(str, plugin_ver)) if plugin_ver else "?"

    if fabric.kind == "tcp":
        if slots_kind == "gpu" and interface and interface_vendor(interface, root) != ENA_VENDOR:
            env["NCCL_SOCKET_NTHREADS"] = "2"
            env["NCCL_NSOCKS_PERTHREAD"] = "8"
            fabric.notes.append("%s is not an AWS ENA: NCCL socket threads set to 2x8" % interface)
        if plugin_path:
            env["NCCL_NET"] = "Socket"
            fabric.notes.append("OFI plugin %s present: NCCL_NET=Socket keeps NCCL on its own "
                                "sockets" % plugin_path)
        return fabric

    env["FI_PROVIDER"] = "efa"
    inst = installer_version(root)
    if inst:
        fabric.versions["efa-installer"] = inst
    libfabric = libfabric_version(run)
    if libfabric:
        fabric.versions["libfabric"] = libfabric

    if instance_type is None and imds is not None:
        instance_type = imds()
    capable, why = rdma_capable(instance_type, gpu_names)
    if capable:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
        fabric.notes.append("FI_EFA_USE_DEVICE_RDMA=1: %s supports RDMA reads" % why)
    elif capable is False:
        fabric.notes.append("FI_EFA_USE_DEVICE_RDMA not set: %s has no EFA RDMA" % why)
    else:
        fabric.notes.append("FI_EFA_USE_DEVICE_RDMA not set: %s (set MNP_INSTANCE_TYPE)" % why)

    if plugin_path is None:
        fabric.notes.append("no aws-ofi-nccl plugin found: NCCL cannot use EFA")
    elif plugin_ver is None:
        fabric.notes.append("aws-ofi-nccl version unknown (%s): NCCL_PROTO left alone"
                            % plugin_path)
    elif plugin_ver < (1, 7, 0):
        env["NCCL_PROTO"] = "simple"
        fabric.notes.append("aws-ofi-nccl %s < 1.7: NCCL_PROTO=simple"
                            % fabric.versions["aws-ofi-nccl"])
    if plugin_path:
        plugin_dir = os.path.dirname(plugin_path)
        base = os.path.basename(plugin_path)
        if base.startswith("libnccl-net-ofi") and not glob.glob(
                os.path.join(plugin_dir, "libnccl-net.so*")):
            env["NCCL_NET_PLUGIN"] = "ofi"

    libdirs = []
    for path in ("/opt/amazon/efa/lib", "/opt/amazon/efa/lib64", "/opt/amazon/openmpi/lib",
                 "/opt/amazon/openmpi/lib64"):
        if os.path.isdir(_under(root, path)):
            libdirs.append(path)
    if plugin_path:
        plugin_dir = _inside(root, os.path.dirname(plugin_path))
        if plugin_dir not in libdirs:
            libdirs.append(plugin_dir)
    if libdirs:
        env["LD_LIBRARY_PATH"] = ":".join(libdirs)
    return fabric


def merge_env(base, fabric_env):
    """Return ``(env, kept)``: ``base`` plus ``fabric_env`` where ``base`` has no value yet.

    ``LD_LIBRARY_PATH`` is the exception: the fabric's directories are appended to the user's
    value (theirs come first, so theirs win). ``kept`` lists the user's variables that won."""
    env = dict(base)
    kept = []
    for key, value in sorted(fabric_env.items()):
        if key == "LD_LIBRARY_PATH":
            current = [p for p in env.get(key, "").split(":") if p]
            extra = [p for p in value.split(":") if p and p not in current]
            env[key] = ":".join(current + extra)
            continue
        if key in env:
            if env[key] != value:
                kept.append("%s=%s (ours: %s)" % (key, env[key], value))
            continue
        env[key] = value
    return env, kept


def mca_flags(mca, env):
    """``-mca name value`` flags, minus those the user set as ``OMPI_MCA_<name>``."""
    flags = []
    for name, value in mca:
        if ("OMPI_MCA_" + name) in env:
            continue
        flags.extend(["-mca", name, value])
    return flags


def log_decision(fabric):
    log(fabric.line())
    for note in fabric.notes:
        log("  " + note)
