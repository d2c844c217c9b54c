"""``invoke check``'s shards: together they run every collected test once, and the closing
line sums what each shard's pytest reported."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

from matrix.cli import suite
from matrix.model.settings import ROOT


def collected(*args: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    return {line for line in proc.stdout.splitlines() if "::" in line}


def test_the_shards_cover_the_suite_once():
    everything = collected()
    parts = [collected(*shard.args) for shard in suite.shards()]
    assert everything and all(parts)
    assert sum(len(part) for part in parts) == len(everything)
    assert set.union(*parts) == everything


def test_the_closing_line_sums_every_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "LOG_DIR", tmp_path)
    parts = [suite.Shard("a", []), suite.Shard("b", [])]
    parts[0].log.write_text("...\n= 1 failed, 30 passed, 2 skipped in 9.00s =\n")
    parts[1].log.write_text("x\n===== 12 passed, 1 error in 3.1s =====\n")
    assert suite.summed(parts) == "42 passed, 1 failed, 2 skipped, 1 errors"


def test_the_checks_before_pytest_audit_the_workflows():
    steps = dict(suite.static_steps())
    assert list(steps) == ["ruff", "lint", "zizmor", "workflow schema"]
    assert steps["zizmor"][1:] == ["--offline", "--no-progress", ".github/workflows"]
    assert "vendor.github-workflows" in steps["workflow schema"]


def test_skip_counts_sum_every_shards_ledger_line(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "LOG_DIR", tmp_path)
    parts = [suite.Shard("a", []), suite.Shard("b", [])]
    parts[0].log.write_text("skips: 74 (74 declared in expected_skips.yaml, 0 undeclared)\n")
    parts[1].log.write_text("x\nskips: 7 (5 declared in expected_skips.yaml, 2 undeclared)\n= 1 f\n")
    assert suite.skip_counts(parts) == (81, 2)


LEDGER = """\
- tests: "test_t.py::test_declared"
  reason: "no GPU"
  why: "the machine has none"
"""
TESTS = """\
import pytest
def test_runs(): pass
def test_declared(): pytest.skip("no GPU on this machine")
@pytest.mark.skipif(True, reason="no scontrol")
def test_undeclared(): pass
"""


def run_with_ledger(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """pytest with the skip ledger, as ``invoke check`` runs it, on a small test file."""
    (tmp_path / "test_t.py").write_text(TESTS)
    (tmp_path / "skips.yaml").write_text(LEDGER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run([sys.executable, "-m", "pytest", *suite.LEDGER_PLUGIN,
                           "--expected-skips", str(tmp_path / "skips.yaml"),
                           "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"),
                           str(tmp_path / "test_t.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, check=False)


def test_an_undeclared_skip_fails_the_run_and_is_named(tmp_path):
    proc = run_with_ledger(tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "UNDECLARED SKIP test_t.py::test_undeclared: no scontrol" in proc.stdout
    assert suite.SKIPS.search(proc.stdout).groups() == ("2", "1", "1")


def test_declared_skips_pass_and_are_counted(tmp_path):
    proc = run_with_ledger(tmp_path, "-k", "not undeclared")
    assert proc.returncode == 0, proc.stdout
    assert "skips: 1 (1 declared in skips.yaml, 0 undeclared)" in proc.stdout


def test_a_real_test_skipping_for_an_undeclared_reason_fails(tmp_path):
    """The project's own list and a project test: without scontrol on PATH the nodelist
    comparisons skip, and no entry of tests/expected_skips.yaml allows that."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    proc = subprocess.run([sys.executable, "-m", "pytest", *suite.LEDGER_PLUGIN, "-q",
                           "tests/entrypoint/test_ep_nodelist.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "UNDECLARED SKIP tests/entrypoint/test_ep_nodelist.py::" in proc.stdout
    assert "scontrol is not installed" in proc.stdout


def test_a_malformed_ledger_is_one_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("- tests: x\n  reason: y\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", *suite.LEDGER_PLUGIN,
                           "--expected-skips", str(tmp_path / "bad.yaml"), "--collect-only", "-q",
                           "tests/test_suite.py"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 4
    assert "bad.yaml: entry 0: expected exactly the keys tests, reason and why" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_declared_skip_names_collected_tests():
    """An entry of tests/expected_skips.yaml whose glob matches no test is stale."""
    from tests import skip_ledger

    everything = collected()
    for entry in skip_ledger.load(skip_ledger.LEDGER):
        assert any(fnmatch.fnmatchcase(nodeid, entry.tests) for nodeid in everything), entry.tests
