"""The torchrun launcher unit: no SSH; every node runs the same torchrun with its own ``--node_rank``.

``torchrun --nnodes N --node_rank R --nproc_per_node <slots> --master_addr <first node>
--master_port <port> <program>`` (``python3 -m torch.distributed.run`` when the ``torchrun``
script is missing). The underscore spellings work with every torch release; ``R`` is the node
index. ``--master_addr`` is the address of the first node in the hostfile (node index 0): rank 0
lives there, so its store must be there. On Batch that is normally the main node.

``torchrun`` on PyTorch older than 1.9 (no ``torch.distributed.run``) becomes
``torch.distributed.launch`` (``distributed_launch``), which PyTorch had since 1.0.
"""

from typing import Dict, List, Optional, Sequence

from ..core import versions
from .base import Unit, split_program

TORCHRUN_MIN = ">=1.9.0"  # torch.distributed.run (torchelastic) ships from PyTorch 1.9.0
TORCHRUN_SCRIPT_MIN = ">=1.10.0"  # the `torchrun` console script from 1.10.0
PYTORCH_UNITS = ("torchrun", "torch.distributed.launch")  # the launchers that run PyTorch's own
SOURCE = ("https://pytorch.org/docs/1.9.0/elastic/run.html (torch.distributed.run, new in "
          "1.9.0); https://pytorch.org/docs/1.10.0/elastic/run.html (torchrun script)")
UNIT = Unit("torchrun", False, "runs the same torchrun with --node_rank <index>",
            "none needed: every node starts its processes from its own environment",
            "torchrun", SOURCE)


def fallback(pytorch_version: Optional[str]) -> Optional[str]:
    """The note when torchrun must become ``torch.distributed.launch`` (PyTorch < 1.9), else
    ``None``."""
    if versions.in_range(pytorch_version, TORCHRUN_MIN) is False:
        return ("PyTorch %s has no torch.distributed.run (new in 1.9.0): using "
                "torch.distributed.launch" % pytorch_version)
    return None


def pytorch_problem(unit_name: str, binaries: Dict[str, str],
                    pytorch_version: Optional[str]) -> Optional[str]:
    """The plan problem when a PyTorch launcher is asked for on a node without PyTorch (no
    ``torch`` distribution and no ``torchrun`` script), else ``None``: both launchers run
    PyTorch's own modules (torch.distributed.run / torch.distributed.launch)."""
    if unit_name not in PYTORCH_UNITS:
        return None
    if pytorch_version or binaries.get("torchrun"):
        return None
    return ("%s needs PyTorch, but neither the torch package nor a torchrun program was found: "
            "install PyTorch or set MNP_LAUNCHER" % unit_name)


def prefix(binaries: Dict[str, str]) -> List[str]:
    """``torchrun`` when the script is there, else ``python3 -m torch.distributed.run``."""
    if binaries.get("torchrun"):
        return ["torchrun"]
    return ["python3", "-m", "torch.distributed.run"]


def argv(prefix: Sequence[str], command: Sequence[str], nnodes: int, node_rank: int, nproc: int,
         master_addr: str, master_port: int, launcher_args: Sequence[str] = ()) -> List[str]:
    """The torchrun command line, the same on every node but for ``--node_rank``."""
    line = list(prefix) + [
        "--nnodes", str(nnodes),
        "--node_rank", str(node_rank),
        "--nproc_per_node", str(nproc),
        "--master_addr", master_addr,
        "--master_port", str(master_port),
    ]
    line += list(launcher_args)
    kind, rest = split_program(command)
    if kind == "module":
        line += ["-m"] + rest
    elif kind == "script":
        line += rest
    else:
        line += ["--no_python"] + rest
    return line
