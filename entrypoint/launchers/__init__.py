"""Launchers as units, one module each on a shared ``base``; ``plan`` picks one and calls its ``argv``.

Each unit module holds what its launcher needs (SSH, a program on PATH), what children do, how
the environment reaches the other nodes' ranks (``UNIT``), where that comes from (``SOURCE``) and
its command line (``argv``). ``invoke jobdef --launcher`` accepts exactly ``NAMES``.

- ``mpirun``: SSH; children start nothing (orted arrives over SSH); ``mpirun -x NAME``.
- ``deepspeed``: SSH; children start nothing (pdsh or mpirun reaches them); ``DS_ENV_FILE``
  (DeepSpeed >= 0.10.1), else ``~/.deepspeed_env``.
- ``torchrun``, ``torch.distributed.launch`` (``distributed_launch``): no SSH; every node runs the
  same launcher with its own ``--node_rank`` and environment.
- ``none``: SSH set up; the command (a script calling a launcher) runs on the main node.

``torchrun`` on PyTorch older than 1.9 (no ``torch.distributed.run``) becomes
``torch.distributed.launch``, which PyTorch had since 1.0. Scheduler adapters (how a job's nodes
learn their role and addresses) are a separate concern and live beside this package.
"""

from typing import Optional, Tuple

from . import deepspeed, distributed_launch, mpirun, none, torchrun
from .base import export_names, split_program

_MODULES = (mpirun, deepspeed, torchrun, distributed_launch, none)
UNITS = dict((m.UNIT.name, m.UNIT) for m in _MODULES)
NAMES = tuple(m.UNIT.name for m in _MODULES)
SOURCES = dict((m.UNIT.name, m.SOURCE) for m in _MODULES)

# The command-line builders under their names from before the units (entrypoint/launch.py).
mpirun_argv = mpirun.argv
deepspeed_argv = deepspeed.argv
torchrun_argv = torchrun.argv

__all__ = ["NAMES", "SOURCES", "UNITS", "deepspeed", "deepspeed_argv", "distributed_launch",
           "export_names", "mpirun", "mpirun_argv", "none", "resolve", "split_program",
           "torchrun", "torchrun_argv"]


def resolve(requested: str, pytorch_version: Optional[str]) -> Tuple[str, Optional[str]]:
    """``(unit name, note or None)``: ``torchrun`` falls back to ``torch.distributed.launch`` on
    PyTorch older than 1.9."""
    if requested == "torchrun":
        note = torchrun.fallback(pytorch_version)
        if note:
            return distributed_launch.UNIT.name, note
    return requested, None
