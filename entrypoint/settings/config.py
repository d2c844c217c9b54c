"""Role and settings, read from the environment once at start.

Batch variables (set by AWS Batch on every node of an MNP job; the ``AWS_BATCH_`` prefix is
reserved, users cannot set them):

- ``AWS_BATCH_JOB_NODE_INDEX``: this node's index, 0..N-1.
- ``AWS_BATCH_JOB_MAIN_NODE_INDEX``: the main node's index.
- ``AWS_BATCH_JOB_NUM_NODES``: N.
- ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS``: the main node's address, children only.
- ``AWS_BATCH_JOB_ID``: binds rendezvous messages to this job (optional).

None of the first three set: single-node mode (a workstation, or a plain Batch job). One of them
set without the others is an error. ``AWS_BATCH_JOB_NUM_NODES=1`` is single-node mode too.

Other schedulers (Slurm, Kubeflow PyTorchJob/TrainJob/MPIJob, a launcher that already made this
process a rank) are detected by ``schedulers``; ``MNP_SCHEDULER`` names one and skips detection.
``cfg.node`` is the scheduler's ``NodeTable`` and ``cfg.mode`` its role.

Settings (all optional): see ``SETTINGS`` below and ``docs/entrypoint.md``.

An invalid value raises ``ConfigError``; ``__main__`` turns it into one line naming the variable
and exit code 2, without a traceback.
"""

import difflib
import os
import re
import shlex
import stat

from .. import launchers, schedulers
from ..core.errors import ConfigError  # noqa: F401 (config.ConfigError: its historical home)
from ..core.limits import MAX_NP, MAX_SECONDS, MAX_SLOTS, MIN_HEARTBEAT_TIMEOUT
from ..probe import fabric
from . import wiring

FABRICS = ("auto", "efa", "tcp")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")

# name -> (default shown in docs, one-line description). The docs table is checked against this.
SETTINGS = {
    "MNP_SCHEDULER": ("auto", "auto | batch | slurm | pytorchjob | trainjob | mpijob | rank | "
                              "single: who started this node (auto: detected from its variables)"),
    "MNP_LAUNCHER": ("mpirun", "mpirun | deepspeed | torchrun | torch.distributed.launch | none "
                               "(run the command as is)"),
    "MNP_WAIT_TIMEOUT": ("600", "seconds the main node waits for every node to register"),
    "MNP_SLOTS_PER_NODE": ("detected", "processes per node; overrides GPU/HPU detection"),
    "MNP_NP": ("sum of slots", "total number of processes for mpirun/deepspeed (-np)"),
    "MNP_FABRIC": ("auto", "auto | efa | tcp"),
    "MNP_NETWORK_INTERFACE": ("route lookup", "interface whose IPv4 address this node uses"),
    "MNP_SECRET": ("unset", "shared secret that authenticates rendezvous messages (HMAC)"),
    "MNP_SECRET_FILE": ("unset", "file holding the secret (alternative to MNP_SECRET)"),
    "MNP_RENDEZVOUS_PORT": ("29410", "TCP port of the main node's rendezvous server"),
    "MNP_SSH_PORT": ("2222", "TCP port of the per-job sshd on every node"),
    "MNP_MASTER_PORT": ("29500", "torchrun/deepspeed --master_port"),
    "MNP_DRY_RUN": ("0", "1: print the plan (role, devices, fabric, hostfile, command, env); "
                         "json: the same plan as JSON"),
    "MNP_EXPORT_ENV": ("empty", "comma list of extra variables (or PREFIX*) exported to all ranks"),
    "MNP_LAUNCHER_ARGS": ("empty", "extra arguments for the launcher, shell-quoted"),
    "MNP_DEEPSPEED_LAUNCHER": ("pdsh if installed, else openmpi", "deepspeed --launcher value"),
    "MNP_INSTANCE_TYPE": ("unset", "EC2 instance type hint (e.g. p4d.24xlarge) for EFA settings"),
    "MNP_HEARTBEAT_TIMEOUT": ("15", "seconds of silence after which a peer is declared lost"),
    "MNP_STOP_TIMEOUT": ("20", "seconds between forwarding SIGTERM and SIGKILL to the launcher"),
    "MNP_STATE_DIR": ("/run/mnp", "where per-job keys, hostfiles and sshd files are written"),
    "MNP_HEALTH": ("basic", "off | basic | full: the start-up health gate (docs/entrypoint.md "
                            "\"Start-up health gate\")"),
    "MNP_DRIVER_CHECK": ("on", "on | warn | off: the NVIDIA driver against the image's CUDA "
                               "(docs/entrypoint.md \"NVIDIA driver\")"),
}

# Names the entrypoint sets for the command (docs/entrypoint.md): not settings, but a value found
# in the environment (an image or a nested run that inherited them) is replaced, not an error.
OUTPUTS = ("MNP_HOSTFILE", "MNP_HOSTFILE_PLAIN", "MNP_HOSTFILE_INTEL", "MNP_NUM_NODES",
           "MNP_NODE_INDEX", "MNP_NODE_ADDRESS", "MNP_MASTER_ADDRESS", "MNP_SSH_CONFIG",
           "MNP_ATTEMPT")
# MNP_ATTEMPT: which attempt of the job this is (1 first), from the scheduler's retry counter:
# (variable, added to its value, source). The first one set wins.
ATTEMPT_SOURCES = (
    ("AWS_BATCH_JOB_ATTEMPT", 0, "https://docs.aws.amazon.com/batch/latest/userguide/"
                                 "job_env_vars.html (the job's attempt number, 1 first)"),
    ("SLURM_RESTART_COUNT", 1, "https://slurm.schedmd.com/sbatch.html OUTPUT ENVIRONMENT "
                               "VARIABLES (times the job was restarted, 0 first)"),
    ("TORCHELASTIC_RESTART_COUNT", 1, "https://pytorch.org/docs/stable/elastic/run.html "
                                      "(worker group restarts so far, 0 first)"),
)
# ``MNP_`` is the project's namespace: any other name in it is a typo (MNP_LAUCHER) that would
# otherwise be ignored without a word.
PREFIX = "MNP_"

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")

MAX_SECRET_BYTES = 64 * 1024
# MNP_STATE_DIR ends up in ssh_config lines (where %% and spaces are special) and in
# OMPI_MCA_plm_rsh_args, which Open MPI splits on white space: allow only characters that need
# no quoting anywhere.
STATE_DIR_RE = re.compile(r"^/[A-Za-z0-9_./+-]*$")


class Config(object):
    """Everything read from the environment. Plain attributes; build it with ``load``."""

    def __init__(self, **kwargs):
        self.mode = "single"  # the node table's role: single | main | child | peer | ...
        self.node = None  # the scheduler's NodeTable (``schedulers``); None: built by hand
        self.node_index = 0
        self.main_index = 0
        self.num_nodes = 1
        self.main_address = None  # children only
        self.job_id = ""
        self.launcher = launchers.BATCH_DEFAULT
        self.launcher_explicit = False
        self.wait_timeout = 600.0
        self.slots_override = None
        self.np_override = None
        self.fabric = "auto"
        self.interface = None
        self.secret = None  # bytes or None
        self.rendezvous_port = 29410
        self.ssh_port = 2222
        self.master_port = 29500
        self.dry_run = False
        self.export_env = []
        self.launcher_args = []
        self.deepspeed_launcher = None
        self.instance_type = None
        self.heartbeat_timeout = 15.0
        self.stop_timeout = 20.0
        self.state_dir = "/run/mnp"
        self.health = "basic"
        self.driver_check = "on"
        self.attempt = 1
        self.attempt_source = "first attempt (no scheduler retry counter set)"
        for key, value in kwargs.items():
            if not hasattr(self, key):
                raise TypeError("unknown Config field %s" % key)
            setattr(self, key, value)

    @property
    def is_multi(self):
        return self.mode in ("main", "child")

    @property
    def rendezvous(self):
        """True when the entrypoint wires the nodes itself (AWS Batch's main and children, and a
        Slurm step's that ``wiring`` gave it)."""
        if self.node is None:
            return self.is_multi
        return bool(self.node.rendezvous)

    @property
    def scheduler(self):
        return self.node.scheduler if self.node is not None else "batch"

    def role_label(self):
        if self.mode in ("main", "child"):
            return "%s %d/%d" % (self.mode, self.node_index, self.num_nodes)
        if self.mode == "rank" and self.node is not None:
            return "rank %s" % ("" if self.node.rank is None else self.node.rank)
        return self.mode


def did_you_mean(word, choices):
    """`` (did you mean X?)`` for the closest of ``choices``, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return " (did you mean %s?)" % close[0] if close else ""


def _unknown_names(env):
    """An unknown ``MNP_*`` name is an error naming it, with the closest known setting."""
    known = set(SETTINGS) | set(OUTPUTS)
    unknown = sorted(name for name in env if name.startswith(PREFIX) and name not in known)
    if not unknown:
        return
    shown = [n if re.match(r"^[A-Za-z0-9_]+$", n) else ascii(n) for n in unknown]
    name = unknown[0]
    more = " (and %d more: %s)" % (len(shown) - 1, ", ".join(shown[1:])) \
        if len(shown) > 1 else ""
    raise ConfigError(shown[0], "is not a setting of the entrypoint%s%s; the settings are listed "
                      "in docs/entrypoint.md" % (did_you_mean(name, SETTINGS), more))


def _instance_type(env):
    """A type of the instance table, or one of a family it (or ``RDMA_FAMILIES``) knows: the plan
    notes which family's rows it goes by (docs/entrypoint.md, Fabric); any other is an error."""
    itype = _get(env, "MNP_INSTANCE_TYPE")
    if not itype:
        return None
    problem = fabric.unknown_type(itype)
    if problem:
        raise ConfigError("MNP_INSTANCE_TYPE", "%s; leave it unset to read the type from the "
                          "instance metadata" % problem)
    return itype


def _get(env, name):
    value = env.get(name)
    if value is None:
        return None
    return value.strip()


def _int(env, name, default, minimum=None, maximum=None):
    raw = _get(env, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise ConfigError(name, "%r is not an integer" % raw) from None
    if minimum is not None and value < minimum:
        raise ConfigError(name, "%d is below the minimum %d" % (value, minimum))
    if maximum is not None and value > maximum:
        raise ConfigError(name, "%d is above the maximum %d" % (value, maximum))
    return value


def _seconds(env, name, default, minimum=0.0, maximum=MAX_SECONDS):
    raw = _get(env, name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, "%r is not a number of seconds" % raw) from None
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(name, "%r must be a positive number of seconds" % raw)
    if value < minimum:
        raise ConfigError(name, "%g s is below the minimum %g s" % (value, minimum))
    if value > maximum:
        raise ConfigError(name, "%g s is above the maximum %g s" % (value, maximum))
    return value


def _choice(env, name, choices, default):
    raw = _get(env, name)
    if raw is None or raw == "":
        return default
    value = raw.lower()
    if value not in choices:
        raise ConfigError(name, "%r is not one of %s" % (raw, ", ".join(choices)))
    return value


def _bool(env, name):
    raw = _get(env, name)
    if raw is None:
        return False
    value = raw.lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ConfigError(name, "%r is not a boolean (use 1 or 0)" % raw)


def _secret(env):
    inline = env.get("MNP_SECRET")
    path = _get(env, "MNP_SECRET_FILE")
    if inline is not None and path:
        raise ConfigError("MNP_SECRET_FILE", "set only one of MNP_SECRET and MNP_SECRET_FILE")
    if inline is not None:
        if inline.strip() == "":
            raise ConfigError("MNP_SECRET", "is set but empty")
        try:
            data = inline.encode("utf-8")
        except UnicodeError:  # undecodable bytes arrive as surrogates: never echo the value
            raise ConfigError("MNP_SECRET", "is not valid UTF-8 text") from None
        if len(data) > MAX_SECRET_BYTES:
            raise ConfigError("MNP_SECRET", "is longer than %d bytes" % MAX_SECRET_BYTES)
        return data
    if path:
        return _secret_file(path)
    return None


def _secret_file(path):
    """The secret file's content: a regular file only (a FIFO would block, ``/dev/zero`` never
    ends), read with a size cap; the path is shown printable (a newline in it stays one line)."""
    shown = ascii(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (OSError, IOError, ValueError) as exc:
        raise ConfigError("MNP_SECRET_FILE", "cannot read %s: %s" % (
            shown, getattr(exc, "strerror", None) or exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError("MNP_SECRET_FILE", "%s is not a regular file" % shown)
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise ConfigError("MNP_SECRET_FILE", "cannot read %s: %s" % (shown, exc.strerror)) \
            from None
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError("MNP_SECRET_FILE", "%s is larger than %d bytes" % (shown,
                                                                            MAX_SECRET_BYTES))
    data = data.strip()
    if not data:
        raise ConfigError("MNP_SECRET_FILE", "%s is empty" % shown)
    return data


def _names(env, name):
    raw = _get(env, name)
    if not raw:
        return []
    items = [item.strip() for item in raw.split(",") if item.strip()]
    for item in items:
        if not _NAME_RE.match(item):
            raise ConfigError(name, "%r is not a variable name or PREFIX*" % item)
    return items


def _role(env, cfg):
    """Who started this process (``schedulers``: Batch, Slurm, the Kubeflow operators, a
    launcher above, or none) and this node's place in the job, from its ``NodeTable``."""
    node = schedulers.choose(env)
    cfg.node = node
    cfg.mode = node.role
    cfg.node_index = node.node_rank or 0
    cfg.num_nodes = node.num_nodes or 1
    cfg.main_index = node.main_rank
    cfg.main_address = node.main_address if node.role != "main" else None
    if node.scheduler == "batch" and node.role != "child":
        cfg.main_address = None  # Batch names the main node's address on children only


def load(env=None):
    """Read a ``Config`` from ``env`` (default ``os.environ``). Raises ``ConfigError``."""
    if env is None:
        env = os.environ
    cfg = Config()
    _unknown_names(env)
    _role(env, cfg)
    cfg.job_id = _get(env, "AWS_BATCH_JOB_ID") or ""
    cfg.launcher_explicit = bool(_get(env, "MNP_LAUNCHER"))
    cfg.launcher = _choice(env, "MNP_LAUNCHER", launchers.names(), launchers.BATCH_DEFAULT)
    cfg.wait_timeout = _seconds(env, "MNP_WAIT_TIMEOUT", 600.0, minimum=1.0)
    cfg.slots_override = _int(env, "MNP_SLOTS_PER_NODE", None, minimum=1, maximum=MAX_SLOTS)
    cfg.np_override = _int(env, "MNP_NP", None, minimum=1, maximum=MAX_NP)
    cfg.fabric = _choice(env, "MNP_FABRIC", FABRICS, "auto")
    iface = _get(env, "MNP_NETWORK_INTERFACE")
    if iface:
        if not re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", iface):
            raise ConfigError("MNP_NETWORK_INTERFACE", "%r is not an interface name" % iface)
        cfg.interface = iface
    cfg.secret = _secret(env)
    cfg.rendezvous_port = _int(env, "MNP_RENDEZVOUS_PORT", 29410, minimum=1, maximum=65535)
    cfg.ssh_port = _int(env, "MNP_SSH_PORT", 2222, minimum=1, maximum=65535)
    cfg.master_port = _int(env, "MNP_MASTER_PORT", 29500, minimum=1, maximum=65535)
    ports = {"MNP_RENDEZVOUS_PORT": cfg.rendezvous_port, "MNP_SSH_PORT": cfg.ssh_port,
             "MNP_MASTER_PORT": cfg.master_port}
    if len(set(ports.values())) != len(ports):
        raise ConfigError("MNP_RENDEZVOUS_PORT",
                          "MNP_RENDEZVOUS_PORT, MNP_SSH_PORT and MNP_MASTER_PORT must differ (%s)"
                          % ", ".join("%s=%d" % kv for kv in sorted(ports.items())))
    raw_dry = (_get(env, "MNP_DRY_RUN") or "").lower()
    cfg.dry_run = "json" if raw_dry == "json" else ("text" if _bool(env, "MNP_DRY_RUN") else False)
    cfg.export_env = _names(env, "MNP_EXPORT_ENV")
    raw_args = _get(env, "MNP_LAUNCHER_ARGS")
    if raw_args:
        try:
            cfg.launcher_args = shlex.split(raw_args)
        except ValueError as exc:
            raise ConfigError("MNP_LAUNCHER_ARGS", "cannot be split like a shell: %s" % exc) \
                from None
    cfg.deepspeed_launcher = _choice(env, "MNP_DEEPSPEED_LAUNCHER", ("pdsh", "openmpi"), None)
    cfg.instance_type = _instance_type(env)
    cfg.heartbeat_timeout = _seconds(env, "MNP_HEARTBEAT_TIMEOUT", 15.0,
                                     minimum=MIN_HEARTBEAT_TIMEOUT, maximum=3600.0)
    cfg.stop_timeout = _seconds(env, "MNP_STOP_TIMEOUT", 20.0, maximum=3600.0)
    state = _get(env, "MNP_STATE_DIR")
    if state:
        if not os.path.isabs(state):
            raise ConfigError("MNP_STATE_DIR", "%s is not an absolute path" % ascii(state))
        if not STATE_DIR_RE.match(state) or len(state) > 200:
            raise ConfigError("MNP_STATE_DIR", "%s: use letters, digits and _ . / + - only (it "
                              "goes into ssh_config and OMPI_MCA_plm_rsh_args unquoted), at "
                              "most 200 characters" % ascii(state))
        cfg.state_dir = state
    cfg.health = _choice(env, "MNP_HEALTH", ("off", "basic", "full"), "basic")
    cfg.driver_check = _choice(env, "MNP_DRIVER_CHECK", ("on", "warn", "off"), "on")
    cfg.attempt, cfg.attempt_source = _attempt(env)
    wiring.decide(cfg)  # needs the role, the launcher and the job id above
    return cfg


def _attempt(env):
    """``(attempt, where it came from)``: the first scheduler retry counter that is set."""
    for name, add, _source in ATTEMPT_SOURCES:
        raw = _get(env, name)
        if raw:
            value = _int(env, name, None, minimum=1 - add, maximum=10000) + add
            return value, "%s=%s" % (name, raw)
    return 1, "first attempt (no scheduler retry counter set)"
