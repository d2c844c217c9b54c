"""Small builders shared by the unit tests."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrix.image.plan import Plan, plan
from matrix.model import yamlsrc
from matrix.model.entities import Base, ComponentVersion, Matrix, Stack
from matrix.model.loader import load_matrix
from matrix.model.settings import ROOT

if TYPE_CHECKING:
    from matrix.jobs.request import JobRequest

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


def typed_options(task: str, words: Sequence[str]) -> dict[str, Any]:
    """``--option value`` words of ``invoke TASK`` as invoke hands them to the task's body: a
    flag True, a repeatable option a list, any other value its text (the writer's declarations
    read them). A word no option of the task declares is a mistake in the test."""
    from matrix.jobs import writers

    options = writers.for_task(task).task_options()
    typed: dict[str, Any] = {}
    rest = list(words)
    while rest:
        flag = rest.pop(0)
        option = options.get(flag[2:].replace("-", "_")) if flag.startswith("--") else None
        if option is None:
            raise ValueError(f"{flag}: not an option of invoke {task}")
        if option.kind is bool:
            typed[option.name] = True
        elif option.repeatable:
            typed.setdefault(option.name, []).append(rest.pop(0))
        else:
            typed[option.name] = rest.pop(0)
    return typed


def job_for(task: str, *words: str, command: Sequence[str],
            settings: dict[str, str] | None = None) -> JobRequest:
    """The job ``invoke TASK WORDS -- COMMAND`` checks, by the steps the task takes
    (matrix/cli/jobtasks.py ``write_job``): the words parsed with the writer's declarations,
    :func:`matrix.jobs.request.job_request`, then the plan every role starts with, which the task
    refuses to write on a problem (the same :class:`~matrix.errors.UserError` line). The
    project's stacks.yaml is loaded once per process, where the task loads it per call, so a
    test of many variations costs milliseconds each; a test of a refusal's exit status or of
    ``--output`` runs the task itself. ``settings``: ``MNP_*`` values no option of the task sets
    (a test cluster's smaller nodes), given to every node as the options' own are."""
    from matrix.cli.jobtasks import refuse_stops, request
    from matrix.jobs import writers

    typed = typed_options(task, words)
    project = typed.get("stacks", "stacks.yaml") == "stacks.yaml"
    job, _ = request(writers.for_task(task), typed, command,
                     matrix=project_matrix() if project else None)
    if settings:
        job = replace(job, settings=job.settings + tuple(settings.items()))
    refuse_stops(job)
    return job


def written(task: str, *words: str, command: Sequence[str],
            settings: dict[str, str] | None = None) -> Any:
    """The artefact ``invoke TASK WORDS -- COMMAND`` writes, as its writer made it (a dict for
    a job definition or a manifest, the script's text): :func:`job_for` rendered with the image
    the task resolves from ``--image-uri`` (by digest, else the task's own refusal)."""
    from matrix.cli import deploy

    job = job_for(task, *words, command=command, settings=settings)
    given = typed_options(task, words).get("image_uri")
    return job.render(deploy.image_uri(job.matrix, job.stack.name, given))


def written_for_pair(task: str, *words: str, command: Sequence[str]) -> Any:
    """:func:`written` for a declared (stack, instance) pair, with the writer's default launcher,
    or ``--launcher none`` where the task refuses that launcher's plan on the stack (a stack
    without Open MPI or PyTorch: the user's next try, which runs the command as is)."""
    from matrix.errors import UserError

    try:
        return written(task, *words, command=command)
    except UserError as refusal:
        if "a real run stops there" not in str(refusal):
            raise
    return written(task, *words, "--launcher", "none", command=command)


def stacks_with(tmp_path: Path, targets: dict[str, str], key: str = "instances") -> Path:
    """The project's stacks file with each named stack's flow-style ``key`` value replaced,
    ``instances: [...]`` by default or ``ci: {runner: ...}`` with ``key="ci"`` (the text edited
    where it stands, so every other line reads as it does in stacks.yaml)."""
    opening, closing = {"instances": ("instances: [", "]\n"), "ci": ("ci: {runner: ", "}\n")}[key]
    text = (Path(__file__).resolve().parent.parent / "stacks.yaml").read_text(encoding="utf-8")
    for stack, value in targets.items():
        start = text.index(f"\n  {stack}:\n")
        line = text.index(f"    {opening}", start)
        end = text.index(closing, line)
        text = text[:line] + f"    {opening}{value}" + text[end:]
    path = tmp_path / "stacks.yaml"
    path.write_text(text, encoding="utf-8")
    return path
