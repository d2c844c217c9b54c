"""Scheduler adapters, one module each on a shared ``base``: who started this process, and the
node table that scheduler gives it. ``choose(env)`` picks one; ``plan`` uses its ``NodeTable``.

Every module of this package that defines ``NAME`` is an adapter and provides what
``base.ADAPTER_CONTRACT`` declares: ``NAME``, ``SOURCE`` (where its variables are documented),
``SIGNALS`` (its variables, to name the ones left unused), ``PRECEDENCE`` (its place in the
detection order), ``detect(env)`` (the variable it recognised itself from, or None),
``trust(env)`` (how surely that variable names who started this process, with why:
``base.LAUNCHED``, ``STARTED`` or ``EXPORTED``), ``table(env)`` (its ``NodeTable``; a bad value is
one ``ConfigError`` line naming the variable) and ``example(num_nodes, node_rank)`` (what that
scheduler gives such a process, for ``invoke explain --scheduler``). The package finds its
adapters by that mark and checks each against the contract on import, so adding a scheduler is
adding one module. ``MNP_SCHEDULER`` names one and skips detection.

When several adapters recognise themselves, the surest wins: the scheduler that started the
process over names a job script could have exported (a Slurm step whose sbatch script exported
``MASTER_ADDR``/``RANK``/``WORLD_SIZE`` stays a Slurm job); ``ORDER`` decides between equals.
The table's ``ignored`` names every other adapter's variables and why they were not used.

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
import importlib
import pkgutil
from typing import Any, List, Mapping, Optional, Tuple

from ..core.errors import ConfigError
from . import single
from .base import NodeTable, contract_problems, get


def _adapters() -> Tuple[Any, ...]:
    """Every adapter module of this package, by ``PRECEDENCE``; one that breaks the contract
    stops the import with what it lacks (a programming error, not a user's)."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(__name__ + "." + info.name)
        if hasattr(module, "NAME"):
            problems = contract_problems(module)
            if problems:
                raise TypeError("scheduler adapter breaks base.ADAPTER_CONTRACT: %s"
                                % "; ".join(problems))
            found.append(module)
    return tuple(sorted(found, key=lambda module: (module.PRECEDENCE, module.NAME)))


# Detection order between equally sure adapters (``trust``), most specific first (each module's
# ``PRECEDENCE``). ``rank`` leads:
# a launcher's per-process variables exist only inside a launched job, and every scheduler's
# variables are inherited by the ranks it starts (an ``srun --mpi=pmix`` task also has SLURM_*, a
# torchrun worker in a PyTorchJob also has PET_*). ``batch`` next: the AWS_BATCH_ prefix is
# reserved. ``mpijob`` (its own K_MPI_JOB_ROLE) before the torchrun kinds, and ``pytorchjob``
# before ``trainjob`` because PyTorchJobs set PET_NODE_RANK too from training-operator v1.7.0 (a
# TrainJob never sets RANK/MASTER_ADDR/WORLD_SIZE or PET_RDZV_ENDPOINT). ``slurm`` outranks the
# Kubeflow kinds by trust, not by place: a pod has no SLURM_*, while a Slurm task may carry a
# script's MASTER_ADDR/RANK. ``single`` is the fallback and detects nothing.
ORDER = _adapters()
NAMES = tuple(m.NAME for m in ORDER)
MODULES = dict((m.NAME, m) for m in ORDER)
SOURCES = dict((m.NAME, m.SOURCE) for m in ORDER)
VARIABLE = "MNP_SCHEDULER"
# Where a single node means "no AWS Batch MNP variables" (the dry run says so).
SINGLE_NODE_WITHOUT_MNP = (single.NAME, "batch")
AUTO = "auto"

__all__ = ["NAMES", "NodeTable", "ORDER", "SOURCES", "choose", "detect", "forced"]


def candidates(env: Mapping[str, str]) -> List[Tuple[Any, str]]:
    """``[(adapter module, the variable it recognised itself from)]`` in ``ORDER``."""
    found = []
    for module in ORDER:
        variable = module.detect(env)
        if variable:
            found.append((module, variable))
    return found


def _best(env: Mapping[str, str], found: List[Tuple[Any, str]]) -> Tuple[Any, str]:
    return min(found, key=lambda pair: (pair[0].trust(env)[0], ORDER.index(pair[0])))


def detect(env: Mapping[str, str]) -> Tuple[str, Optional[str]]:
    """``(scheduler name, the variable it was detected from)``; ``("single", None)`` when none."""
    found = candidates(env)
    if not found:
        return single.NAME, None
    module, variable = _best(env, found)
    return module.NAME, variable


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


def _present(env: Mapping[str, str], module: Any) -> List[str]:
    return [name for name in module.SIGNALS if get(env, name) is not None]


def _ignored(env: Mapping[str, str], found: List[Tuple[Any, str]], chosen: Any,
             variable: str) -> List[str]:
    """One line per other adapter whose variables are present: which, and why not used. An
    adapter whose variables were all named already (a PyTorchJob's PET_NODE_RANK, which
    TrainJob's adapter also reads) adds no line: they are one scheduler's, not another's."""
    named = set(_present(env, chosen))
    tier, why = chosen.trust(env)
    lines = []
    for module, _found in found:
        names = _present(env, module)
        if module is chosen or set(names) <= named:
            continue
        named.update(names)
        their_tier, their_why = module.trust(env)
        line = "%s's %s (%s); " % (module.NAME, ", ".join(names), their_why)
        if variable == VARIABLE:
            line += "%s=%s decides" % (VARIABLE, chosen.NAME)
        else:
            line += "%s's %s wins: %s" % (chosen.NAME, variable, why)
            if their_tier == tier:
                line += " (as sure: first in the detection order; set %s to choose)" % VARIABLE
        lines.append(line)
    return lines


def choose(env: Mapping[str, str]) -> NodeTable:
    """This process's ``NodeTable``: from the scheduler ``MNP_SCHEDULER`` names, else from the
    surest adapter that detects itself (``trust``, then ``ORDER``); every other adapter's
    variables are listed in its ``ignored``. Raises ``ConfigError``."""
    name = forced(env)
    found = candidates(env)
    if name is not None:
        table = MODULES[name].table(env)
        table.detected_from = "%s=%s" % (VARIABLE, name)
        table.ignored = _ignored(env, found, MODULES[name], VARIABLE)
        return table
    if not found:
        return single.table(env)
    module, variable = _best(env, found)
    table = module.table(env)
    table.ignored = _ignored(env, found, module, variable)
    return table
