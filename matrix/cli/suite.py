"""``invoke check``: the whole test suite as CI runs it (ruff, lint, workflow checks, pytest).

The suite waits more than it computes (image builds that download, containers that start,
timeouts that must expire), so on a 2-core machine two pytest processes side by side finish well
before one would. ``HEAVY`` splits it by file: the CUDA stack's build and layer tests, the
10,000-file fuzz, the pyxis play and the elastic torchrun cluster run in one process, everything
else in the other (measured: about 18 and 33 minutes before the last two moved over). Each
shard's output goes to ``.mnp/check/<shard>.log`` and is printed whole when it ends, so the two
never interleave; the last line is the sum of both in pytest's words, which is what CI reads.
With ``--pytest ARGS`` the suite runs as one pytest process with exactly those arguments.

Before pytest, the GitHub workflows go through zizmor (offline audits: unpinned actions,
persisted credentials, template injection, ...) and the GitHub-workflow schema that
check-jsonschema carries. Every pytest process loads ``tests/skip_ledger.py``: a skip that
``tests/expected_skips.yaml`` does not declare fails the check, and the skip count is printed.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from matrix.errors import UserError
from matrix.model.settings import ROOT

LOG_DIR = ROOT / ".mnp" / "check"
# Test files that run in the "heavy" shard; the other shard runs every other test.
HEAVY = ("tests/test_cuda_tcp.py", "tests/test_malformed.py", "tests/integration/test_slurm_pyxis.py",
         "tests/integration/test_elastic_cluster.py")
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
# The skip ledger's summary line (tests/skip_ledger.py).
SKIPS = re.compile(r"^skips: (\d+) \((\d+) declared in \S+, (\d+) undeclared\)$", re.MULTILINE)
LEDGER_PLUGIN = ["-p", "tests.skip_ledger"]
WORKFLOWS = ".github/workflows"


@dataclass
class Shard:
    name: str
    args: list[str]
    log: Path = field(init=False)
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ended: float = 0.0

    def __post_init__(self) -> None:
        self.log = LOG_DIR / f"{self.name}.log"


def shards() -> list[Shard]:
    rest = [arg for path in HEAVY for arg in ("--ignore", path)]
    return [Shard("heavy", [*HEAVY]), Shard("rest", ["tests", "images", *rest])]


def check(pytest_args: str) -> None:
    """The whole suite: ruff, rendered-files freshness + hadolint, the workflows' audits, then
    pytest (real engine) with undeclared skips failing it."""
    from matrix.image import engine

    engine.ensure_system_tools()
    engine.ensure()
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
        run_shards(pytest, shards())


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


def run_shards(pytest: list[str], parts: list[Shard]) -> None:
    """Start every shard, print each one's log as it ends, then the summed counts."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    for shard in parts:
        command = [*pytest, "--durations=15", *shard.args]
        print(f"== pytest ({shard.name}): {' '.join(command)}  > {shard.log}", flush=True)
        with shard.log.open("w", encoding="utf-8") as log:
            shard.started = time.monotonic()
            shard.proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    pending = list(parts)
    while pending:
        for shard in list(pending):
            if shard.proc is not None and shard.proc.poll() is not None:
                shard.ended = time.monotonic()
                pending.remove(shard)
                print(f"== pytest ({shard.name}) ended with {shard.proc.returncode} after "
                      f"{shard.ended - shard.started:.0f} s:", flush=True)
                sys.stdout.write(shard.log.read_text(encoding="utf-8", errors="replace"))
                sys.stdout.flush()
        time.sleep(1)
    failed = [shard.name for shard in parts if shard.proc is None or shard.proc.returncode]
    total, undeclared = skip_counts(parts)
    if not failed:
        print("== all checks passed")
    print(f"== skips: {total}, {undeclared} of them undeclared (tests/expected_skips.yaml)")
    print(f"check: {summed(parts)}", flush=True)  # last: the line CI reads
    if failed:
        because = f"; {undeclared} undeclared skips (UNDECLARED SKIP lines)" if undeclared else ""
        raise UserError(f"check failed at step pytest (shard {', '.join(failed)}{because}; logs "
                        f"in {LOG_DIR.relative_to(ROOT)}/)")


def skip_counts(parts: list[Shard]) -> tuple[int, int]:
    """All skips and the undeclared ones, summed over the shards' skip-ledger lines."""
    total = undeclared = 0
    for shard in parts:
        text = shard.log.read_text(encoding="utf-8", errors="replace") if shard.log.exists() else ""
        for count, _, missing in SKIPS.findall(text):
            total, undeclared = total + int(count), undeclared + int(missing)
    return total, undeclared


def summed(parts: list[Shard]) -> str:
    """'N passed, N failed, N skipped' over every shard's closing line."""
    totals = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for shard in parts:
        lines = shard.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        closing = lines[-1] if lines else ""
        for count, word in COUNTS.findall(closing):
            key = "errors" if word.startswith("error") else word
            if key in totals:
                totals[key] += int(count)
    text = f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped"
    return text + (f", {totals['errors']} errors" if totals["errors"] else "")
