"""Node facts: what this node has, gathered once (``probe``) and then only read by ``plan``.

The plan is a pure function of (settings, facts); everything that touches the machine is here:
the address (route lookup), devices (GPUs, HPUs, EFA ``uverbs``), the instance type, the NIC's
vendor, the installed versions (NCCL, aws-ofi-nccl, the EFA installer, libfabric, Open MPI,
PyTorch, DeepSpeed, SynapseAI) and which launcher programs are on ``PATH``.

``matrix.jobs.explain`` builds the same object from a stack's declared versions and the instance
table instead, so ``invoke explain`` shows the plan a real node of that stack would run.
"""

import glob
import os
import pwd
import re
import shutil

try:
    import resource
except ImportError:  # not on every platform; the memlock check is then skipped
    resource = None

from . import driver, fabric, netaddr, slots

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")


def current_user():
    """The account sshd must let in: the real uid's passwd name. Not ``$USER``/``$LOGNAME``
    (``getpass.getuser``): a root container with ``USER=ubuntu`` would otherwise allow
    ``ubuntu`` and refuse root."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # no passwd entry for this uid
        return "root" if os.getuid() == 0 else str(os.getuid())


def find_sshd():
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("sshd")
    return os.path.abspath(found) if found else None

# Programs the node itself needs (SSH, the fabric probe, Python, DeepSpeed's pdsh runner); each
# launcher unit's own programs come with the config (``launchers.programs()``, Config.programs).
BINARIES = ("pdsh", "sshd", "fi_info", "python3")
ENA_VENDOR = "0x1d0f"
LIBDIRS = ("/opt/amazon/efa/lib", "/opt/amazon/efa/lib64", "/opt/amazon/openmpi/lib",
           "/opt/amazon/openmpi/lib64")
HCCL_WRAPPER_GLOBS = ("/usr/lib/habanalabs/libhccl_ofi_wrapper.so",
                      "/opt/hccl_ofi_wrapper/libhccl_ofi_wrapper.so",
                      "/root/hccl_ofi_wrapper/libhccl_ofi_wrapper.so")
NCCL_LIB_GLOBS = ("/usr/lib/x86_64-linux-gnu/libnccl.so.2.*", "/opt/nccl/lib/libnccl.so.2.*",
                  "/usr/local/lib/libnccl.so.2.*", "/usr/lib64/libnccl.so.2.*")
SITE_GLOBS = ("/usr/lib/python3/dist-packages", "/usr/local/lib/python3*/dist-packages",
              "/usr/local/lib/python3*/site-packages", "/usr/lib/python3*/site-packages")
FIELDS = ("instance_type", "instance_source", "gpus", "gpu_names", "hpus", "efa_devices",
          "fi_info_efa", "nic_vendor", "interface", "address", "address_reason", "slots",
          "slots_source", "versions", "version_sources", "binaries", "plugin_path",
          "plugin_ofi_only", "hccl_wrapper", "libdirs", "is_root", "user", "home", "origin",
          "shm_bytes", "memlock", "driver_version", "driver_source", "cuda_version",
          "cuda_source", "cuda_compat", "run_date", "imex_channels")


class NodeFacts(object):
    """Plain data; ``to_dict`` is its JSON form (the dry run and ``invoke explain`` print it)."""

    def __init__(self, **kwargs):
        self.instance_type = None
        self.instance_source = "unknown"
        self.gpus = 0
        self.gpu_names = []
        self.hpus = 0
        self.efa_devices = []  # uverbs device names
        self.fi_info_efa = None  # True / False / None (fi_info missing)
        self.nic_vendor = None  # "0x1d0f" for AWS ENA
        self.interface = None
        self.address = "127.0.0.1"
        self.address_reason = ""
        self.slots = 1  # detected (before MNP_SLOTS_PER_NODE)
        self.slots_source = "default"
        self.versions = {}  # component -> version string
        self.version_sources = {}  # component -> where the version was read
        self.binaries = {}  # name -> absolute path or None
        self.plugin_path = None
        self.plugin_ofi_only = False  # ships libnccl-net-ofi.so but no libnccl-net.so
        self.hccl_wrapper = None
        self.libdirs = []
        self.is_root = False
        self.user = "root"
        self.home = "/root"
        self.origin = "probed on this node"
        self.shm_bytes = None  # size of /dev/shm, None when unknown
        self.memlock = None  # RLIMIT_MEMLOCK soft limit in bytes, -1 unlimited, None unknown
        self.driver_version = self.driver_source = None  # NVIDIA driver (probe.driver)
        self.cuda_version = self.cuda_source = None  # the image's CUDA (probe.driver)
        self.cuda_compat = None  # {"dir", "driver"}: CUDA forward-compatibility libraries
        self.run_date = None  # YYYY-MM-DD, the day of the run (probe.driver: end of life)
        # IMEX channel devices seen (probe.fabric.imex_channels); None: not probed (explain)
        self.imex_channels = None
        for key, value in kwargs.items():
            if key not in FIELDS:
                raise TypeError("unknown NodeFacts field %s" % key)
            setattr(self, key, value)

    @property
    def accelerator(self):
        if self.gpus:
            return "gpu"
        if self.hpus:
            return "hpu"
        return "none"

    def installed(self):
        """Components known to be installed (for ``present`` conditions)."""
        found = set(name for name, version in self.versions.items() if version)
        if self.plugin_path:
            found.add("aws-ofi-nccl")
        if self.hccl_wrapper:
            found.add("hccl-ofi-wrapper")
        return found

    def to_dict(self):
        return dict((name, getattr(self, name)) for name in FIELDS)


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _first_file(root, patterns):
    for pattern in patterns:
        for path in sorted(glob.glob(_under(root, pattern))):
            if os.path.isfile(path):
                return path
    return None


def nccl_version(root="/"):
    """``(version, where)`` from a ``libnccl.so.2.X.Y`` file name; else from NVIDIA's NCCL wheel
    (``nccl_wheel_version``); else ``(None, None)``."""
    path = _first_file(root, NCCL_LIB_GLOBS)
    match = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)$", path) if path else None
    if match:
        return match.group(1), path
    return nccl_wheel_version(root)


def nccl_wheel_version(root="/"):
    """``(version, where)`` of NVIDIA's NCCL wheel (``nvidia-nccl-cuXX``: a pip-installed NCCL,
    whose library is a bare ``libnccl.so.2``, so its file name has no version) from its
    dist-info directory name, or ``(None, None)``."""
    for site in SITE_GLOBS:
        for base in sorted(glob.glob(_under(root, site))):
            for path in sorted(glob.glob(os.path.join(base, "nvidia_nccl_cu*-*.dist-info"))):
                match = re.match(r"^nvidia_nccl_cu\d+-(\d+\.\d+\.\d+)", os.path.basename(path))
                if match:
                    return match.group(1), path
    return None, None


def python_package_version(name, root="/"):
    """``(version, where)`` of an installed Python distribution from its dist-info/egg-info
    directory name (no import: importing torch takes seconds)."""
    for site in SITE_GLOBS:
        for base in sorted(glob.glob(_under(root, site))):
            for path in sorted(glob.glob(os.path.join(base, "%s-*.*-info" % name))):
                match = re.match(r"^%s-([0-9][^-]*?)(?:\.dist-info|\.egg-info|-py.*)$"
                                 % re.escape(name), os.path.basename(path))
                if match:
                    return match.group(1), path
    return None, None


def synapseai_version(root="/"):
    """SynapseAI's release from the graph compiler package's dpkg record, if installed."""
    try:
        with open(_under(root, "/var/lib/dpkg/status")) as handle:
            text = handle.read()
    except (OSError, IOError):
        return None, None
    match = re.search(r"Package: habanalabs-graph\n(?:.+\n)*?Version: (\d+\.\d+\.\d+)", text)
    return (match.group(1), "dpkg habanalabs-graph") if match else (None, None)


def probe(cfg, environ, root="/", run=None, which=None, imds=None, address=None):
    """Everything the plan needs to know about this node. ``cfg`` gives the address override
    and the main node's address; probing never fails on a missing tool (it is a fact)."""
    run = run or slots.run_tool
    path = environ.get("PATH")
    which = which or (lambda name: shutil.which(name, path=path))
    facts = NodeFacts()
    facts.is_root = os.geteuid() == 0
    facts.user = _user()
    facts.home = os.path.expanduser("~")

    addr = address or netaddr.choose(cfg.main_address if cfg.mode == "child" and cfg.rendezvous
                                     else None,
                                     cfg.interface)
    facts.address, facts.interface, facts.address_reason = addr.address, addr.interface, \
        addr.reason
    if facts.interface:
        facts.nic_vendor = fabric.interface_vendor(facts.interface, root)

    detected = slots.detect(None, root=root, run=run if root == "/" else None)
    facts.slots, facts.slots_source = detected.count, detected.source
    if detected.kind == "gpu":
        facts.gpus, facts.gpu_names = detected.count, list(detected.names)
    elif detected.kind == "hpu":
        facts.hpus = detected.count

    facts.efa_devices = [os.path.basename(d) for d in fabric.uverbs_devices(root)]
    facts.imex_channels = fabric.imex_channels(root)
    # the probe's own programs, and every launcher unit's (``Config.programs``: a new unit's
    # program is found without a change here)
    for name in sorted(set(BINARIES) | set(getattr(cfg, "programs", ()))):
        found = which(name)
        facts.binaries[name] = os.path.abspath(found) if found else None
    if root == "/" and not facts.binaries.get("sshd"):
        # /usr/sbin is often not on a non-root PATH; the entrypoint starts sshd by full path
        facts.binaries["sshd"] = find_sshd()
    if facts.efa_devices and facts.binaries.get("fi_info"):
        out = run(["fi_info", "-p", "efa"])
        facts.fi_info_efa = None if out is None else ("provider: efa" in out)

    _versions(facts, root, run)
    driver.probe(facts, environ, root, run, python_package_version)
    facts.shm_bytes, facts.memlock = shm_size(root), memlock_limit() if root == "/" else None
    facts.libdirs = [d for d in LIBDIRS if os.path.isdir(_under(root, d))]
    wrapper = _first_file(root, HCCL_WRAPPER_GLOBS)
    facts.hccl_wrapper = fabric._inside(root, wrapper) if wrapper else None

    if cfg.instance_type:
        facts.instance_type, facts.instance_source = cfg.instance_type, "MNP_INSTANCE_TYPE"
    elif facts.efa_devices and imds is not None:
        value = imds()
        if value:
            facts.instance_type, facts.instance_source = value, "instance metadata (IMDSv2)"
    return facts


def shm_size(root="/"):
    """Bytes of the filesystem on ``/dev/shm``, or ``None``."""
    try:
        st = os.statvfs(_under(root, "/dev/shm"))
    except (OSError, IOError):
        return None
    return st.f_frsize * st.f_blocks


def memlock_limit():
    """The soft RLIMIT_MEMLOCK in bytes, -1 for unlimited, ``None`` when unknown."""
    if resource is None:
        return None
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ValueError, OSError, AttributeError):
        return None
    return -1 if soft == resource.RLIM_INFINITY else soft


def _versions(facts, root, run):
    def put(name, version, where):
        if version:
            facts.versions[name] = version
            facts.version_sources[name] = where

    plugin_path, plugin_ver, plugin_why = fabric.find_plugin(root)
    if plugin_path:
        facts.plugin_path = fabric._inside(root, plugin_path)
        base = os.path.basename(plugin_path)
        facts.plugin_ofi_only = base.startswith("libnccl-net-ofi") and not glob.glob(
            os.path.join(os.path.dirname(plugin_path), "libnccl-net.so*"))
        put("aws-ofi-nccl", ".".join(map(str, plugin_ver)) if plugin_ver else None,
            facts.plugin_path)
        if not plugin_ver:  # no release: the rows go by if_unknown; the facts keep why
            facts.version_sources["aws-ofi-nccl"] = "%s: release unknown (%s)" % (
                facts.plugin_path, plugin_why.replace(plugin_path, facts.plugin_path))
    put("efa-installer", fabric.installer_version(root), "/opt/amazon/efa_installed_packages")
    if facts.binaries.get("fi_info"):
        put("libfabric", fabric.libfabric_version(run), "fi_info --version")
    put(*((("nccl",) + nccl_version(root))))
    for component, dist in (("pytorch", "torch"), ("deepspeed", "deepspeed")):
        version, where = python_package_version(dist, root)
        put(component, version, where)
    put(*(("synapseai",) + synapseai_version(root)))


def _user():
    return current_user()
