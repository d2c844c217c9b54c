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

from typing import Dict, Mapping, Optional

from .base import NodeTable, below, first, get, integer

NAME = "rank"
SOURCE = ("https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html; "
          "https://slurm.schedmd.com/mpi_guide.html (PMIx); "
          "https://pytorch.org/docs/stable/elastic/run.html#environment-variables")
# variable -> (who set it, the world size variable, the local rank variable)
LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "Open MPI mpirun", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMIX_RANK", "a PMIx server (srun --mpi=pmix or mpirun)", None, None),
    ("PMI_RANK", "a PMI server (MPICH/Intel MPI hydra or srun --mpi=pmi2)", "PMI_SIZE", None),
    ("LOCAL_RANK", "torchrun, torch.distributed.launch or deepspeed", "WORLD_SIZE", None),
)


def detect(env: Mapping[str, str]) -> Optional[str]:
    return first(env, *(row[0] for row in LAUNCHERS))


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
