"""``mnp-stacks``: the project's tasks as an installed command that works from any directory.

``invoke`` finds its tasks by looking for ``tasks.py`` from the current directory upwards, so
outside this checkout it says "Can't find any collection named 'tasks'!" and a team that keeps
its own stacks file in its own repository cannot use the tasks. ``mnp-stacks`` (a console
script, ``[project.scripts]`` in pyproject.toml) runs the same tasks through invoke's
``Program`` with the collection given, so ``cd ~/team && mnp-stacks plan --stacks
team-stacks.yaml`` works, and ``mnp-stacks --version`` names this project, not invoke.

Where the tasks come from: the root ``tasks.py`` itself, loaded by path from the checkout
(:data:`matrix.model.settings.ROOT`), not a copy or a move of the task bodies into the package.
One definition of every task and its options serves ``invoke`` in the checkout and ``mnp-stacks``
anywhere, so the two can never drift apart, and the project layout keeps its root ``tasks.py``.
The price is that ``mnp-stacks`` needs the checkout: the tasks read the components' templates,
tests and schemas under ``images/`` of the checkout anyway (settings.py anchors every path
there), which is why the project is installed editable (``pip install -e``, what ``./dev``
does). A non-editable install has no checkout beside its package; it then stops with one line
saying so instead of a traceback (``--version`` still answers: it needs no checkout).
``invoke --version`` keeps printing invoke's own version: invoke answers it before it reads any
tasks file (``Program.parse_core``), so nothing in ``tasks.py`` can change it.

The command line is checked before invoke parses it (:mod:`matrix.cli.usage`, called where
``tasks.py`` is loaded, which it does for the program named ``mnp-stacks`` too), so a mistake is
one line and exit status 2, as with ``invoke``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType

import invoke

from matrix.cli import pipes
from matrix.errors import EXIT_CANNOT
from matrix.model.settings import ROOT

NAME = "mnp-stacks"
# What must be in a checkout for the tasks to run: the tasks and the components they build.
PROJECT_FILES = ("tasks.py", "images")
VERSION_FLAGS = ("--version", "-V")


class NoCheckout(Exception):
    """The project's files are not where the package says its checkout is."""


def project_version() -> str:
    """This project's version as installed (its package metadata, from pyproject.toml)."""
    try:
        return metadata.version(NAME)
    except metadata.PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown"


def load_tasks(root: Path = ROOT) -> ModuleType:
    """The checkout's ``tasks.py`` as the module ``tasks`` (the name invoke's loader gives it)."""
    missing = [name for name in PROJECT_FILES if not (root / name).exists()]
    if missing:
        raise NoCheckout(
            f"the project's files are not at {root} (no {', '.join(missing)}): the tasks run "
            f"from a checkout; install it editable there: pip install -e CHECKOUT (./dev does)")
    spec = importlib.util.spec_from_file_location("tasks", root / "tasks.py")
    if spec is None or spec.loader is None:
        raise NoCheckout(f"cannot load {root / 'tasks.py'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tasks"] = module
    spec.loader.exec_module(module)
    return module


def program(module: ModuleType) -> invoke.Program:
    """invoke's ``Program`` running ``module``'s tasks under this project's name and version."""
    return invoke.Program(namespace=invoke.Collection.from_module(module), name=NAME, binary=NAME,
                          binary_names=[NAME], version=project_version())


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: ``mnp-stacks TASK [--option VALUE]...`` (``mnp-stacks --list``)."""
    args = list(sys.argv if argv is None else argv)
    try:
        module = load_tasks()
    except NoCheckout as exc:
        if args[1:2] and args[1] in VERSION_FLAGS:  # the version needs no checkout
            print(f"{NAME} {project_version()}")
            return
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CANNOT)
    pipes.run_quietly(lambda: program(module).run(args))  # mnp-stacks --list | head -1
