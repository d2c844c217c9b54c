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

Settings (all optional): ``TABLE`` below, one ``Setting`` each (name, field, default, reader,
doc line); ``Config()``, ``load`` and the docs' table (docs/entrypoint.md) read it.

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



class Setting(object):
    """One ``MNP_*`` setting: its name, the ``Config`` field it fills (None: read with another
    setting, like ``MNP_SECRET_FILE`` with ``MNP_SECRET``, or by the scheduler detection), its
    default (the one place it is written), how the docs show the default when it is not a plain
    value, how to read it, and one line for the docs. The docs' table (docs/entrypoint.md) is
    checked against this table (tests/test_docs_entrypoint.py)."""

    __slots__ = ("name", "field", "default", "shown", "read", "doc")

    def __init__(self, name, field, default, read, doc, shown=None):
        self.name = name
        self.field = field
        self.default = default
        self.read = read  # read(env, name, default) -> value; raises ConfigError
        self.doc = doc
        self.shown = shown if shown is not None else _shown(default)

    def load(self, env):
        return self.read(env, self.name, self.default)


def _shown(default):
    """A plain default as the docs write it: 600.0 -> ``600``."""
    if isinstance(default, float) and default == int(default):
        return str(int(default))
    return str(default)


def _int_in(minimum=None, maximum=None):
    return lambda env, name, default: _int(env, name, default, minimum, maximum)


def _seconds_in(minimum=0.0, maximum=None):
    return lambda env, name, default: _seconds(env, name, default, minimum,
                                               MAX_SECONDS if maximum is None else maximum)


def _choice_of(choices):
    return lambda env, name, default: _choice(env, name, choices() if callable(choices)
                                              else choices, default)


def _port():
    return _int_in(1, 65535)


def _not_here(env, name, default):
    """Read elsewhere (the scheduler detection, or with another setting)."""
    return default


def _table():
    return (
        Setting("MNP_SCHEDULER", None, "auto", _not_here,
                "auto | batch | slurm | pytorchjob | trainjob | mpijob | rank | single: who "
                "started this node (auto: detected from its variables)"),
        Setting("MNP_LAUNCHER", "launcher", launchers.BATCH_DEFAULT, _choice_of(launchers.names),
                "mpirun | deepspeed | torchrun | torch.distributed.launch | none (run the "
                "command as is)"),
        Setting("MNP_WAIT_TIMEOUT", "wait_timeout", 600.0, _seconds_in(minimum=1.0),
                "seconds the main node waits for every node to register"),
        Setting("MNP_SLOTS_PER_NODE", "slots_override", None, _int_in(1, MAX_SLOTS),
                "processes per node; overrides GPU/HPU detection", shown="detected"),
        Setting("MNP_NP", "np_override", None, _int_in(1, MAX_NP),
                "total number of processes for mpirun/deepspeed (-np)", shown="sum of slots"),
        Setting("MNP_FABRIC", "fabric", "auto", _choice_of(FABRICS), "auto | efa | tcp"),
        Setting("MNP_NETWORK_INTERFACE", "interface", None, _interface,
                "interface whose IPv4 address this node uses", shown="route lookup"),
        Setting("MNP_SECRET", "secret", None, _secret,
                "shared secret that authenticates rendezvous messages (HMAC)", shown="unset"),
        Setting("MNP_SECRET_FILE", None, None, _not_here,
                "file holding the secret (alternative to MNP_SECRET)", shown="unset"),
        Setting("MNP_RENDEZVOUS_PORT", "rendezvous_port", 29410, _port(),
                "TCP port of the main node's rendezvous server"),
        Setting("MNP_SSH_PORT", "ssh_port", 2222, _port(),
                "TCP port of the per-job sshd on every node"),
        Setting("MNP_MASTER_PORT", "master_port", 29500, _port(),
                "torchrun/deepspeed --master_port"),
        Setting("MNP_DRY_RUN", "dry_run", False, _dry_run,
                "1: print the plan (role, devices, fabric, hostfile, command, env); json: the "
                "same plan as JSON", shown="0"),
        Setting("MNP_EXPORT_ENV", "export_env", (), _names,
                "comma list of extra variables (or PREFIX*) exported to all ranks",
                shown="empty"),
        Setting("MNP_LAUNCHER_ARGS", "launcher_args", (), _launcher_args,
                "extra arguments for the launcher, shell-quoted", shown="empty"),
        Setting("MNP_TAG_OUTPUT", "tag_output", False, _flag,
                "1: mpirun --tag-output, every line of a rank prefixed [job,rank]<stream>:; Open "
                "MPI tags each chunk it forwards, so a line longer than about 2 KiB arrives with "
                "the tag repeated inside it (docs/entrypoint.md \"The final line\")", shown="0"),
        Setting("MNP_DEEPSPEED_LAUNCHER", "deepspeed_launcher", None,
                _choice_of(("pdsh", "openmpi")), "deepspeed --launcher value",
                shown="pdsh if installed, else openmpi"),
        Setting("MNP_INSTANCE_TYPE", "instance_type", None, _instance_type,
                "EC2 instance type hint (e.g. p4d.24xlarge) for EFA settings", shown="unset"),
        Setting("MNP_HEARTBEAT_TIMEOUT", "heartbeat_timeout", 15.0,
                _seconds_in(MIN_HEARTBEAT_TIMEOUT, 3600.0),
                "seconds of silence after which a peer is declared lost"),
        Setting("MNP_STOP_TIMEOUT", "stop_timeout", 20.0, _seconds_in(maximum=3600.0),
                "seconds between forwarding SIGTERM and SIGKILL to the launcher"),
        Setting("MNP_STATE_DIR", "state_dir", "/run/mnp", _state_dir,
                "where per-job keys, hostfiles and sshd files are written"),
        Setting("MNP_HEALTH", "health", "basic", _choice_of(("off", "basic", "full")),
                "off | basic | full: the start-up health gate (docs/entrypoint.md \"Start-up "
                "health gate\")"),
        Setting("MNP_DRIVER_CHECK", "driver_check", "on", _choice_of(("on", "warn", "off")),
                "on | warn | off: the NVIDIA driver against the image's CUDA (docs/entrypoint.md "
                "\"NVIDIA driver\")"),
    )


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
        self.launcher_explicit = False
        # what the probe looks up on PATH besides its own list: every launcher unit's programs
        self.programs = launchers.programs()
        for setting in TABLE:  # every setting's default, from the one table
            if setting.field:
                setattr(self, setting.field, _fresh(setting.default))
        self.attempt = 1
        self.attempt_source = "first attempt (no scheduler retry counter set)"
        for key, value in kwargs.items():
            if not hasattr(self, key):
                raise TypeError("unknown Config field %s" % key)
            setattr(self, key, value)

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError("Config is read-only once loaded (%s): settings are read once"
                                 % name)
        object.__setattr__(self, name, value)

    def freeze(self):
        """No attribute changes from here on (``load`` ends with it)."""
        object.__setattr__(self, "_frozen", True)

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


def _instance_type(env, name="MNP_INSTANCE_TYPE", default=None):
    """A type of the instance table, or one of a family it (or ``RDMA_FAMILIES``) knows: the plan
    notes which family's rows it goes by (docs/entrypoint.md, Fabric); any other is an error."""
    itype = _get(env, name)
    if not itype:
        return default
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


def _flag(env, name, default):
    """A boolean setting: 1/true/yes/on or 0/false/no/off; unset is ``default``."""
    if _get(env, name) is None:
        return default
    return _bool(env, name)


def _secret(env, name="MNP_SECRET", default=None):
    """MNP_SECRET or the content of MNP_SECRET_FILE (one of the two), as bytes."""
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
    return default


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


def _names(env, name, default=()):
    raw = _get(env, name)
    if not raw:
        return list(default)
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
    for setting in TABLE:
        if setting.field:
            setattr(cfg, setting.field, setting.load(env))
    _distinct_ports(cfg)
    cfg.attempt, cfg.attempt_source = _attempt(env)
    wired = wiring.decide(cfg)  # needs the role, the launcher and the job id above
    if wired is not None:
        cfg.node, cfg.job_id = wired.node, wired.job_id
        cfg.main_index, cfg.main_address = wired.main_index, wired.main_address
    cfg.freeze()
    return cfg


def _distinct_ports(cfg):
    ports = {"MNP_RENDEZVOUS_PORT": cfg.rendezvous_port, "MNP_SSH_PORT": cfg.ssh_port,
             "MNP_MASTER_PORT": cfg.master_port}
    if len(set(ports.values())) != len(ports):
        raise ConfigError("MNP_RENDEZVOUS_PORT",
                          "MNP_RENDEZVOUS_PORT, MNP_SSH_PORT and MNP_MASTER_PORT must differ (%s)"
                          % ", ".join("%s=%d" % kv for kv in sorted(ports.items())))


def _interface(env, name, default):
    iface = _get(env, name)
    if not iface:
        return default
    if not re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", iface):
        raise ConfigError(name, "%r is not an interface name" % iface)
    return iface


def _dry_run(env, name, default):
    """``"json"``, ``"text"`` or False."""
    if (_get(env, name) or "").lower() == "json":
        return "json"
    return "text" if _bool(env, name) else default


def _launcher_args(env, name, default):
    raw = _get(env, name)
    if not raw:
        return list(default)
    try:
        return shlex.split(raw)
    except ValueError as exc:
        raise ConfigError(name, "cannot be split like a shell: %s" % exc) from None


def _state_dir(env, name, default):
    state = _get(env, name)
    if not state:
        return default
    if not os.path.isabs(state):
        raise ConfigError(name, "%s is not an absolute path" % ascii(state))
    if not STATE_DIR_RE.match(state) or len(state) > 200:
        raise ConfigError(name, "%s: use letters, digits and _ . / + - only (it goes into "
                          "ssh_config and OMPI_MCA_plm_rsh_args unquoted), at most 200 "
                          "characters" % ascii(state))
    return state


def _fresh(default):
    """A list for an empty-tuple default, so two ``Config`` never share one list."""
    return list(default) if isinstance(default, tuple) else default


def _attempt(env):
    """``(attempt, where it came from)``: the first scheduler retry counter that is set."""
    for name, add, _source in ATTEMPT_SOURCES:
        raw = _get(env, name)
        if raw:
            value = _int(env, name, None, minimum=1 - add, maximum=10000) + add
            return value, "%s=%s" % (name, raw)
    return 1, "first attempt (no scheduler retry counter set)"


# Every setting, once: Config's defaults, load() and the docs tables all read it.
TABLE = _table()
SETTINGS = dict((setting.name, (setting.shown, setting.doc)) for setting in TABLE)
