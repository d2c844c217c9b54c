"""Scheduler adapters, one module each on a shared ``base``: who started this process, and the
node table that scheduler gives it. ``choose(env)`` picks one; ``plan`` uses its ``NodeTable``.

Each module has ``NAME``, ``SOURCE`` (where its variables are documented), ``detect(env)`` (the
variable it recognised itself from, or None), ``table(env)`` (its ``NodeTable``; a bad value
is one ``ConfigError`` line naming the variable) and ``example(num_nodes, node_rank)`` (what
that scheduler gives such a process, for ``invoke explain --scheduler``). ``MNP_SCHEDULER``
names one and skips detection.

- ``rank``: a launcher already made this process a rank (OMPI_COMM_WORLD_RANK, PMIX_RANK,
  PMI_RANK, LOCAL_RANK): run the command.
- ``batch``: AWS Batch MNP (AWS_BATCH_JOB_*): the entrypoint wires the nodes (rendezvous).
- ``mpijob``: Kubeflow MPIJob launcher or worker (K_MPI_JOB_ROLE).
- ``pytorchjob``: Kubeflow PyTorchJob, static (MASTER_ADDR, RANK, WORLD_SIZE) or elastic
  (PET_RDZV_ENDPOINT).
- ``trainjob``: Kubeflow TrainJob (PET_NODE_RANK, PET_NNODES).
- ``slurm``: an ``srun`` task or a batch script (SLURM_JOB_ID).
- ``single``: none of these.
"""

import difflib
from typing import Mapping, Optional, Tuple

from ..core.errors import ConfigError
from . import batch, mpijob, pytorchjob, rank, single, slurm, trainjob
from .base import NodeTable, get

# Detection order, most specific first. ``rank`` leads: its variables exist only inside a
# launched job, and every scheduler's variables are inherited by the ranks it starts (an
# ``srun --mpi=pmix`` task also has SLURM_*, a torchrun worker in a PyTorchJob also has PET_*).
# ``batch`` next: the AWS_BATCH_ prefix is reserved, nothing else sets it. The Kubeflow kinds
# before Slurm, because a pod can inherit nothing from Slurm but a Slurm task could carry a
# user's MASTER_ADDR/RANK; ``mpijob`` (its own K_MPI_JOB_ROLE) before the torchrun kinds, and
# ``pytorchjob`` before ``trainjob`` because release 1.9 PyTorchJobs set PET_NODE_RANK too (a
# TrainJob never sets RANK/MASTER_ADDR/WORLD_SIZE or PET_RDZV_ENDPOINT). ``single`` is the
# fallback and detects nothing.
ORDER = (rank, batch, mpijob, pytorchjob, trainjob, slurm, single)
NAMES = tuple(m.NAME for m in ORDER)
MODULES = dict((m.NAME, m) for m in ORDER)
SOURCES = dict((m.NAME, m.SOURCE) for m in ORDER)
VARIABLE = "MNP_SCHEDULER"
# Where a single node means "no AWS Batch MNP variables" (the dry run says so).
SINGLE_NODE_WITHOUT_MNP = (single.NAME, batch.NAME)
AUTO = "auto"

__all__ = ["NAMES", "NodeTable", "ORDER", "SOURCES", "choose", "detect", "forced"]


def detect(env: Mapping[str, str]) -> Tuple[str, Optional[str]]:
    """``(scheduler name, the variable it was detected from)``; ``("single", None)`` when none."""
    for module in ORDER:
        found = module.detect(env)
        if found:
            return module.NAME, found
    return single.NAME, None


def forced(env: Mapping[str, str]) -> Optional[str]:
    """The scheduler ``MNP_SCHEDULER`` names, None when unset or ``auto``. An unknown name is
    one line with the closest known one."""
    raw = get(env, VARIABLE)
    if raw is None or raw.lower() == AUTO:
        return None
    name = raw.lower()
    if name in MODULES:
        return name
    close = difflib.get_close_matches(name, NAMES + (AUTO,), n=1)
    hint = " (did you mean %s?)" % close[0] if close else ""
    raise ConfigError(VARIABLE, "%r is not one of %s%s" % (raw, ", ".join(NAMES + (AUTO,)), hint))


def choose(env: Mapping[str, str]) -> NodeTable:
    """This process's ``NodeTable``: from the scheduler ``MNP_SCHEDULER`` names, else from the
    first of ``ORDER`` that detects itself. Raises ``ConfigError``."""
    name = forced(env)
    if name is not None:
        table = MODULES[name].table(env)
        table.detected_from = "%s=%s" % (VARIABLE, name)
        return table
    name, _found = detect(env)
    return MODULES[name].table(env)
