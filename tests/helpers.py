"""Small builders shared by the unit tests."""

from __future__ import annotations

import copy
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from matrix.image.plan import Plan, plan
from matrix.model import yamlsrc
from matrix.model.entities import Base, ComponentVersion, Matrix, Stack
from matrix.model.loader import load_matrix
from matrix.model.settings import ROOT

DEBIAN = Base(name="debian-12", image="debian:bookworm", os="debian12",
              provides={"debian": "12", "python": "3.11.2"})


def make_stack(layers: dict[str, str], provides: dict[str, str] | None = None,
               instances: tuple[str, ...] = ("c5n.18xlarge",),
               sources: dict[str, str] | None = None, name: str = "s") -> Stack:
    base = Base(name="b", image="example/base:1", os="ubuntu20.04", provides=provides or {})
    cvs = tuple(ComponentVersion(c, v, {"source": (sources or {}).get(c, "pip")})
                for c, v in layers.items())
    return Stack(name=name, description="test", base=base, layers=cvs, instances=instances,
                 fabric="tcp", where=f"stacks.yaml:{name}")


@cache
def _stacks_yaml() -> dict[str, Any]:
    # libyaml's loader: test modules read this file as they are imported, once per collection
    return yamlsrc.load_shipped((ROOT / "stacks.yaml").read_text(encoding="utf-8"))


def stacks_yaml() -> dict[str, Any]:
    """stacks.yaml as plain data: a copy of its one parse in this process, the caller's own."""
    return copy.deepcopy(_stacks_yaml())


@cache
def project_matrix() -> Matrix:
    """The project's stacks.yaml loaded and validated once per process (0.25 s each time: test
    modules read it as they are imported, once per collection and per worker). Shared: read it,
    never change it; a test that edits a matrix loads its own."""
    return load_matrix(ROOT / "stacks.yaml")


@cache
def project_plan() -> Plan:
    """The plan of every stack of the project's stacks.yaml, once per process: test modules
    parametrize from it as they are imported, once per collection (0.5 s each time)."""
    return plan(project_matrix())


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """The one ``error: ...`` line a task printed for a user's mistake, with exit ``code``."""
    assert proc.returncode == code, (proc.returncode, proc.stdout[-500:], proc.stderr)
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def writer_commands() -> dict[str, list[str]]:
    """Each writer's task as a user types it, with the options its first scheduler implies
    (``k8s --kind pytorchjob``), from the writers' registry: no list of names in the tests."""
    from matrix.jobs import writers

    commands = {}
    for writer in writers.all_writers():
        implied = writer.implied(writer.schedulers[0])
        commands[writer.task] = [writer.task] + [word for name, value in implied.items()
                                                 for word in ("--" + name.replace("_", "-"),
                                                              value)]
    return commands


def stacks_with(tmp_path: Path, targets: dict[str, str]) -> Path:
    """The project's stacks file with each named stack's instances list replaced (the text
    edited where it stands, so every other line reads as it does in stacks.yaml)."""
    text = (Path(__file__).resolve().parent.parent / "stacks.yaml").read_text(encoding="utf-8")
    for stack, instances in targets.items():
        start = text.index(f"\n  {stack}:\n")
        line = text.index("    instances: [", start)
        end = text.index("]\n", line)
        text = text[:line] + f"    instances: [{instances}" + text[end:]
    path = tmp_path / "stacks.yaml"
    path.write_text(text, encoding="utf-8")
    return path
