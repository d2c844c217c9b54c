"""What each job of a GitHub workflow hands to pytest, read by running the job's own script.

A job's pytest step is run by bash as the runner would (``bash -e``, the step's and job's
``env`` with ``${{ matrix.* }}`` filled from each ``strategy.matrix.include`` entry), but with a
PATH holding only stand-ins for ``python``, ``python3``, ``pytest`` and ``sudo``: the stand-in
records the arguments pytest would get and exits. Any other command in such a step fails the
reading (nothing else runs for real). Each recorded argument list is then collected for real
with ``pytest --collect-only -q`` (:func:`collected`), so a job's selection is what pytest itself
selects: paths, ``-m`` markers, ``--ignore``, ``-k``, and the conftests' own collection rules.

:func:`gates` asks the other question: does a failing check fail its job? Each step that runs a
check (pytest, invoke, ruff, zizmor, check-jsonschema, git status) is run by bash as the runner
runs it, with stand-ins for those commands that fail (exit 1), and must then fail, after calling
one of them: a ``|| true`` or an ``echo`` in place of the check leaves it green, which is what
is reported. A job or step marked ``continue-on-error``, or a check step that runs only under an
``if:``, is reported too: its failure would not fail the run.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Where node IDs start: pyproject's testpaths.
TEST_ROOTS = ("tests/", "images/")
MATRIX_VALUE = re.compile(r"\$\{\{\s*matrix\.([A-Za-z0-9_-]+)\s*\}\}")

# The stand-in for python/python3/pytest: record pytest's arguments as one JSON line.
RECORDER = """#!/bin/sh
if [ "$(basename "$0")" = pytest ]; then :
elif [ "$1" = -m ] && [ "$2" = pytest ]; then shift 2
else echo "workflow_jobs: $(basename "$0") $* is not a pytest run" >&2; exit 97
fi
exec "{python}" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$PYTEST_RECORD"
"""
# The stand-in for sudo: drop its options, run the rest (itself a stand-in or a failure).
SUDO = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
exec "$@"
"""


@dataclass(frozen=True)
class PytestRun:
    """One pytest invocation of a workflow job (one per matrix entry)."""

    job: str
    variant: str
    args: tuple[str, ...]
    scheduled: bool = False  # a job of the workflow's schedule, not of pull requests

    @property
    def label(self) -> str:
        return f"{self.job}[{self.variant}]" if self.variant else self.job


# Commands that check something: a step running one of them is a check step.
CHECKS = ("pytest", "python", "python3", "invoke", "ruff", "zizmor", "check-jsonschema", "git")
CHECK_STEP = re.compile(r"\b(pytest|invoke|ruff|zizmor|check-jsonschema|git status)\b")
# The stand-in for a check: record its name and fail, as a check that finds a problem does.
FAILING = """#!/bin/sh
echo "${0##*/}" >> "$GATE_RECORD"
echo "stand-in: ${0##*/} $* fails" >&2
exit 1
"""
# Tools a check step may pipe through or test with: the real ones (nothing else is on PATH).
PASS_THROUGH = ("cat", "cut", "dirname", "basename", "env", "grep", "head", "sed", "sort", "tail",
                "tee", "test", "tr", "true", "false", "wc", "xargs", "mkdir")
# GitHub's shells for a run step on Linux (https://docs.github.com/en/actions/reference/
# workflows-and-actions/workflow-syntax#jobsjob_idstepsshell): no `shell:` runs `bash -e {0}`
# (no pipefail); `shell: bash` runs `bash --noprofile --norc -eo pipefail {0}`.
SHELLS = {None: ["/bin/bash", "-e", "-c"],
          "bash": ["/bin/bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]}


@dataclass(frozen=True)
class Gate:
    """What a failing check does in one step of one job (one per matrix entry)."""

    job: str
    variant: str
    step: str
    why_not: str  # "" when the step's failure fails the job and the run

    @property
    def label(self) -> str:
        where = f"{self.job}[{self.variant}]" if self.variant else self.job
        return f"{where}: step {self.step!r}"


def gates(workflow: dict) -> list[Gate]:
    """Every check step of every job, with why its check's failure would not fail the run."""
    found = []
    with tempfile.TemporaryDirectory(prefix="mnp-gate-") as tmp:
        shims = Path(tmp)
        for name in CHECKS:
            (shims / name).write_text(FAILING, encoding="utf-8")
            (shims / name).chmod(0o755)
        (shims / "sudo").write_text(SUDO, encoding="utf-8")
        (shims / "sudo").chmod(0o755)
        for tool in PASS_THROUGH:
            real = shutil.which(tool)
            if real:
                (shims / tool).symlink_to(real)
        for name, job in workflow["jobs"].items():
            for values in matrix_entries(name, job):
                variant = values.get("group", values.get("stacks", "-".join(values.values())))
                for index, step in enumerate(job.get("steps", [])):
                    if not CHECK_STEP.search(step.get("run", "")):
                        continue
                    label = step.get("name") or step["run"].strip().splitlines()[0]
                    found.append(Gate(name, variant, label,
                                      _why_not(job, step, values, shims, f"job {name} step {index}")))
    return found


def _why_not(job: dict, step: dict, values: dict[str, str], shims: Path, where: str) -> str:
    """Why this check step's failure would not fail the run ("" when it would)."""
    if job.get("continue-on-error", False) is not False:
        return f"the job has continue-on-error: {job['continue-on-error']}"
    if step.get("continue-on-error", False) is not False:
        return f"the step has continue-on-error: {step['continue-on-error']}"
    if "if" in step:
        return f"the step runs only if {step['if']}"
    shell = step.get("shell", job.get("defaults", {}).get("run", {}).get("shell"))
    if shell not in SHELLS:
        return f"shell {shell!r} is not one this reader runs"
    env = {**job.get("env", {}), **step.get("env", {})}
    env = {key: fill(value, values, where) for key, value in env.items()}
    record = shims / "gate.txt"
    record.write_text("", encoding="utf-8")
    proc = subprocess.run([*SHELLS[shell], step["run"]], capture_output=True, text=True,
                          check=False, cwd=ROOT,
                          env={**env, "PATH": str(shims), "GATE_RECORD": str(record)})
    called = record.read_text(encoding="utf-8").split()
    if not called:
        return "no check runs: the step passes without calling one"
    if proc.returncode == 0:
        return f"{called[0]} failed and the step still passed"
    return ""


ON_SCHEDULE = "github.event_name == 'schedule'"


def pull_request_jobs(workflow: dict) -> dict:
    """The workflow less the jobs that run only on its schedule (``if:`` on the event)."""
    jobs = {name: job for name, job in workflow["jobs"].items() if job.get("if") != ON_SCHEDULE}
    return {**workflow, "jobs": jobs}


def scheduled_jobs(workflow: dict) -> dict:
    """The jobs that run only on the workflow's schedule."""
    jobs = {name: job for name, job in workflow["jobs"].items() if job.get("if") == ON_SCHEDULE}
    return {**workflow, "jobs": jobs}


def load_workflow(path: Path) -> dict:
    # PyYAML reads the `on:` key as True (YAML 1.1); GitHub reads it as "on".
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))
    return data


def matrix_entries(name: str, job: dict) -> list[dict[str, str]]:
    """The job's matrix combinations: ``include`` entries only (the form this project uses)."""
    matrix = job.get("strategy", {}).get("matrix")
    if matrix is None:
        return [{}]
    if not isinstance(matrix, dict) or set(matrix) != {"include"}:
        raise AssertionError(f"job {name}: only strategy.matrix.include is understood here")
    return [{key: str(value) for key, value in entry.items()} for entry in matrix["include"]]


def fill(text: str, values: dict[str, str], where: str) -> str:
    def one(match: re.Match) -> str:
        if match.group(1) not in values:
            raise AssertionError(f"{where}: matrix.{match.group(1)} is not in the matrix entry")
        return values[match.group(1)]

    filled = MATRIX_VALUE.sub(one, str(text))
    if "${{" in filled:
        raise AssertionError(f"{where}: an expression other than matrix.* reaches pytest")
    return filled


def pytest_runs(workflow: dict) -> list[PytestRun]:
    """Every pytest invocation of every job, read by running the steps that name pytest."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="mnp-wf-") as tmp:
        shims = stand_ins(Path(tmp))
        for name, job in workflow["jobs"].items():
            if not any("pytest" in step.get("run", "") for step in job.get("steps", [])):
                continue
            for values in matrix_entries(name, job):
                variant = values.get("group", "-".join(values.values()))
                for step in job.get("steps", []):
                    if "pytest" in step.get("run", ""):
                        where = f"job {name} ({variant or 'no matrix'}), step {step.get('name')!r}"
                        env = {**job.get("env", {}), **step.get("env", {})}
                        env = {key: fill(value, values, where) for key, value in env.items()}
                        runs += [PytestRun(name, variant, args)
                                 for args in recorded(step["run"], env, shims, where)]
    return runs


def stand_ins(folder: Path) -> Path:
    for name in ("python", "python3", "pytest"):
        (folder / name).write_text(RECORDER.replace("{python}", sys.executable), encoding="utf-8")
    (folder / "sudo").write_text(SUDO, encoding="utf-8")
    for path in folder.iterdir():
        path.chmod(0o755)
    return folder


def recorded(script: str, env: dict[str, str], shims: Path, where: str) -> Iterator[tuple]:
    """Run ``script`` with only the stand-ins on PATH; the pytest argument lists it produced."""
    record = shims / "record.jsonl"
    record.write_text("", encoding="utf-8")
    proc = subprocess.run(["/bin/bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                          env={**env, "PATH": str(shims), "PYTEST_RECORD": str(record)},
                          capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode:
        raise AssertionError(f"{where}: its script cannot be followed ({proc.returncode}): "
                             f"{proc.stderr.strip()[-300:]}")
    lines = record.read_text(encoding="utf-8").splitlines()
    if not lines:
        raise AssertionError(f"{where}: names pytest but runs none")
    return (tuple(json.loads(line)) for line in lines)


# Every selection is collected by one Python process, one pytest session after the other, as
# pytester's in-process runs do: the test modules and conftests are imported once instead of once
# per selection, a third of the CPU of a process each. Each session still makes its own config,
# plugins, items and hook calls, so each selection is pytest's own.
COLLECTOR = """
import contextlib, io, json, sys
import pytest
for args in json.loads(sys.stdin.read()):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args])
    print(json.dumps([int(code), out.getvalue()]), flush=True)
"""


def collected(arg_lists: list[tuple[str, ...]]) -> list[set[str]]:
    """For each argument list, the node IDs ``pytest --collect-only -q ARGS`` selects (from the
    project root)."""
    proc = subprocess.run([sys.executable, "-c", COLLECTOR], input=json.dumps(arg_lists),
                          cwd=ROOT, capture_output=True, text=True, check=False)
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    if proc.returncode != 0 or len(answers) != len(arg_lists):
        raise AssertionError(f"the collector stopped (exit {proc.returncode}):\n"
                             f"{proc.stderr[-2000:]}")
    found = []
    for args, (code, output) in zip(arg_lists, answers):
        if code not in (0, 5):  # 5: the selection is empty, which is reported later
            raise AssertionError(f"pytest {' '.join(args)} does not collect:\n{output[-2000:]}")
        # node IDs only: the skip ledger's own lines ("declared skip not seen: tests/x.py::*")
        # name tests too
        found.append({line for line in output.splitlines()
                      if "::" in line and line.startswith(TEST_ROOTS)})
    return found


@functools.cache
def ci_collections() -> tuple[dict[PytestRun, set[str]], set[str]]:
    """What each pytest run of ci.yml selects (its pull-request jobs, then its scheduled ones,
    ``scheduled`` set), and what the whole suite collects, collected once per process: the
    workflow tests and the skip ledger's test both read them (one xdist group, so one worker)."""
    workflow = load_workflow(ROOT / ".github" / "workflows" / "ci.yml")
    pull_request = pytest_runs(pull_request_jobs(workflow))
    scheduled = [PytestRun(run.job, run.variant, run.args, scheduled=True)
                 for run in pytest_runs(scheduled_jobs(workflow))]
    runs = pull_request + scheduled
    *each, everything = collected([run.args for run in runs] + [()])
    return dict(zip(runs, each)), everything


def emulated_only(selected: dict[PytestRun, set[str]]) -> set[str]:
    """What the scheduled lane's run of the tests marked ``emulated`` selects (ci.yml's job
    emulated-arm64: the arm64 build under qemu, beyond a pull request's budget)."""
    def marker(args: tuple[str, ...]) -> str:
        return args[args.index("-m") + 1] if "-m" in args[:-1] else ""

    runs = [nodes for run, nodes in selected.items()
            if run.scheduled and marker(run.args) == "emulated"]
    if len(runs) != 1:
        raise AssertionError(f"expected one scheduled pytest run with -m emulated, found {len(runs)}")
    return runs[0]


def tree_modules() -> set[str]:
    """The test modules in the tree: pyproject's testpaths searched for its python_files."""
    options = _pytest_options()
    return {str(path.relative_to(ROOT))
            for folder in options["testpaths"] for pattern in options["python_files"]
            for path in (ROOT / folder).rglob(pattern)}


def _pytest_options() -> dict:
    import tomllib

    with (ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)["tool"]["pytest"]["ini_options"]


def uncovered(selected: dict[PytestRun, set[str]], everything: set[str],
              modules: set[str]) -> tuple[set[str], set[str]]:
    """Tests no run selects, and test modules none of whose tests any run selects."""
    union = set().union(*selected.values()) if selected else set()
    return everything - union, modules - {nodeid.split("::")[0] for nodeid in union}
