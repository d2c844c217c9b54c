"""Slurm: ``srun`` steps (every task runs the entrypoint) and batch scripts (``sbatch``/``salloc``).

Under ``srun`` each task gets ``SLURM_STEP_ID``, ``SLURM_NODEID`` (this node's index in the step),
``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``, the step's nodes
(``SLURM_STEP_NODELIST``, compressed: ``node[1-3]``), their count (``SLURM_STEP_NUM_NODES``)
and tasks per node (``SLURM_STEP_TASKS_PER_NODE``: ``2(x3)``). A batch script runs once, on the
allocation's first node, with the job's variables only (``SLURM_JOB_NODELIST``,
``SLURM_JOB_NUM_NODES``, ``SLURM_TASKS_PER_NODE``) and no ``SLURM_STEP_*``: it is the job's
launcher (Open MPI's mpirun reads the allocation and starts its daemons through Slurm, no SSH).
Slurm wires the nodes itself; the main node is the first host of the list (``nodelist``).

A step of one task per node whose launcher needs SSH (``MNP_LAUNCHER=mpirun`` or ``deepspeed``
from a container that has no ``srun``: pyxis' tasks) is wired by the entrypoint instead, as on
Batch: the table gives the step's id for that rendezvous (``wiring_id``), ``settings.wiring``
decides.
"""

from typing import Dict, List, Mapping, Optional, Tuple

from ..core.errors import ConfigError
from . import nodelist
from .base import MAX_NODES, STARTED, NodeTable, below, first, get, integer, optional_integer

NAME = "slurm"
# Slurm's own ways to start ranks without SSH between the nodes, for a plan's problem line.
OTHER_WAYS = ("srun --mpi=pmix (every task is a rank), srun --ntasks-per-node=1 --mpi=none "
              "(the entrypoints wire the nodes for MNP_LAUNCHER=mpirun or deepspeed) or mpirun "
              "from the batch script")
PRECEDENCE = 60  # between equally sure adapters (schedulers/__init__.py says why)
SUBMITTED = True  # whether a job is submitted to it (base.ADAPTER_CONTRACT)
# Slurm's per-task variables stay each rank's own (Open MPI under Slurm sets them per node):
# never passed from the main node to the other nodes' ranks (launchers.base.node_specific).
NODE_PREFIXES = ("SLURM_", "SLURMD_")  # per-process variable prefixes (base.ADAPTER_CONTRACT)
SOURCE = ("https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES; "
          "https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES")
JOB_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")
STEP_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEPID")
# (step spelling, job spellings): a step's own value first, the job's when there is no step
NODELIST = (("SLURM_STEP_NODELIST",), ("SLURM_JOB_NODELIST", "SLURM_NODELIST"))
NUM_NODES = (("SLURM_STEP_NUM_NODES",), ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"))
TASKS = (("SLURM_STEP_TASKS_PER_NODE",), ("SLURM_TASKS_PER_NODE",))
SIGNALS = JOB_VARIABLES + STEP_VARIABLES + ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                            "SLURM_NODEID", "SLURM_PROCID")


def detect(env: Mapping[str, str]) -> Optional[str]:
    return first(env, *JOB_VARIABLES)


def trust(env: Mapping[str, str]) -> Tuple[int, str]:
    """slurmd and slurmstepd set SLURM_* for the batch script and for every task of a step; a
    Kubernetes pod or a Batch container has none of them unless someone copies them in."""
    return STARTED, "Slurm sets SLURM_* for the batch script and every task it starts; a pod has none"


def tasks_here(env: Mapping[str, str]) -> Optional[int]:
    """The step's tasks on this node (``SLURM_STEP_TASKS_PER_NODE`` at ``SLURM_NODEID``), or None
    outside a step or when a value is unreadable (``table`` names it then)."""
    raw, node = get(env, TASKS[0][0]), get(env, "SLURM_NODEID")
    if not first(env, *STEP_VARIABLES) or raw is None or node is None or not node.isdigit():
        return None
    try:
        counts = nodelist.expand_counts(raw)
    except ValueError:
        return None
    return counts[int(node)] if int(node) < len(counts) else None


def _pick(env: Mapping[str, str], names, step: bool) -> Optional[str]:
    step_names, job_names = names
    return first(env, *((step_names + job_names) if step else job_names))


def _hosts(env: Mapping[str, str], step: bool) -> List[str]:
    name = _pick(env, NODELIST, step)
    if name is None:
        raise ConfigError(NODELIST[1][0], "is not set: Slurm names the job's nodes in it")
    try:
        hosts = nodelist.expand(get(env, name) or "")
    except ValueError as exc:
        raise ConfigError(name, "is not a Slurm host list: %s" % exc) from None
    if not hosts:
        raise ConfigError(name, "names no host")
    if len(hosts) > MAX_NODES:
        raise ConfigError(name, "names %d hosts, more than %d" % (len(hosts), MAX_NODES))
    count_name = _pick(env, NUM_NODES, step)
    if count_name is not None:
        count = integer(env, count_name, minimum=1, maximum=MAX_NODES)
        if count != len(hosts):
            raise ConfigError(name, "names %d host(s) but %s=%d" % (len(hosts), count_name, count))
    return hosts


def _slots(env: Mapping[str, str], step: bool, hosts: List[str]) -> Optional[List[int]]:
    name = _pick(env, TASKS, step)
    if name is None:
        return None
    try:
        slots = nodelist.expand_counts(get(env, name) or "")
    except ValueError as exc:
        raise ConfigError(name, "is not a Slurm task count list like 2(x3),1: %s" % exc) \
            from None
    if len(slots) != len(hosts):
        raise ConfigError(name, "gives %d node(s) but the host list names %d"
                          % (len(slots), len(hosts)))
    return slots


def _extra(env: Mapping[str, str], job_name: str, step_name: Optional[str]) -> Dict[str, str]:
    extra = {"job id": get(env, job_name) or ""}
    if step_name:
        extra["launch"] = "srun step %s" % get(env, step_name)
    else:
        extra["launch"] = "batch script or salloc shell (no SLURM_STEP_ID)"
    ntasks = optional_integer(env, "SLURM_NTASKS", minimum=1)
    procid = optional_integer(env, "SLURM_PROCID")
    localid = optional_integer(env, "SLURM_LOCALID")
    if procid is not None and ntasks is not None:
        below("SLURM_PROCID", procid, "SLURM_NTASKS", ntasks)
    if step_name and procid is not None:
        extra["task"] = "SLURM_PROCID=%d of SLURM_NTASKS=%s, SLURM_LOCALID=%s" % (
            procid, ntasks if ntasks is not None else "?", localid if localid is not None else "?")
    for name, label in (("SLURMD_NODENAME", "this node"), ("SLURM_GPUS_ON_NODE", "gpus on node")):
        if get(env, name):
            extra[label] = get(env, name) or ""
    return extra


def _check_rank(env: Mapping[str, str], rank: int, step: bool, count: int) -> None:
    if rank >= count:
        limit = _pick(env, NUM_NODES, step) or _pick(env, NODELIST, step)
        raise ConfigError("SLURM_NODEID", "%d is not below the node count %d (%s)"
                          % (rank, count, limit))


def table(env: Mapping[str, str]) -> NodeTable:
    detected = detect(env)
    if detected is None:
        raise ConfigError(JOB_VARIABLES[0], "is not set: this is not a Slurm job")
    step_name = first(env, *STEP_VARIABLES)
    step = step_name is not None
    hosts = _hosts(env, step)
    slots = _slots(env, step, hosts)
    extra = _extra(env, detected, step_name)
    common = dict(num_nodes=len(hosts), main_address=hosts[0], hosts=hosts, slots=slots,
                  extra=extra, slots_are="tasks", other_ways=OTHER_WAYS)
    if not step:
        # The script runs on the first node (SLURM_NODEID=0); salloc's shell on a login node
        # has no SLURM_NODEID at all.
        rank = optional_integer(env, "SLURM_NODEID")
        if rank is not None:
            _check_rank(env, rank, step, len(hosts))
        return NodeTable(NAME, detected, "launcher", node_rank=rank, runs_ranks=rank is not None,
                         **common)
    rank = integer(env, "SLURM_NODEID")
    _check_rank(env, rank, step, len(hosts))
    role = "single" if len(hosts) == 1 else ("main" if rank == 0 else "child")
    return NodeTable(NAME, detected, role, node_rank=rank, wiring_id=_wiring_id(env, detected, step_name),
                     **common)


def _wiring_id(env: Mapping[str, str], job_name: str, step_name: str) -> str:
    """The step's own id (job, step and requeue count: a requeued job runs its steps again
    under the same numbers), for the entrypoint's rendezvous when it wires the step's nodes."""
    return "slurm-%s.%s.%s" % (get(env, job_name), get(env, step_name),
                               get(env, "SLURM_RESTART_COUNT") or "0")


def example(num_nodes: int, node_rank: int = 0) -> Dict[str, str]:
    """What ``srun -N<num_nodes> --ntasks-per-node=1`` gives the task on node ``node_rank``
    (measured on Slurm 22.05), for ``invoke explain --scheduler``."""
    hosts = "node[1-%d]" % num_nodes if num_nodes > 1 else "node1"
    tasks = "1(x%d)" % num_nodes if num_nodes > 1 else "1"
    return {
        "SLURM_JOB_ID": "1234", "SLURM_JOBID": "1234", "SLURM_STEP_ID": "0",
        "SLURM_NODEID": str(node_rank),
        "SLURM_PROCID": str(node_rank), "SLURM_LOCALID": "0", "SLURM_NTASKS": str(num_nodes),
        "SLURM_JOB_NODELIST": hosts, "SLURM_JOB_NUM_NODES": str(num_nodes),
        "SLURM_STEP_NODELIST": hosts, "SLURM_STEP_NUM_NODES": str(num_nodes),
        "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURM_TASKS_PER_NODE": tasks,
        "SLURMD_NODENAME": "node%d" % (node_rank + 1),
    }
