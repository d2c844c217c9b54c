"""Already a rank: a launcher above (mpirun, ``srun --mpi=pmix``, torchrun, deepspeed) started
this process as one rank of a running job, so the entrypoint runs the command and nothing else.

Checked first of all schedulers: these variables exist only inside a launched job, and starting
another launcher here would nest a job in every rank. The variable names which launcher it was:

- ``OMPI_COMM_WORLD_RANK``: Open MPI's mpirun (with ``OMPI_COMM_WORLD_SIZE``/``_LOCAL_RANK``);
- ``PMIX_RANK``: a PMIx server: ``srun --mpi=pmix`` or Open MPI >= 4's mpirun;
- ``PMI_RANK``: PMI-1/2: MPICH/Intel MPI hydra, ``srun --mpi=pmi2``;
- ``LOCAL_RANK``: torchrun, torch.distributed.launch ``--use_env``, deepspeed's launcher (a
  PyTorchJob sets ``RANK`` per pod but never ``LOCAL_RANK``).
"""

from typing import Dict, Mapping, Optional, Tuple

from . import slurm
from .base import EXPORTED, LAUNCHED, NodeTable, below, first, get, integer

NAME = "rank"
PRECEDENCE = 10  # between equally sure adapters (schedulers/__init__.py says why)
SUBMITTED = False  # whether a job is submitted to it (base.ADAPTER_CONTRACT)
# Open MPI's and PMIx's own per-process variables (a launcher above set them for this rank):
# never passed from the main node to the other nodes' ranks; OMPI_MCA_* reach them through
# mpirun itself (launchers.base.node_specific).
NODE_PREFIXES = ("OMPI_", "PMIX_")  # per-process variable prefixes (base.ADAPTER_CONTRACT)
SOURCE = ("https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html; "
          "https://slurm.schedmd.com/mpi_guide.html (PMIx); "
          "https://pytorch.org/docs/stable/elastic/run.html#environment-variables (LOCAL_RANK, "
          "TORCHELASTIC_RUN_ID); NVIDIA/enroot conf/hooks/extra/50-slurm-pytorch.sh (exports "
          "LOCAL_RANK=SLURM_LOCALID)")
# variable -> (who set it, the world size variable, the local rank variable)
LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "Open MPI mpirun", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMIX_RANK", "a PMIx server (srun --mpi=pmix or mpirun)", None, None),
    ("PMI_RANK", "a PMI server (MPICH/Intel MPI hydra or srun --mpi=pmi2)", "PMI_SIZE", None),
    ("LOCAL_RANK", "torchrun, torch.distributed.launch or deepspeed", "WORLD_SIZE", None),
)
SIGNALS = tuple(row[0] for row in LAUNCHERS)
# torchrun (torch.distributed.run, PyTorch >= 1.9) sets it for every worker it starts; a script
# that exports LOCAL_RANK itself (enroot's PyTorch hook, sbatch recipes) does not.
TORCHRUN_MARK = "TORCHELASTIC_RUN_ID"


def detect(env: Mapping[str, str]) -> Optional[str]:
    return first(env, *(row[0] for row in LAUNCHERS))


def trust(env: Mapping[str, str]) -> Tuple[int, str]:
    """The launcher variables are set only for the processes a launcher starts. ``LOCAL_RANK``
    is also what job scripts export: it proves a launcher only with torchrun's own mark, or
    where a Slurm step runs several tasks on this node and it is this task's ``SLURM_LOCALID``
    (srun started each task as one rank; enroot's PyTorch hook exports it so)."""
    name = detect(env) or LAUNCHERS[0][0]
    if name != "LOCAL_RANK":
        row = [r for r in LAUNCHERS if r[0] == name][0]
        return LAUNCHED, "%s sets it for each process it starts" % row[1]
    if get(env, TORCHRUN_MARK):
        return LAUNCHED, "torchrun sets it with %s for each worker it starts" % TORCHRUN_MARK
    tasks = slurm.tasks_here(env)
    if tasks is not None and tasks > 1 and get(env, name) == get(env, "SLURM_LOCALID"):
        return LAUNCHED, ("it is this task's SLURM_LOCALID and the Slurm step runs %d tasks on "
                          "this node: each task is one rank" % tasks)
    return EXPORTED, ("without %s a job script can export it too, as enroot's PyTorch hook does "
                      "in every Slurm task" % TORCHRUN_MARK)


def table(env: Mapping[str, str]) -> NodeTable:
    name = detect(env) or LAUNCHERS[0][0]
    row = [r for r in LAUNCHERS if r[0] == name][0]
    value = integer(env, name)
    extra = {"started by": row[1], "rank": "%d (%s)" % (value, name)}
    if row[2] and get(env, row[2]):
        size = integer(env, row[2], minimum=1)
        below(name, value, row[2], size)
        extra["world size"] = "%d (%s)" % (size, row[2])
    if row[3] and get(env, row[3]):
        extra["local rank"] = "%d (%s)" % (integer(env, row[3]), row[3])
    return NodeTable(NAME, name, "rank", node_rank=None, num_nodes=None, extra=extra, rank=value)


def example(num_nodes: int, node_rank: int = 0) -> Dict[str, str]:
    """Rank ``node_rank`` of an Open MPI job of ``num_nodes`` ranks."""
    return {"OMPI_COMM_WORLD_RANK": str(node_rank), "OMPI_COMM_WORLD_SIZE": str(num_nodes),
            "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
