"""Launchers as units behind one interface (``base.Unit``), one module each; ``plan`` builds a
``LaunchRequest`` and calls ``unit.launch(request)``.

Each unit module holds one ``Unit`` subclass and its instance ``UNIT``: what its launcher needs
(SSH, a program on PATH), what children do, how the environment reaches the other nodes' ranks,
where that comes from (``SOURCE``) and its command line. ``invoke jobdef --launcher`` and
``MNP_LAUNCHER`` accept exactly ``names()``.

- ``mpirun``: SSH; children start nothing (orted arrives over SSH); ``mpirun -x NAME``.
- ``deepspeed``: SSH; children start nothing (pdsh or mpirun reaches them); ``DS_ENV_FILE``
  (DeepSpeed >= 0.10.1), else ``~/.deepspeed_env``.
- ``torchrun``, ``torch.distributed.launch`` (``distributed_launch``): no SSH; every node runs the
  same launcher with its own ``--node_rank`` and environment.
- ``none``: SSH set up; the command (a script calling a launcher) runs on the main node.

``torchrun`` on PyTorch older than 1.9 (no ``torch.distributed.run``) becomes
``torch.distributed.launch``, which PyTorch had since 1.0. A new launcher is one module of this
package with its ``Unit`` subclass and ``UNIT``: every module that has a ``UNIT`` is registered
on import, in ``Unit.order`` (``register`` adds one from elsewhere, e.g. a test's).
"""

import importlib
import os
import pkgutil
from collections import OrderedDict
from typing import List, Optional, Tuple

from . import distributed_launch, mpirun, none, torchrun
from .base import Unit

UNITS = OrderedDict()  # type: OrderedDict
AS_IS = none.UNIT.name  # the unit that runs the command itself
# The launcher each role runs when MNP_LAUNCHER is not set (others: ``EVERY_NODE``).
ROLE_DEFAULTS = {"launcher": mpirun.UNIT.name, "peer": torchrun.UNIT.name, "rank": AS_IS,
                 "worker": AS_IS}
EVERY_NODE = torchrun.UNIT.name  # where the scheduler started one entrypoint per node
BATCH_DEFAULT = mpirun.UNIT.name  # MNP_LAUNCHER's default (AWS Batch's main node)
# Commands that are themselves launchers but no unit here: under a scheduler that wired the nodes
# they run as is, like the units' own programs.
OTHER_PROGRAMS = ("srun", "horovodrun")


def register(unit: Unit) -> None:
    """Make ``unit`` a launcher ``MNP_LAUNCHER`` may name (a later one of a name replaces it)."""
    UNITS[unit.name] = unit


def unregister(name: str) -> None:
    UNITS.pop(name, None)


def _package_units() -> List[Unit]:
    """The ``UNIT`` of every module of this package that has one, by ``order`` then name."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        unit = getattr(importlib.import_module(__name__ + "." + info.name), "UNIT", None)
        if isinstance(unit, Unit):
            found.append(unit)
    return sorted(found, key=lambda unit: (unit.order, unit.name))


for _unit in _package_units():
    register(_unit)
NAMES = tuple(UNITS)  # the package's units, in the order the docs list them


def names() -> Tuple[str, ...]:
    """Every registered unit's name."""
    return tuple(UNITS)


def programs() -> Tuple[str, ...]:
    """Every program a registered unit runs or is started as (``binary``, ``programs``): the
    probe looks each up on PATH (``Config.programs`` carries them down to it)."""
    found = set()
    for unit in UNITS.values():
        found.update(unit.programs)
        if unit.binary:
            found.add(unit.binary)
    return tuple(sorted(found))


def resolve(requested: str, pytorch_version: Optional[str]) -> Tuple[str, Optional[str]]:
    """``(unit name, note or None)``: ``torchrun`` falls back to ``torch.distributed.launch`` on
    PyTorch older than 1.9."""
    if requested == torchrun.UNIT.name:
        note = torchrun.fallback(pytorch_version)
        if note:
            return distributed_launch.UNIT.name, note
    return requested, None


def launcher_command(command: List[str]) -> Optional[str]:
    """The launcher the command itself calls (``torchrun train.py``, as Kubeflow's examples
    write it), or None."""
    if not command:
        return None
    program = os.path.basename(command[0])
    units = list(UNITS.values())
    if program in OTHER_PROGRAMS or any(program in unit.programs for unit in units):
        return program
    if program.startswith("python") and len(command) > 2 and command[1] == "-m" and \
            any(command[2] in unit.modules for unit in units):
        return "%s -m %s" % (program, command[2])
    return None


def command_unit(command: List[str]) -> Optional[str]:
    """The unit whose own program the command starts (``torchrun ...``: torchrun; ``python3 -m
    torch.distributed.launch ...``: that unit), or None (``srun``, ``horovodrun``, a program)."""
    if not command:
        return None
    program = os.path.basename(command[0])
    for unit in UNITS.values():
        if program in unit.programs:
            return unit.name
        if program.startswith("python") and len(command) > 2 and command[1] == "-m" and \
                command[2] in unit.modules:
            return unit.name
    return None
