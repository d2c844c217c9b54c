"""The launcher units' shared base: the ``Unit`` interface, the ``LaunchRequest`` a unit reads and
the ``Launch`` it returns, the user's command, what every rank gets.

A launcher unit is one module of this package holding one ``Unit`` subclass and its instance
``UNIT``: what the launcher needs (SSH, a program on PATH), what children do, how the environment
reaches other nodes' ranks, where that is documented (``SOURCE``), and ``launch(request)``: its
command line, with the problems, notes and files that go with it. The plan builds one
``LaunchRequest`` and calls ``unit.launch(request)``; it never names a launcher.

The container command is the user's program as they would hand it to the launcher:
``python3 train.py args``, ``train.py args``, ``python3 -m pkg.train args`` or any executable.
"""

import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.nodes import NodeInfo
from ..probe.facts import NodeFacts
from ..schedulers.base import Elastic, NodeTable

PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Variables whose value belongs to this node's container, not the main node's: ECS issues the
# task role's credentials id and the metadata URIs per task, and every Batch MNP node is its own
# task. Ranks started over SSH get this node's values from its sshd (``environment=`` options on
# the job's key), never the main node's (``launchers.base.NODE_SPECIFIC`` keeps them out of
# mpirun -x and DeepSpeed's env file).
NODE_SSH_ENV = ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_AUTHORIZATION_TOKEN", "ECS_CONTAINER_METADATA_URI",
                "ECS_CONTAINER_METADATA_URI_V4")

# Not passed from the main node to the other nodes' ranks: what differs per node or container,
# what the shell or SSH sets per session, and the entrypoint's own secrets. Everything else of the
# job's environment goes to every rank. (Batch sets AWS_BATCH_JOB_ID as <job id>#<node index>,
# the node index and the main address per node; ECS sets the metadata URIs and
# NVIDIA_VISIBLE_DEVICES per container.)
NODE_SPECIFIC = (
    "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_",
    "AWS_BATCH_JOB_ID", "AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS",
    "NVIDIA_VISIBLE_DEVICES",
    "MNP_NODE_INDEX", "MNP_NODE_ADDRESS", "MNP_SECRET", "MNP_SECRET_FILE", "MNP_DRY_RUN",
    "SSH_AUTH_SOCK", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY",
    "PDSH_SSH_ARGS_APPEND",  # the main node's pdsh settings, not a rank's
    "K_MPI_JOB_ROLE",  # the MPIJob launcher's role, not its ranks' on the workers
) + NODE_SSH_ENV  # per ECS task: each node's sshd gives its own to the ranks it starts
# What a Slurm task's container gets per task when the image defines PYTORCH_VERSION: pyxis'
# pytorch_setup sets RANK and LOCAL_RANK from SLURM_PROCID and SLURM_LOCALID (NVIDIA/pyxis
# pyxis_slurmstepd.c:1240-1268 at 2ca2427d4bd709627ce5e696c39fed4e143c7a48), enroot's
# conf/hooks/extra/50-slurm-pytorch.sh also WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Where the
# entrypoints wire a step's nodes, node 0's values must not reach every rank.
TASK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def node_specific_prefixes() -> Tuple[str, ...]:
    """The prefixes of per-process variables, as each scheduler adapter declares them
    (``NODE_PREFIXES``: Slurm's ``SLURM_``, Open MPI's ``OMPI_`` for a rank), so a new adapter's
    variables stay each node's own with no edit here."""
    global _PREFIXES
    if _PREFIXES is None:
        from .. import schedulers  # here, not at import: the adapters' package imports this one's

        _PREFIXES = tuple(sorted(set(prefix for module in schedulers.ORDER
                                     for prefix in module.NODE_PREFIXES)))
    return _PREFIXES


_PREFIXES = None  # type: Optional[Tuple[str, ...]]


class LaunchRequest(object):
    """Everything a unit's command line depends on, from the plan: a read-only record, built once
    with every field known (``replace`` gives a changed copy), whose equality and JSON form
    (``to_dict``/``from_dict``) read every field of ``FIELDS``.

    ``command``: the user's program; ``table``: the node table (``NodeInfo`` rows); ``node_index``:
    this node's; ``slots``: processes per node; ``np``: processes in all; ``master``: node 0's
    address and ``MNP_MASTER_PORT``; ``scheduler_master``: the master address and port the
    scheduler gives (``master`` where it gives none); ``hostfile``: the Open MPI hostfile's path
    ("" where the scheduler's hosts are used); ``exports``: the names every rank gets;
    ``launcher_args``: ``MNP_LAUNCHER_ARGS`` as the unit receives them; ``environment``: the
    command's full environment; ``user_env``: the user's own; ``facts``: the node's facts;
    ``mode``: this node's role (``main``, ``child``, ``launcher``, ``single``, ...);
    ``rendezvous``: whether the entrypoints wire the nodes; ``state_dir``: ``MNP_STATE_DIR``;
    ``node``: the scheduler's ``NodeTable`` (None without one); ``options``: the unit's own
    settings (``Unit.options``), by variable name; ``elastic``: the scheduler's elastic
    rendezvous (``schedulers.base.Elastic``) for a peer, else None."""

    FIELDS = ("command", "table", "node_index", "slots", "np", "master", "scheduler_master",
              "hostfile", "exports", "launcher_args", "environment", "user_env", "facts", "mode",
              "rendezvous", "state_dir", "node", "options", "elastic")
    __slots__ = FIELDS

    def __init__(self, command: Sequence[str], table: Sequence[NodeInfo], node_index: int,
                 slots: int, np: int, master: Tuple[str, int],
                 scheduler_master: Tuple[str, int], hostfile: str, exports: Sequence[str],
                 launcher_args: Sequence[str], environment: Mapping[str, str],
                 user_env: Mapping[str, str], facts: NodeFacts, mode: str, rendezvous: bool,
                 state_dir: str, node: Optional[NodeTable], options: Mapping[str, Any],
                 elastic: Optional[Elastic] = None) -> None:
        values = {
            "command": list(command), "table": [NodeInfo(*row) for row in table],
            "node_index": node_index, "slots": slots, "np": np, "master": tuple(master),
            "scheduler_master": tuple(scheduler_master), "hostfile": hostfile,
            "exports": list(exports), "launcher_args": list(launcher_args),
            "environment": dict(environment), "user_env": dict(user_env), "facts": facts,
            "mode": mode, "rendezvous": bool(rendezvous), "state_dir": state_dir, "node": node,
            "options": dict(options), "elastic": elastic}
        for name in self.FIELDS:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("LaunchRequest is read-only (%s): make a new one with replace()"
                             % name)

    def replace(self, **changes: Any) -> "LaunchRequest":
        """A copy with ``changes`` (field -> value)."""
        unknown = set(changes) - set(self.FIELDS)
        if unknown:
            raise TypeError("LaunchRequest has no field %s" % ", ".join(sorted(unknown)))
        values = dict((name, getattr(self, name)) for name in self.FIELDS)
        values.update(changes)
        return LaunchRequest(**values)

    def to_dict(self) -> Dict[str, Any]:
        """Every field, as JSON takes it (records as their own ``to_dict``)."""
        out = dict((name, getattr(self, name)) for name in self.FIELDS)
        out["table"] = [list(row) for row in self.table]
        out["master"], out["scheduler_master"] = list(self.master), list(self.scheduler_master)
        out["facts"] = self.facts.to_dict()
        for name in ("node", "elastic"):
            record = getattr(self, name)
            out[name] = None if record is None else record.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LaunchRequest":
        """The request ``to_dict`` gave (after a JSON round trip too); a missing or unknown key
        is an error."""
        if set(data) != set(cls.FIELDS):
            raise ValueError("LaunchRequest fields: missing %s, unknown %s" % (
                sorted(set(cls.FIELDS) - set(data)), sorted(set(data) - set(cls.FIELDS))))
        values = dict(data)
        values["facts"] = NodeFacts(**data["facts"])
        values["node"] = None if data["node"] is None else NodeTable.from_dict(data["node"])
        values["elastic"] = None if data["elastic"] is None else Elastic.from_dict(data["elastic"])
        return cls(**values)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_dict() == other.to_dict()  # type: ignore

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore  # equal by value, and its lists and dicts are not hashable


class Launch(object):
    """What a unit returns: its argv and what goes with it. ``info``: keys added to the plan's
    ``launcher`` record; ``files``: ``{"path", "content", "why"}`` to write before the start;
    ``environment``: ``name -> (value, reason, source)`` set for the command."""

    def __init__(self, argv: List[str]) -> None:
        self.argv = argv
        self.problems = []  # type: List[str]
        self.notes = []  # type: List[str]
        self.files = []  # type: List[Dict[str, str]]
        self.info = {}  # type: Dict[str, str]
        self.environment = {}  # type: Dict[str, Tuple[str, str, str]]


class Unit(object):
    """One launcher. Subclasses set the class attributes and override ``launch``.

    ``needs_ssh``: it reaches other nodes over SSH; ``starts_without_ssh``: it can run where a
    scheduler started one entrypoint per node and serves no SSH; ``reaches_hosts``: from a
    launcher role it starts ranks on the scheduler's hosts; ``joins_elastic``: it joins an elastic
    rendezvous; ``programs``/``modules``: how a command that is itself this launcher starts."""

    name = ""
    order = 100  # where ``MNP_LAUNCHER``'s values list it (built-ins 10-50; a new unit after)
    needs_ssh = False
    on_children = ""
    env_propagation = ""
    # the program the unit runs; ``launchers.programs()`` has the probe look it up on PATH
    binary = None  # type: Optional[str]
    source = ""
    starts_without_ssh = False
    reaches_hosts = False
    joins_elastic = False
    programs = ()  # type: Tuple[str, ...]
    modules = ()  # type: Tuple[str, ...]
    # the ``MNP_*`` settings of this unit's own (``launch`` reads them in ``request.options``)
    options = ()  # type: Tuple[str, ...]

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "needs_ssh": self.needs_ssh, "on_children": self.on_children,
                "env_propagation": self.env_propagation, "binary": self.binary,
                "source": self.source}

    def launch(self, request: LaunchRequest) -> Launch:
        raise NotImplementedError

    def prepare_environment(self, environment: Dict[str, str]) -> List[str]:
        """Change the command's environment before the start (in place); returns notes."""
        return []

    def uses_mpi(self, facts: NodeFacts, options: Mapping[str, Any], rendezvous: bool) -> bool:
        """Whether Open MPI's mpirun starts the ranks (the plan then sets the MPI parameters,
        before the request is made): from the node's facts, the unit's ``options`` and whether
        the entrypoints wire the nodes."""
        return False

    def mpi_findings(self, params: Sequence[Any]) -> Tuple[List[str], List[str]]:
        """``(notes, problems)`` about the merged MPI parameters for this launcher."""
        return [], []


def is_python(arg: str) -> bool:
    return bool(PYTHON_RE.match(os.path.basename(arg)))


def node_specific(name: str) -> bool:
    return name in NODE_SPECIFIC or name.startswith(node_specific_prefixes())


def export_names(env: Dict[str, str], patterns: Sequence[str] = ()) -> List[str]:
    """The variable names to pass to every rank (``mpirun -x``, DeepSpeed's env file), sorted:
    every name of ``env`` that is not node-specific, plus ``MNP_EXPORT_ENV``'s names or
    ``PREFIX*`` patterns (which may name node-specific ones on purpose). Names that are not
    identifiers (bash's exported functions) cannot be passed and are left out."""
    names = set(n for n in env if NAME_RE.match(n) and not node_specific(n))
    for pattern in patterns:
        if pattern.endswith("*"):
            names.update(n for n in env if n.startswith(pattern[:-1]) and NAME_RE.match(n))
        elif pattern in env:
            names.add(pattern)
    names.discard("MNP_SECRET")
    names.discard("MNP_SECRET_FILE")
    return sorted(names)


def python_program(command: Sequence[str]) -> List[str]:
    """``command`` with ``python3`` in front when it starts with a ``.py`` file (for mpirun)."""
    if command and command[0].endswith(".py") and not is_python(command[0]):
        return ["python3"] + list(command)
    return list(command)


def program_tail(command: Sequence[str], module_flag: str,
                 exec_flags: Sequence[str]) -> Tuple[List[str], str]:
    """``(tail, kind)``: the user's program as a Python launcher takes it after its own options:
    a script as is, ``module_flag`` before a module, ``exec_flags`` before anything else."""
    kind, rest = split_program(command)
    if kind == "module":
        return [module_flag] + rest, kind
    if kind == "script":
        return rest, kind
    return list(exec_flags) + rest, kind


def split_program(command: Sequence[str]) -> Tuple[str, List[str]]:
    """Classify the user's command for python launchers (torchrun, deepspeed).

    Returns ``(kind, rest)``: ``("script", [script, args...])`` for ``train.py args`` or
    ``python3 train.py args``; ``("module", [module, args...])`` for ``python3 -m mod args``;
    ``("exec", command)`` for anything else (run as is, e.g. ``python3 -u train.py``)."""
    command = list(command)
    if not command:
        return "exec", command
    if is_python(command[0]) and len(command) > 1:
        if command[1] == "-m" and len(command) > 2:
            return "module", command[2:]
        if not command[1].startswith("-"):
            return "script", command[1:]
        return "exec", command
    if command[0].endswith(".py"):
        return "script", command
    return "exec", command
