"""The scheduler adapters' shared base: the ``NodeTable`` each adapter returns, and strict readers.

A ``NodeTable`` is what a scheduler tells one process about its job: which scheduler and from
which variable, this node's role and rank, the node count, the main node's address, the hosts
and slots when the scheduler names them, whether the entrypoint must wire the nodes itself
(``rendezvous``: AWS Batch, whose nodes learn nothing but the main node's address, and a Slurm
step whose launcher needs SSH: ``wired``, ``wired_because``), the
typed facts the plan reads (``master_port``, ``rank``, ``elastic``, ``slots_are``,
``nproc_word``, ``launcher_ssh``, ``other_ways``, ``problems``, ``runs_ranks``), the other
schedulers' variables detection ``ignored`` (with why) and, for the dry run only, the same
and more as display text in ``extra`` (nothing parses ``extra`` back).

Roles: ``single`` (one node: launch here for this node), ``main`` / ``child`` (node rank 0 or
Batch's main node / any other node of a multi-node job), ``peer`` (one of equal nodes whose
ranks an elastic rendezvous assigns: torchrun with ``PET_RDZV_ENDPOINT``), ``launcher`` (starts
the job over hosts the scheduler already wired: an MPIJob launcher, a Slurm batch script or
``salloc`` shell),
``worker`` (an MPIJob worker: waits to be reached over SSH) and ``rank`` (a launcher above already
made this process one rank: run the command).
"""

from typing import Any, Dict, List, Mapping, Optional

from ..core.errors import ConfigError
from ..core.limits import MAX_NODES, MAX_SLOTS  # noqa: F401 (the adapters import them from here)

ROLES = ("single", "main", "child", "peer", "launcher", "worker", "rank")
SHOWN_HOSTS = 8  # the dry run names this many hosts, then counts the rest
# How surely a detected variable names who started this process (``trust``; lower wins):
LAUNCHED = 0  # a launcher set it for the one process it started (this process is a rank)
STARTED = 1  # only the scheduler that started this process sets it (reserved names, daemons)
EXPORTED = 2  # names job scripts and tools export too (sbatch recipes, enroot's PyTorch hook)


# The contract of a scheduler adapter. A module of this package that defines ``NAME`` is an
# adapter and provides every name below: a module implementing a protocol (PEP 544, "Modules as
# implementations of protocols"; Python 3.6's ``typing`` has no ``Protocol``, so
# ``contract_problems`` checks it when the package is imported, and a new adapter is one new
# module: ``schedulers`` finds it there). Values: a type, or the positional arities a function
# must accept.
ADAPTER_CONTRACT = (
    ("NAME", str, "the name MNP_SCHEDULER and the dry run use"),
    ("SOURCE", str, "where the scheduler documents the variables it sets"),
    ("SIGNALS", tuple, "its variables, so those present but unused are named"),
    ("PRECEDENCE", int, "detection order between equally sure adapters, lower first"),
    ("SUBMITTED", bool, "a job is submitted to it (invoke explain --scheduler plans for it); "
                        "False for who is no scheduler: a launcher above, a single node"),
    ("NODE_PREFIXES", tuple, "prefixes of the variables it sets per process or node, which "
                             "stay each node's own: never passed to other nodes' ranks"),
    ("detect", (1,), "detect(env): the variable it recognised itself from, or None"),
    ("trust", (1,), "trust(env): (LAUNCHED | STARTED | EXPORTED, why)"),
    ("table", (1,), "table(env): its NodeTable; a bad value raises ConfigError naming it"),
    ("example", (1, 2), "example(num_nodes, node_rank=0): what it sets for such a process"),
)


def contract_problems(module: Any) -> List[str]:
    """What ``module`` lacks of ``ADAPTER_CONTRACT``, one line each (empty: it conforms)."""
    import inspect
    problems = []
    for name, kind, meaning in ADAPTER_CONTRACT:
        value = getattr(module, name, None)
        if isinstance(kind, type):
            if not isinstance(value, kind):
                problems.append("%s: %s must be a %s (%s)" % (module.__name__, name,
                                                              kind.__name__, meaning))
            continue
        try:
            signature = inspect.signature(value)
            for arity in kind:
                signature.bind(*range(arity))
        except (TypeError, ValueError):
            problems.append("%s: %s must be a function %s" % (module.__name__, name, meaning))
    return problems


class Record(object):
    """A plain record whose ``FIELDS`` are its whole state: equality, ``repr`` and the JSON form
    (``to_dict``/``from_dict``) all read them, so no field can be left out of one of them."""

    FIELDS = ()  # type: tuple
    NESTED = {}  # type: Dict[str, Any]  # field -> the Record class its dict is

    def to_dict(self) -> Dict[str, Any]:
        out = {}
        for name in self.FIELDS:
            value = getattr(self, name)
            out[name] = value.to_dict() if isinstance(value, Record) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """The record ``to_dict`` gave (after a JSON round trip too); unknown keys are errors."""
        unknown = set(data) - set(cls.FIELDS)
        if unknown:
            raise ValueError("%s has no field %s" % (cls.__name__, ", ".join(sorted(unknown))))
        record = cls.__new__(cls)
        for name in cls.FIELDS:
            value = data.get(name)
            nested = cls.NESTED.get(name)
            setattr(record, name, nested.from_dict(value) if nested and value is not None
                    else value)
        return record

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_dict() == other.to_dict()  # type: ignore

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % kv for kv in sorted(self.to_dict().items())))


class Elastic(Record):
    """The elastic rendezvous torchrun joins (``PET_RDZV_*``): backend, ``host[:port]``
    endpoint, ``MIN:MAX`` nodes, and the optional id, restart budget and backend options."""

    FIELDS = ("backend", "endpoint", "nnodes", "rdzv_id", "max_restarts", "conf")

    def __init__(self, backend: str, endpoint: str, nnodes: str, rdzv_id: Optional[str] = None,
                 max_restarts: Optional[int] = None, conf: Optional[str] = None) -> None:
        self.backend = backend
        self.endpoint = endpoint
        self.nnodes = nnodes
        self.rdzv_id = rdzv_id
        self.max_restarts = max_restarts
        self.conf = conf


class LauncherSsh(Record):
    """SSH options a scheduler's launcher must use to reach its hosts (an MPIJob launcher's
    ``OMPI_MCA_plm_rsh_args``), with why and where that is documented."""

    FIELDS = ("options", "reason", "source")

    def __init__(self, options: str, reason: str, source: str) -> None:
        self.options = options
        self.reason = reason
        self.source = source


class NodeTable(Record):
    """One process's view of its job, as a scheduler describes it. Plain attributes; every one
    is in ``FIELDS`` (equality, ``repr``, the dry run's JSON and ``from_dict`` read them)."""

    FIELDS = ("scheduler", "detected_from", "role", "node_rank", "num_nodes", "main_rank",
              "main_address", "hosts", "slots", "rendezvous", "extra", "master_port", "rank",
              "elastic", "slots_are", "nproc_word", "problems", "launcher_ssh", "other_ways",
              "runs_ranks", "wiring_id", "wired_because", "ignored")
    NESTED = {"elastic": Elastic, "launcher_ssh": LauncherSsh}

    def __init__(self, scheduler: str, detected_from: Optional[str], role: str,
                 node_rank: Optional[int] = 0, num_nodes: Optional[int] = 1,
                 main_address: Optional[str] = None, hosts: Optional[List[str]] = None,
                 slots: Optional[List[int]] = None, rendezvous: bool = False,
                 extra: Optional[Dict[str, str]] = None, main_rank: int = 0,
                 master_port: Optional[int] = None, rank: Optional[int] = None,
                 elastic: Optional[Elastic] = None, slots_are: Optional[str] = None,
                 launcher_ssh: Optional[LauncherSsh] = None, other_ways: str = "",
                 nproc_word: Optional[str] = None, problems: Optional[List[str]] = None,
                 runs_ranks: bool = True, wiring_id: Optional[str] = None) -> None:
        if role not in ROLES:
            raise ValueError("unknown role %r" % role)
        self.scheduler = scheduler
        self.detected_from = detected_from  # the variable it was detected from; None: fallback
        self.role = role
        self.node_rank = node_rank  # None where the scheduler does not say (elastic, launcher)
        self.num_nodes = num_nodes  # None where unknown (an MPIJob worker, a rank)
        self.main_rank = main_rank  # Batch's AWS_BATCH_JOB_MAIN_NODE_INDEX; 0 elsewhere
        self.main_address = main_address  # host name or address of the main node, if known
        self.hosts = hosts  # every node's name, in rank order, where the scheduler lists them
        self.slots = slots  # processes the scheduler set aside per host, aligned with hosts
        self.rendezvous = rendezvous  # True: the entrypoint must wire the nodes (Batch)
        self.extra = dict(extra or {})  # display only: the dry run's lines
        self.master_port = master_port  # the port the scheduler gives torchrun's master
        self.rank = rank  # this process's rank (role ``rank``)
        self.elastic = elastic  # the rendezvous an elastic peer joins (role ``peer``)
        # what ``slots`` counts: "processes" (torchrun's per node, from the job's spec), "tasks"
        # (the scheduler's tasks on each node, each of which runs the entrypoint), or None
        self.slots_are = slots_are
        # torchrun's own word for processes per node (``auto``, ``cpu``, ``gpu``: ``torchenv``),
        # which the plan resolves from the node's devices as torchrun would; None: a number or unset
        self.nproc_word = nproc_word
        # what the scheduler's variables leave this role unable to do (an MPIJob launcher without
        # the operator's hostfile): PROBLEM lines of the plan, the first stops a real run
        self.problems = list(problems or [])
        self.launcher_ssh = launcher_ssh  # the SSH a launcher role must use, if the scheduler has one
        self.other_ways = other_ways  # this scheduler's own ways to start ranks, for a problem line
        # False where no rank runs on this node (an MPIJob launcher, an salloc shell on a login
        # node): the plan is still made for the ranks elsewhere (a launcher's variables reach
        # them), but this node's devices are not theirs, so the device preflight is theirs too
        self.runs_ranks = runs_ranks
        # Where the scheduler started one entrypoint per node but serves no SSH (a Slurm step of
        # one task per node), the id the entrypoint's own rendezvous binds its messages to, so a
        # launcher that needs SSH can still run there; None where it may not. ``settings.wiring``
        # decides, ``wired`` gives the table that records it
        self.wiring_id = wiring_id
        self.wired_because = None  # type: Optional[str]
        # other schedulers' variables that were present but not used, each with why (``choose``)
        self.ignored = []  # type: List[str]

    def wired(self, because: str) -> "NodeTable":
        """A copy of this table in which the entrypoint wires these nodes itself (rendezvous
        with the main node, per-job SSH), as on Batch, ``because`` the launcher needs what the
        scheduler does not serve. The table itself is left as the scheduler gave it."""
        return NodeTable.from_dict(dict(self.to_dict(), rendezvous=True, wired_because=because))

    def tasks_here(self) -> int:
        """Tasks of the scheduler's step on this node (1 where the scheduler does not count them)."""
        if self.slots_are != "tasks" or not self.slots or self.node_rank is None:
            return 1
        return self.slots[self.node_rank]

    def one_task_per_node(self) -> bool:
        """Whether the scheduler started one task on every node (True where it does not count
        them): where it did, every node can decide alike whether the entrypoint wires them."""
        return self.slots_are != "tasks" or not self.slots or all(n == 1 for n in self.slots)

    def lines(self) -> List[str]:
        """The dry run's lines: scheduler and source, role, nodes, who wires them, extras."""
        source = ("detected from %s" % self.detected_from if self.detected_from
                  else "no scheduler variables")
        out = ["scheduler: %s (%s)" % (self.scheduler, source)]
        out.extend("ignored: %s" % line for line in self.ignored)
        out.append("role: %s" % self._role_text())
        if self.main_address:
            out.append("main node: %s" % self.main_address)
        if self.hosts is not None:
            shown = ", ".join(self.hosts[:SHOWN_HOSTS])
            more = len(self.hosts) - SHOWN_HOSTS
            out.append("hosts: %s%s (%d)" % (shown, ", ... %d more" % more if more > 0 else "",
                                             len(self.hosts)))
        if self.slots is not None:
            out.append("slots per node (from the scheduler): %s" % _compress(self.slots))
        out.append("nodes wired by: %s" % self._wiring())
        out.extend("%s: %s" % kv for kv in sorted(self.extra.items()))
        return out

    def _wiring(self) -> str:
        if self.rendezvous and self.wired_because:
            return "the entrypoint (rendezvous with the main node): %s" % self.wired_because
        if self.rendezvous:
            return "the entrypoint (rendezvous with the main node)"
        if self.role == "rank":
            return "the launcher that started this rank"
        if self.role == "single":
            return "nothing to wire (one node)"
        return "the scheduler"

    def _role_text(self) -> str:
        if self.role in ("main", "child") and self.num_nodes is not None:
            return "%s (node %s of %d)" % (self.role, self.node_rank, self.num_nodes)
        if self.role == "launcher" and self.num_nodes is not None:
            return "launcher (starts the job on %d node(s))" % self.num_nodes
        return self.role


def _compress(values: List[int]) -> str:
    """``[2, 2, 2, 1]`` -> ``2(x3),1``: Slurm's own short form, so long jobs stay one line."""
    out = []
    for value, group in _groups(values):
        out.append("%d(x%d)" % (value, group) if group > 1 else str(value))
    return ",".join(out)


def _groups(values: List[int]) -> List[Any]:
    runs = []  # type: List[List[int]]
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


def get(env: Mapping[str, str], name: str) -> Optional[str]:
    """The variable's value stripped, or None when unset or empty."""
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def first(env: Mapping[str, str], *names: str) -> Optional[str]:
    """The first of ``names`` that is set and not empty, or None."""
    for name in names:
        if get(env, name) is not None:
            return name
    return None


def integer(env: Mapping[str, str], name: str, minimum: int = 0,
            maximum: Optional[int] = None) -> int:
    """A required non-negative integer; a bad or missing value is one ``ConfigError`` line."""
    raw = get(env, name)
    if raw is None:
        raise ConfigError(name, "is not set")
    try:
        value = int(raw, 10)
    except ValueError:
        raise ConfigError(name, "%r is not an integer" % raw) from None
    if value < minimum:
        raise ConfigError(name, "%d is below the minimum %d" % (value, minimum))
    if maximum is not None and value > maximum:
        raise ConfigError(name, "%d is above the maximum %d" % (value, maximum))
    return value


def optional_integer(env: Mapping[str, str], name: str, minimum: int = 0,
                     maximum: Optional[int] = None) -> Optional[int]:
    if get(env, name) is None:
        return None
    return integer(env, name, minimum, maximum)


def below(name: str, value: int, limit_name: str, limit: int) -> None:
    """A rank must be below its count: ``SLURM_NODEID: 3 is not below SLURM_NNODES=3``."""
    if value >= limit:
        raise ConfigError(name, "%d is not below %s=%d" % (value, limit_name, limit))


def slots_value(env: Mapping[str, str], name: str) -> Optional[int]:
    """A per-node process count that may also be a word (``auto``, ``gpu``: torchrun decides):
    the integer, or None for a word. A negative or zero count is an error."""
    raw = get(env, name)
    if raw is None or not raw.lstrip("-").isdigit():
        return None
    return integer(env, name, minimum=1, maximum=MAX_SLOTS)
