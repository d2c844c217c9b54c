"""What each job of a GitHub workflow hands to pytest, read by running the job's own script.

A job's pytest step is run by bash as the runner would (``bash -e``, the step's and job's
``env`` with ``${{ matrix.* }}`` filled from each ``strategy.matrix.include`` entry), but with a
PATH holding only stand-ins for ``python``, ``python3``, ``pytest`` and ``sudo``: the stand-in
records the arguments pytest would get and exits. Any other command in such a step fails the
reading (nothing else runs for real). Each recorded argument list is then collected for real
with ``pytest --collect-only -q``, so a job's selection is what pytest itself selects: paths,
``-m`` markers, ``--ignore``, ``-k``, and the conftests' own collection rules.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
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

    @property
    def label(self) -> str:
        return f"{self.job}[{self.variant}]" if self.variant else self.job


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


def collected(args: tuple[str, ...] | list[str]) -> set[str]:
    """The node IDs ``python -m pytest --collect-only -q ARGS`` selects (from the project root)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    if proc.returncode not in (0, 5):  # 5: the selection is empty, which is reported later
        raise AssertionError(f"pytest {' '.join(args)} does not collect:\n{proc.stdout[-2000:]}")
    return {line for line in proc.stdout.splitlines() if "::" in line}


def selections(runs: list[PytestRun]) -> dict[PytestRun, set[str]]:
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(runs, pool.map(lambda run: collected(run.args), runs)))


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
