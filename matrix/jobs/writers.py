"""The job writers, found by their mark: every module of ``matrix/jobs/`` that defines a
module-level ``WRITER`` (an instance of :class:`matrix.jobs.writer.Writer`) is one, so adding a
scheduler's writer is adding that one module; nothing else names the writers one by one.
``invoke explain``, the tasks and the contract test iterate :func:`all_writers`.

The modules are found by reading their source (``ast``) and imported only then, so listing the
writers imports no module that is not one (``rehearse`` needs Docker's client).
"""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

from matrix.jobs.writer import Writer

PACKAGE = "matrix.jobs"
MARK = "WRITER"


# A top-level assignment starts its line; only a module with such a line is parsed (parsing all
# thirteen modules of the package took 0.1 s of every command that lists the writers).
CANDIDATE = re.compile(rf"^{MARK}\b", re.M)


def _marked(path: Path) -> bool:
    """Whether the module at ``path`` assigns ``WRITER`` at its top level."""
    text = path.read_text(encoding="utf-8")
    if not CANDIDATE.search(text):
        return False
    tree = ast.parse(text)
    return any(isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
        isinstance(target, ast.Name) and target.id == MARK
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        for node in tree.body)


@cache
def all_writers() -> tuple[Writer, ...]:
    """Every writer, in the order of its module's name."""
    found = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if _marked(path):
            writer = importlib.import_module(f"{PACKAGE}.{path.stem}").WRITER
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
