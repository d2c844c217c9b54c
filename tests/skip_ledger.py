"""A pytest plugin that fails the run when a test skips without being declared.

``invoke check`` loads it (``-p tests.skip_ledger``): every skip is matched against
``tests/expected_skips.yaml`` (``--expected-skips`` names another list), the summary prints the
count, and a skip no entry declares turns the exit status to 1. Without the plugin a skipped test
is a green line in a long log; the Docker engine missing or a tool not installed would go
unnoticed.

Under pytest-xdist the ledger lives in the controller only: every worker's test reports reach the
controller's ``pytest_runtest_logreport``, so the skips of all workers are counted together and
the summary line is printed once. ``--dist loadgroup`` appends ``@<group>`` to each node ID;
the ledger matches the node ID without it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

LEDGER = Path(__file__).resolve().parent / "expected_skips.yaml"
KEYS = {"tests", "reason", "why"}


@dataclass(frozen=True)
class Expected:
    tests: str
    reason: str
    why: str


@dataclass
class Skip:
    nodeid: str
    reason: str


def plain_nodeid(nodeid: str) -> str:
    """The node ID without the ``@<group>`` xdist's loadgroup appends (a parameter id such as
    ``[user@host]`` ends in ``]`` and is kept)."""
    head, at, group = nodeid.rpartition("@")
    return head if at and "[" not in group and "]" not in group else nodeid


def load(path: Path) -> list[Expected]:
    """The declared skips; a malformed list is a usage error naming the file and entry."""
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise pytest.UsageError(f"{path}: cannot read the expected skips: {exc}") from None
    if not isinstance(entries, list):
        raise pytest.UsageError(f"{path}: expected a list of {{tests, reason, why}} entries")
    declared = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != KEYS or not all(
                isinstance(entry[key], str) and entry[key].strip() for key in KEYS):
            raise pytest.UsageError(f"{path}: entry {index}: expected exactly the keys tests, "
                                    "reason and why, each a non-empty string")
        declared.append(Expected(entry["tests"], entry["reason"], entry["why"]))
    return declared


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skip gave (``pytest.skip(...)`` or a skip/skipif marker)."""
    longrepr = report.longrepr
    # a tuple (path, line, reason); from an xdist worker it may arrive as a list
    text = longrepr[2] if isinstance(longrepr, (tuple, list)) else str(longrepr)
    return text.removeprefix("Skipped: ")


@dataclass(eq=False)  # pluggy keeps plugins in sets: hashed by identity
class Ledger:
    path: Path
    declared: list[Expected]
    skips: list[Skip] = field(default_factory=list)

    def matches(self, skip: Skip) -> Expected | None:
        return next((entry for entry in self.declared
                     if fnmatch.fnmatchcase(skip.nodeid, entry.tests)
                     and entry.reason in skip.reason), None)

    def undeclared(self) -> list[Skip]:
        return [skip for skip in self.skips if self.matches(skip) is None]

    def unused(self) -> list[Expected]:
        used = {self.matches(skip) for skip in self.skips}
        return [entry for entry in self.declared if entry not in used]

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append(Skip(plain_nodeid(report.nodeid), skip_reason(report)))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.undeclared() and session.exitstatus in (pytest.ExitCode.OK,
                                                        pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        undeclared = self.undeclared()
        for skip in undeclared:
            terminalreporter.write_line(f"UNDECLARED SKIP {skip.nodeid}: {skip.reason}", red=True)
        for entry in self.unused():
            terminalreporter.write_line(f"declared skip not seen: {entry.tests} ({entry.reason})")
        # suite.py reads this line: keep its words.
        terminalreporter.write_line(
            f"skips: {len(self.skips)} ({len(self.skips) - len(undeclared)} declared in "
            f"{self.path.name}, {len(undeclared)} undeclared)", red=bool(undeclared))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--expected-skips", default=str(LEDGER),
                     help="YAML list of the skips allowed (tests/expected_skips.yaml)")


def pytest_configure(config: pytest.Config) -> None:
    path = Path(config.getoption("--expected-skips"))
    if hasattr(config, "workerinput"):  # an xdist worker: the controller keeps the ledger
        return
    config.pluginmanager.register(Ledger(path, load(path)), "mnp-skip-ledger")
