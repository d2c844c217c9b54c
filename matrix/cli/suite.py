"""``invoke check``: the whole test suite as CI runs it (ruff, lint, workflow checks, pytest).

The suite waits more than it computes (image builds that download, containers that start,
timeouts that must expire), so pytest runs with pytest-xdist's workers, more of them than the
machine has cores (``WORKERS``; ``MNP_CHECK_WORKERS`` sets another number, 0 runs one process).
``--dist loadgroup`` keeps the tests of one ``xdist_group`` on one worker: tests/conftest.py
gives every test its file as its group unless the test names another, so a module's fixtures
(a Slurm cluster, a second engine, a built CUDA stack) are set up once, in one worker, and a new
test file is safe by default; it also hands the groups out longest first. Session-wide images
are built once behind a file lock (tests/conftest.py). pytest's output is printed as it comes
and kept in
``.mnp/check/pytest.log``, its junit report in ``.mnp/check/junit.xml`` (``bench/suite_time.py``
reads both); the last line is pytest's count, which is what CI reads.
With ``--pytest ARGS`` the suite runs as one pytest process with exactly those arguments.

Before pytest, the GitHub workflows go through zizmor (offline audits: unpinned actions,
persisted credentials, template injection, ...) and the GitHub-workflow schema that
check-jsonschema carries. Every pytest process loads ``tests/skip_ledger.py``: a skip that
``tests/expected_skips.yaml`` does not declare fails the check, and the skip count is printed
(under xdist the ledger runs in the controller, which sees every worker's reports).
"""

from __future__ import annotations

import codecs
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import TextIO

from matrix.errors import UserError
from matrix.model.settings import ROOT

LOG_DIR = ROOT / ".mnp" / "check"
# Measured on the project's 2-core machine (README, "Tests"): 4 workers finish well before 2.
WORKERS = 4
WORKERS_VARIABLE = "MNP_CHECK_WORKERS"
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
# The skip ledger's summary line (tests/skip_ledger.py).
SKIPS = re.compile(r"^skips: (\d+) \((\d+) declared in \S+, (\d+) undeclared\)$", re.MULTILINE)
LEDGER_PLUGIN = ["-p", "tests.skip_ledger"]
WORKFLOWS = ".github/workflows"
TEST_PATHS = ["tests", "images"]


def check(pytest_args: str) -> None:
    """The whole suite: ruff, rendered-files freshness + hadolint, the workflows' audits, then
    pytest (real engine) with undeclared skips failing it."""
    from matrix.image import engine

    count = workers()  # before prepare_environment takes the variable away
    engine.ensure_system_tools()
    engine.ensure()
    prepare_environment(os.environ)  # for pytest and every process the tests start
    for name, command in static_steps():
        print(f"== {name}: {' '.join(command)}", flush=True)
        if subprocess.run(command, cwd=ROOT, check=False).returncode:
            raise UserError(f"check failed at step {name}")
    pytest = [sys.executable, "-m", "pytest", *LEDGER_PLUGIN]
    if pytest_args:
        command = [*pytest, *shlex.split(pytest_args)]
        print(f"== pytest: {' '.join(command)}", flush=True)
        code = subprocess.run(command, cwd=ROOT, check=False).returncode
        if code:
            raise UserError("check failed at step pytest (an undeclared skip fails it too: "
                            "see the UNDECLARED SKIP lines)")
        print("== all checks passed")
    else:
        run_suite([*pytest, *suite_args(count)])


# Stops Python writing the bytecode it compiles; some shells and CI images set it. Under it, every
# pytest process rewrites and compiles every test module again (pytest caches its assertion
# rewrite as bytecode) and every command the tests start compiles the project again: about 8 of
# the 11 s one collection of the suite took here, once per worker and per inner pytest run.
NO_BYTECODE = "PYTHONDONTWRITEBYTECODE"


# pytest writes into a pipe here (run_suite keeps its log), which Python would buffer in 8 KiB
# blocks: minutes with nothing in CI's log, and a run stopped by CI's time limit would lose them.
UNBUFFERED = "PYTHONUNBUFFERED"


def prepare_environment(environ: MutableMapping[str, str]) -> None:
    """Bytecode caching on (``NO_BYTECODE`` removed: the caches land in ``__pycache__``
    folders, which git ignores), output unbuffered (``UNBUFFERED``), and ``WORKERS_VARIABLE``
    gone once read: the tests start entrypoints with the suite's environment, and the entrypoint
    refuses an ``MNP_*`` variable that is none of its settings (exit 2), so with it set 8 tests
    failed."""
    environ.pop(NO_BYTECODE, None)
    environ.pop(WORKERS_VARIABLE, None)
    environ[UNBUFFERED] = "1"


def workers() -> int:
    """``WORKERS``, or ``MNP_CHECK_WORKERS`` when set (a whole number; 0: no workers)."""
    text = os.environ.get(WORKERS_VARIABLE, "").strip()
    if not text:
        return WORKERS
    if not text.isdigit():
        raise UserError(f"{WORKERS_VARIABLE}={text!r}: expected a whole number of pytest workers "
                        "(0 runs one process)")
    return int(text)


def parallel_args(count: int) -> list[str]:
    """pytest-xdist's arguments for ``count`` workers (none for 0). Groups go out in the order
    tests/conftest.py sorts them (longest first): by default xdist would reorder them by their
    number of tests (pytest-xdist 3.5.0 changelog, #632; ``--no-loadscope-reorder`` since 3.8.0,
    #1083: https://github.com/pytest-dev/pytest-xdist/blob/master/CHANGELOG.rst)."""
    return ["-n", str(count), "--dist", "loadgroup", "--no-loadscope-reorder"] if count else []


def suite_args(count: int) -> list[str]:
    """pytest's arguments for the whole suite with ``count`` xdist workers."""
    return [*parallel_args(count), "--durations=0", "--durations-min=1.0",
            f"--junitxml={(LOG_DIR / 'junit.xml').relative_to(ROOT)}", *TEST_PATHS]


def static_steps() -> list[tuple[str, list[str]]]:
    """The checks before pytest, each a command of the virtual environment's tools."""
    bin_dir = Path(sys.executable).parent
    workflows = sorted(str(path.relative_to(ROOT)) for path in (ROOT / WORKFLOWS).glob("*.yml"))
    steps = [("ruff", ["ruff", "check", "."]),
             ("lint", ["invoke", "lint"]),
             ("zizmor", ["zizmor", "--offline", "--no-progress", WORKFLOWS]),
             ("workflow schema", ["check-jsonschema", "--builtin-schema",
                                  "vendor.github-workflows", *workflows])]
    for name, command in steps:
        if not (bin_dir / command[0]).exists():
            raise UserError(f"check needs {command[0]} in {bin_dir} for step {name}: "
                            "pip install -e '.[dev]' (./dev does)")
    return [(name, [str(bin_dir / command[0]), *command[1:]]) for name, command in steps]


def run_suite(command: list[str], log_dir: Path = LOG_DIR) -> None:
    """Run pytest, printing its output as it comes and keeping it in ``log_dir/pytest.log``
    (``.mnp/check``); then the skips and pytest's counts (the last line)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "pytest.log"
    print(f"== pytest: {' '.join(command)}  (log: {_shown(log_path)})", flush=True)
    started = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        _pass_through(proc.stdout.fileno(), log)
        code = proc.wait()
    sys.stdout.flush()
    text = log_path.read_text(encoding="utf-8", errors="replace")
    total, undeclared = skip_counts(text)
    print(f"== pytest ended with {code} after {time.monotonic() - started:.0f} s")
    if not code:
        print("== all checks passed")
    print(f"== skips: {total}, {undeclared} of them undeclared (tests/expected_skips.yaml)")
    print(f"check: {summed(text)}", flush=True)  # last: the line CI reads
    if code:
        because = f"; {undeclared} undeclared skips (UNDECLARED SKIP lines)" if undeclared else ""
        raise UserError(f"check failed at step pytest (exit {code}{because}; log in "
                        f"{_shown(log_path)})")


def _pass_through(fd: int, log: TextIO) -> None:
    """Copy what pytest writes to our stdout and the log as it arrives, not line by line:
    pytest's progress is a dot per test on a line of 72, so reading whole lines left CI's log
    (and tee) without a sign of life for minutes while slow tests ran; and a run stopped by a
    time limit keeps everything it had printed."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        chunk = os.read(fd, 65536)
        text = decoder.decode(chunk, final=not chunk)
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            log.write(text)
            log.flush()
        if not chunk:
            return


def _shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies inside it (the log's usual place)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def skip_counts(text: str) -> tuple[int, int]:
    """All skips and the undeclared ones, from the skip ledger's line(s) in pytest's output."""
    total = undeclared = 0
    for count, _, missing in SKIPS.findall(text):
        total, undeclared = total + int(count), undeclared + int(missing)
    return total, undeclared


def summed(text: str) -> str:
    """'N passed, N failed, N skipped' from pytest's closing line."""
    totals = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    lines = text.strip().splitlines()
    closing = lines[-1] if lines else ""
    for count, word in COUNTS.findall(closing):
        key = "errors" if word.startswith("error") else word
        if key in totals:
            totals[key] += int(count)
    text = f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped"
    return text + (f", {totals['errors']} errors" if totals["errors"] else "")
