"""The job writers, found by their mark: every module of ``matrix/jobs/`` that defines a
module-level ``WRITER`` (an instance of :class:`matrix.jobs.writer.Writer`) is one, so adding a
scheduler's writer is adding that one module; nothing else names the writers one by one.
``invoke explain``, the tasks and the contract test iterate :func:`all_writers`.

The modules are found by reading their source and imported only then, so listing the writers
imports no module that is not one (``rehearse`` needs Docker's client).
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

from matrix.jobs.writer import Writer

PACKAGE = "matrix.jobs"
MARK = "WRITER"


# An assignment (``WRITER = ...`` or ``WRITER: Writer = ...``) at the start of a line, where only
# a module-level statement can start. Every command lists the writers: parsing the modules with
# ``ast`` took 0.1 s of each for all thirteen, and 0.02 s for the three that name WRITER. A line
# like it inside a string would be imported and fail all_writers' check of its WRITER.
ASSIGNMENT = re.compile(rf"^{MARK}\s*(?::[^=\n]*)?=(?!=)", re.M)


def _marked(path: Path) -> bool:
    """Whether the module at ``path`` assigns ``WRITER`` at its top level."""
    return ASSIGNMENT.search(path.read_text(encoding="utf-8")) is not None


@cache
def all_writers() -> tuple[Writer, ...]:
    """Every writer, in the order of its module's name."""
    found = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if _marked(path):
            writer = getattr(importlib.import_module(f"{PACKAGE}.{path.stem}"), MARK, None)
            if not isinstance(writer, Writer):  # a programming error, not a user's
                raise TypeError(f"{PACKAGE}.{path.stem}.WRITER is not a matrix.jobs.writer.Writer")
            found.append(writer)
    for key, what in ((lambda w: (w.task,), "task"), (lambda w: w.schedulers, "scheduler")):
        names = [name for writer in found for name in key(writer)]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # explain and the tasks pick a writer by these: each must name one
            raise TypeError(f"two writers claim the {what} {', '.join(twice)}")
    return tuple(found)


def for_task(task: str) -> Writer:
    """The writer of the invoke task ``task`` (jobdef, sbatch, k8s)."""
    (writer,) = [w for w in all_writers() if w.task == task]
    return writer


def for_scheduler(scheduler: str) -> Writer | None:
    """The writer whose artefacts the entrypoint's adapter ``scheduler`` starts, or None (an
    adapter no task writes a job for)."""
    return next((w for w in all_writers() if scheduler in w.schedulers), None)
