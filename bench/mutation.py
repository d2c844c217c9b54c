"""Mutation testing of the entrypoint's decisions with cosmic-ray (slow: not part of CI).

Scope (issue 27): the scheduler adapters (``entrypoint/schedulers/``), the launcher units
(``entrypoint/launchers/``), the plan's environment table (``plan/envtable.py``, ``plan/env.py``)
and the lifecycle (``run/lifecycle.py``: signals, exit status).

Method:

- cosmic-ray mutates the files on disk, so each module is mutated in its own scratch copy of the
  checkout (``.mnp/mutation/work/``): the checkout itself is never touched;
- the test command is the module's fast unit tests only (``SCOPE`` below: the files of
  ``tests/entrypoint/`` that exercise it), ``pytest -x``, run by the project's ``.venv`` python;
  a mutant whose run exceeds ``TIMEOUT`` s counts as killed (cosmic-ray's rule);
- operators: cosmic-ray's whole set, except that a binary, comparison or unary operator site is
  not replaced by every other operator of its kind (11 mutants for each ``+`` or ``%``). Each site
  gets the replacements that say something (``KEEP_BINARY``, ``KEEP_COMPARISON``: negation and
  the boundary neighbours, unary: removal); the rest of cosmic-ray's cross product is filtered
  out with its own ``operators-filter`` before the run. No line of code is excluded;
- score = killed / (killed + survived) over the mutants that ran, per module and in total;
  ``.mnp/mutation/report.txt`` lists each survivor with its diff.

Usage: ``python bench/mutation.py`` (every module), ``--module plan/envtable.py`` (one; may be
repeated), ``--report`` (only summarise the sessions already run). cosmic-ray itself is installed
in ``.mnp/mutation/venv`` (pinned below) on first use; the tests run in the project's ``.venv``
(``./dev true`` creates it).
"""

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".mnp" / "mutation"
VENV = STATE / "venv"
COSMIC_RAY = "cosmic-ray==8.7.0"
TIMEOUT = 60.0

COMMON = ["tests/entrypoint/test_ep_units.py"]
SCHEDULER_TESTS = ["tests/entrypoint/test_ep_schedulers.py", "tests/entrypoint/test_ep_sched_plan.py",
                   "tests/entrypoint/test_ep_mutants_schedulers.py"]
LAUNCHER_TESTS = ["tests/entrypoint/test_ep_launch.py", "tests/entrypoint/test_ep_plan.py",
                  "tests/entrypoint/test_ep_mutants_launchers.py"]
ENV_TESTS = ["tests/entrypoint/test_ep_plan.py", "tests/entrypoint/test_ep_preflight.py",
             "tests/entrypoint/test_ep_config.py", "tests/entrypoint/test_ep_mutants_env.py"]
# module -> the unit tests that exercise it (the test command of its session)
SCOPE = {
    "schedulers/__init__.py": SCHEDULER_TESTS,
    "schedulers/base.py": SCHEDULER_TESTS + ["tests/entrypoint/test_ep_config.py"],
    "schedulers/batch.py": SCHEDULER_TESTS,
    "schedulers/mpijob.py": SCHEDULER_TESTS,
    "schedulers/nodelist.py": ["tests/entrypoint/test_ep_nodelist.py"] + SCHEDULER_TESTS,
    "schedulers/pytorchjob.py": SCHEDULER_TESTS,
    "schedulers/rank.py": SCHEDULER_TESTS,
    "schedulers/single.py": SCHEDULER_TESTS,
    "schedulers/slurm.py": SCHEDULER_TESTS,
    "schedulers/torchenv.py": SCHEDULER_TESTS,
    "schedulers/trainjob.py": SCHEDULER_TESTS,
    "launchers/__init__.py": LAUNCHER_TESTS,
    "launchers/base.py": LAUNCHER_TESTS,
    "launchers/deepspeed.py": LAUNCHER_TESTS,
    "launchers/distributed_launch.py": LAUNCHER_TESTS,
    "launchers/mca.py": LAUNCHER_TESTS + ["tests/entrypoint/test_ep_issue12.py"],
    "launchers/mpi.py": LAUNCHER_TESTS,
    "launchers/mpirun.py": LAUNCHER_TESTS,
    "launchers/none.py": LAUNCHER_TESTS,
    "launchers/torchrun.py": LAUNCHER_TESTS,
    "plan/envtable.py": ENV_TESTS,
    "plan/env.py": ENV_TESTS + ["tests/entrypoint/test_ep_facts.py"],
    "run/lifecycle.py": ["tests/entrypoint/test_ep_lifecycle.py",
                         "tests/entrypoint/test_ep_mutants_lifecycle.py"],
}

# One replacement per binary operator site, the negation and boundary neighbours per comparison.
KEEP_BINARY = {"Add": "Sub", "Sub": "Add", "Mul": "Div", "Div": "Mul", "FloorDiv": "Div",
               "Mod": "Add", "Pow": "Mul", "LShift": "RShift", "RShift": "LShift",
               "BitAnd": "BitOr", "BitOr": "BitAnd", "BitXor": "BitOr"}
KEEP_COMPARISON = {"Eq": ("NotEq",), "NotEq": ("Eq",), "Lt": ("LtE", "GtE"),
                   "LtE": ("Lt", "Gt"), "Gt": ("GtE", "LtE"), "GtE": ("Gt", "Lt"),
                   "Is": ("IsNot",), "IsNot": ("Is",), "In": ("NotIn",), "NotIn": ("In",)}
COPIED = ("entrypoint", "tests", "pyproject.toml", "docs", "images/entrypoint")


def kept(operator):
    """Whether an operator of cosmic-ray's set is part of our run (see the module's doc)."""
    name = operator.split("/", 1)[-1]
    match = re.match(r"ReplaceBinaryOperator_([A-Za-z]+?)_([A-Za-z]+)$", name)
    if match:
        return KEEP_BINARY.get(match.group(1)) == match.group(2)
    match = re.match(r"ReplaceComparisonOperator_([A-Za-z]+?)_([A-Za-z]+)$", name)
    if match:
        return match.group(2) in KEEP_COMPARISON.get(match.group(1), ())
    match = re.match(r"ReplaceUnaryOperator_([A-Za-z]+?)_([A-Za-z]+)$", name)
    if match:
        return match.group(1) == "Delete"
    return True


def ensure_venv():
    cosmic = VENV / "bin" / "cosmic-ray"
    if not cosmic.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", COSMIC_RAY], check=True)
    return VENV / "bin"


def scratch_copy(module):
    work = STATE / "work" / module.replace("/", "-").replace(".py", "")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for name in COPIED:
        source = ROOT / name
        target = work / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return work


def write_config(work, module):
    python = ROOT / ".venv" / "bin" / "python"
    tests = " ".join(t for t in SCOPE[module] if (ROOT / t).exists())
    command = (f"{python} -m pytest -x -q -p no:cacheprovider -p no:randomly -o addopts= {tests}")
    operators = sorted({op for op in list_operators() if not kept(op)})
    config = work / "cosmic-ray.toml"
    config.write_text("\n".join([
        "[cosmic-ray]",
        f'module-path = "entrypoint/{module}"',
        f"timeout = {TIMEOUT}",
        "excluded-modules = []",
        f"test-command = {json.dumps(command)}",
        "[cosmic-ray.distributor]",
        'name = "local"',
        "[cosmic-ray.filters.operators-filter]",
        "exclude-operators = " + json.dumps([f"^{re.escape(op)}$" for op in operators]),
        "",
    ]))
    return config


_OPERATORS = []


def list_operators():
    if not _OPERATORS:
        out = subprocess.run([str(VENV / "bin" / "cosmic-ray"), "operators"], check=True,
                             capture_output=True, text=True).stdout
        _OPERATORS.extend(line.strip() for line in out.splitlines() if line.strip())
    return _OPERATORS


def run_module(module):
    bin_dir = ensure_venv()
    work = scratch_copy(module)
    config = write_config(work, module)
    session = session_file(module)
    if session.exists():
        session.unlink()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    steps = [[str(bin_dir / "cosmic-ray"), "init", str(config), str(session)],
             [str(bin_dir / "cr-filter-operators"), str(session), str(config)],
             [str(bin_dir / "cosmic-ray"), "baseline", str(config)],
             [str(bin_dir / "cosmic-ray"), "exec", str(config), str(session)]]
    for step in steps:
        proc = subprocess.run(step, cwd=str(work), env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tool = Path(step[0]).name + " " + step[1]
            sys.exit(f"bench/mutation.py: {tool} failed for {module}:\n"
                     f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    print(f"{module:32s} {summary_line(session)} ({time.monotonic() - started:.0f} s)", flush=True)


def session_file(module):
    return STATE / (module.replace("/", "-").replace(".py", "") + ".sqlite")


def outcomes(session):
    """``[(operator, occurrence, job_id, outcome, diff)]`` for the mutants that ran."""
    db = sqlite3.connect(str(session))
    rows = db.execute(
        "select s.operator_name, s.occurrence, s.start_pos_row, r.job_id, r.test_outcome, r.diff "
        "from mutation_specs s join work_results r on r.job_id = s.job_id "
        "where r.worker_outcome = 'NORMAL'").fetchall()
    db.close()
    return rows


def counts(session):
    killed = survived = 0
    for row in outcomes(session):
        if row[4] == "SURVIVED":
            survived += 1
        else:
            killed += 1
    return killed, survived


def summary_line(session):
    killed, survived = counts(session)
    total = killed + survived
    score = 100.0 * killed / total if total else 0.0
    return f"{total:4d} mutants, {killed:4d} killed, {survived:3d} survived: {score:5.1f}%"


def report():
    lines = []
    all_killed = all_survived = 0
    for module in SCOPE:
        session = session_file(module)
        if not session.exists():
            lines.append(f"{module:32s} (not run)")
            continue
        killed, survived = counts(session)
        all_killed += killed
        all_survived += survived
        lines.append(f"{module:32s} {summary_line(session)}")
    total = all_killed + all_survived
    if total:
        score = 100.0 * all_killed / total
        lines.append(f"{'total':32s} {total:4d} mutants, {all_killed:4d} killed, "
                     f"{all_survived:3d} survived: {score:5.1f}%")
    text = "\n".join(lines)
    details = []
    for module in SCOPE:
        session = session_file(module)
        if session.exists():
            for operator, _, row, job, outcome, diff in outcomes(session):
                if outcome == "SURVIVED":
                    details.append(f"== {module} line {row + 1} {operator} ({job})\n{diff}")
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / "report.txt").write_text(text + "\n\n" + "\n".join(details))
    print(text)
    print("survivors with their diffs: %s" % (STATE / "report.txt"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--module", action="append", choices=sorted(SCOPE),
                        help="a module under entrypoint/ (repeatable); default: all")
    parser.add_argument("--report", action="store_true", help="only summarise earlier runs")
    args = parser.parse_args(argv)
    if not (ROOT / ".venv" / "bin" / "python").exists():
        sys.exit("bench/mutation.py: no .venv; run ./dev true first")
    if not args.report:
        for module in args.module or list(SCOPE):
            run_module(module)
    report()


if __name__ == "__main__":
    main()
