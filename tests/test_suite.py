"""``invoke check``: pytest in xdist workers with a test's file as its default group, the skip
ledger counting every worker's skips, and the closing line read from pytest's own."""

from __future__ import annotations

import fnmatch
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from matrix.cli import suite
from matrix.errors import UserError
from matrix.model.settings import ROOT


def test_the_suite_runs_in_xdist_workers_grouped(monkeypatch):
    monkeypatch.delenv(suite.WORKERS_VARIABLE, raising=False)
    args = suite.suite_args(suite.workers())
    assert args[:5] == ["-n", str(suite.WORKERS), "--dist", "loadgroup", "--no-loadscope-reorder"]
    assert (os.cpu_count() or 2) // 2 < suite.WORKERS  # more workers than the suite computes
    assert args[-2:] == ["tests", "images"] and any(a.startswith("--junitxml=") for a in args)
    assert "-n" not in suite.suite_args(0)


def test_the_number_of_workers_is_checked(monkeypatch):
    monkeypatch.setenv(suite.WORKERS_VARIABLE, "3")
    assert suite.workers() == 3
    monkeypatch.setenv(suite.WORKERS_VARIABLE, "four")
    with pytest.raises(UserError, match=r"^MNP_CHECK_WORKERS='four': expected a whole number"):
        suite.workers()


def test_the_suite_caches_bytecode_and_prints_as_it_goes_whatever_the_shell_says():
    environment = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}
    suite.prepare_environment(environment)
    assert environment == {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}


def test_the_workers_variable_never_reaches_an_entrypoint_the_tests_start():
    """MNP_CHECK_WORKERS=5 ./dev invoke check failed 8 entrypoint tests: the entrypoint refuses
    an MNP_* variable that is none of its settings, and the tests start it with the suite's
    environment."""
    environment = {suite.WORKERS_VARIABLE: "5", "PATH": "/bin"}
    suite.prepare_environment(environment)
    assert suite.WORKERS_VARIABLE not in environment
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "true"], cwd=ROOT,
                          env={**os.environ, "MNP_DRY_RUN": "1",
                               suite.WORKERS_VARIABLE: "5"}, capture_output=True, text=True)
    assert proc.returncode == 2 and suite.WORKERS_VARIABLE in proc.stderr  # why it must go


PARTIAL_LINE = ("import sys, time; sys.stdout.write('..'); sys.stdout.flush(); time.sleep(60); "
                "print('unreached')")


def test_output_reaches_ci_as_it_comes_not_a_line_at_a_time(tmp_path):
    """pytest's dots fill a line of 72 only after 72 tests: what has arrived of a line is
    printed (and logged) at once, so a slow test never leaves CI's log silent for minutes."""
    code = (f"from pathlib import Path; from matrix.cli import suite; "
            f"suite.run_suite([{sys.executable!r}, '-c', {PARTIAL_LINE!r}], Path({str(tmp_path)!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        seen, deadline = b"", time.monotonic() + 30
        while b"\n.." not in seen and time.monotonic() < deadline:
            seen += proc.stdout.read() or b""
            time.sleep(0.1)
        assert b"\n.." in seen, seen  # the two dots, long before the child's line ends
        assert (tmp_path / "pytest.log").read_text() == ".."
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_closing_line_is_pytests_count():
    text = "...\n== 1 failed, 30 passed, 2 skipped, 1 error in 9.00s ==\n"
    assert suite.summed(text) == "30 passed, 1 failed, 2 skipped, 1 errors"
    assert suite.summed("") == "0 passed, 0 failed, 0 skipped"


def test_the_checks_before_pytest_audit_the_workflows():
    steps = dict(suite.static_steps())
    assert list(steps) == ["ruff", "lint", "zizmor", "workflow schema"]
    assert steps["zizmor"][1:] == ["--offline", "--no-progress", ".github/workflows"]
    assert "vendor.github-workflows" in steps["workflow schema"]


def test_skip_counts_read_the_ledger_line():
    text = "x\nskips: 7 (5 declared in expected_skips.yaml, 2 undeclared)\n= 1 failed =\n"
    assert suite.skip_counts(text) == (7, 2)


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


def test_under_xdist_the_ledger_counts_every_workers_skips_once(tmp_path):
    """Two workers: the undeclared skip still fails the run, named with its plain node ID, and
    one summary line counts the skips of both."""
    proc = run_with_ledger(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert proc.returncode == 1, proc.stdout
    assert "UNDECLARED SKIP test_t.py::test_undeclared: no scontrol" in proc.stdout
    assert len(suite.SKIPS.findall(proc.stdout)) == 1
    assert suite.SKIPS.search(proc.stdout).groups() == ("2", "1", "1")
    proc = run_with_ledger(tmp_path, "-n", "2", "-k", "not undeclared")
    assert proc.returncode == 0, proc.stdout
    assert "skips: 1 (1 declared in skips.yaml, 0 undeclared)" in proc.stdout


GROUPED = """\
import pytest
@pytest.mark.parametrize("n", range(6))
def test_one(n):
    pass
"""


def test_a_files_tests_share_one_worker_by_default(tmp_path):
    """tests/conftest.py groups an unmarked test by its file: the six tests of each of two files
    run under ``--dist loadgroup`` in one worker per file, so a module-scoped fixture is set up
    once. Without the grouping (or with a pytest whose node IDs drop xdist's group suffix,
    pytest-xdist issue 1386) xdist hands them out one by one, to both workers."""
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(GROUPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2",
                           "--dist", "loadgroup", "-v", "--rootdir", str(tmp_path),
                           "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        if " PASSED " in line and line.startswith("["):
            worker, nodeid = line.split()[0], line.split()[-1]
            workers.setdefault(nodeid.split("::")[0].rsplit("/", 1)[-1], set()).add(worker)
    assert set(workers) == {"test_a.py", "test_b.py"}, proc.stdout[-3000:]
    assert all(len(seen) == 1 for seen in workers.values()), workers


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


# In the workflow tests' group: the whole suite's collection is made there anyway.
@pytest.mark.xdist_group("tests/publish/test_workflows.py")
def test_every_declared_skip_names_collected_tests():
    """An entry of tests/expected_skips.yaml whose glob matches no test is stale."""
    from tests import skip_ledger, workflow_jobs

    _, everything = workflow_jobs.ci_collections()
    for entry in skip_ledger.load(skip_ledger.LEDGER):
        assert any(fnmatch.fnmatchcase(nodeid, entry.tests) for nodeid in everything), entry.tests


TIMED = """\
import time, pytest
@pytest.mark.xdist_group("shared")
def test_grouped():
    time.sleep(0.5)
def test_alone():
    pass
"""


def test_the_suite_time_benchmark_reads_files_and_groups_from_a_real_run(tmp_path):
    """bench/suite_time.py on the junit report of a two-worker run: per file, per group."""
    import importlib.util

    (tmp_path / "test_timed.py").write_text(TIMED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    junit, log = tmp_path / "junit.xml", tmp_path / "pytest.log"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2",
                           "--dist", "loadgroup", f"--junitxml={junit}", "--rootdir",
                           str(tmp_path), "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:]
    log.write_text(proc.stdout)
    spec = importlib.util.spec_from_file_location("suite_time", ROOT / "bench" / "suite_time.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    text = module.report(junit, log, top=10)
    groups = text.split("per xdist group")[1]
    assert "shared" in groups and "test_timed.py" in groups, text
    grouped = next(line for line in groups.splitlines() if line.endswith("  shared"))
    assert float(grouped.split()[0]) >= 0.5, text
    assert "2 tests," in text and "pytest's wall time:" in text
    from tests import suite_groups

    kept = tmp_path / "group_seconds.json"  # what --write-groups records, read back as ordered
    suite_groups.record(suite_groups.cases(junit), "a two-worker run", kept)
    assert set(suite_groups.recorded(kept)) == {"shared", "test_timed.py"}


class _Item:
    """What the ordering hook reads of a collected test."""

    def __init__(self, nodeid: str, slow: bool = False) -> None:
        self.nodeid = nodeid
        self._marks = {"slow": pytest.mark.slow.mark} if slow else {}

    def get_closest_marker(self, name: str):
        return self._marks.get(name)


def test_groups_are_ordered_longest_first_and_the_cuda_layer_tests_lead_without_a_last_run(
        monkeypatch):
    """Longest first by the recorded seconds, a last run's seconds over them; a group neither
    run nor recorded is the longest when it has a slow test. Without a last run (a clean clone)
    the CUDA stack's layer tests lead, then the emulated arm64 build: on a fresh machine their
    workers build those stacks from nothing. Another group that needs the build keeps its place
    by its seconds, rather than holding a second worker at the build's lock."""
    from tests import conftest, suite_groups

    monkeypatch.setattr(conftest, "FROM_NOTHING_FIRST", ("tests/b.py", "tests/e.py"))

    def order(recorded: dict[str, float], last: dict[str, float]) -> list[str]:
        monkeypatch.setattr(suite_groups, "recorded", lambda: recorded)
        monkeypatch.setattr(suite_groups, "last_run", lambda: last)
        items = [_Item("tests/a.py::t", slow=True), _Item("tests/c.py::t"),
                 _Item("tests/b.py::t", slow=True), _Item("tests/d.py::t"),
                 _Item("tests/e.py::t")]
        conftest.pytest_collection_modifyitems(None, items)
        return [item.nodeid.split("::")[0].removeprefix("tests/") for item in items]

    assert order({}, {}) == ["b.py", "e.py", "a.py", "c.py", "d.py"]
    assert order({"tests/c.py": 5.0, "tests/d.py": 50.0}, {}) == [
        "b.py", "e.py", "a.py", "d.py", "c.py"]
    recorded = {"tests/a.py": 90.0, "tests/b.py": 8.0, "tests/c.py": 5.0, "tests/d.py": 50.0,
                "tests/e.py": 20.0}
    assert order(recorded, {}) == ["b.py", "e.py", "a.py", "d.py", "c.py"]
    assert order(recorded, {"tests/c.py": 200.0}) == ["c.py", "a.py", "d.py", "e.py", "b.py"]


def test_the_leading_groups_are_the_cuda_layer_tests_and_the_emulated_build_as_collected():
    """tests/conftest.py's leading groups are the groups those tests really carry: the CUDA
    layer tests' mark, and the emulated tests' file."""
    from tests import conftest, test_cpu_tcp_arm64, test_cuda_tcp

    mark = test_cuda_tcp.test_every_layer_test_passes.pytestmark
    assert [m.args[0] for m in mark if m.name == "xdist_group"] == [conftest.CUDA_LAYER_TESTS]
    assert conftest.FROM_NOTHING_FIRST == (conftest.CUDA_LAYER_TESTS, conftest.EMULATED_BUILD)
    assert test_cpu_tcp_arm64.__file__.endswith(conftest.EMULATED_BUILD)
    assert not hasattr(test_cpu_tcp_arm64, "pytestmark") or not any(
        m.name == "xdist_group" for m in test_cpu_tcp_arm64.pytestmark)


ORDERED = {
    "test_many.py": "import pytest\n@pytest.mark.parametrize('n', range(5))\n"
                    "def test_many(n):\n    pass\n",
    "test_one.py": "import pytest\n@pytest.mark.slow\ndef test_one():\n    pass\n",
}


def test_xdist_hands_the_groups_out_in_the_suites_order(tmp_path):
    """One worker runs the groups in the order it is handed them. The suite's order puts the
    file with the slow test first; with the suite's xdist arguments that is what runs first.
    Without ``--no-loadscope-reorder``, xdist runs the file with more tests first."""
    for name, text in ORDERED.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: long\n")

    def first_run(*parallel: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", *parallel,
                               "-v", "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"),
                               str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0, proc.stdout[-3000:]
        first = next(line for line in proc.stdout.splitlines() if " PASSED " in line)
        return first.split()[-1].rsplit("/", 1)[-1]

    assert first_run(*suite.parallel_args(1)).startswith("test_one.py::"), "suite's order lost"
    assert first_run("-n", "1", "--dist", "loadgroup").startswith("test_many.py::")


BURNS = """\
import subprocess, sys
def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                    "while time.process_time() - t < 0.5: pass"], check=True)
def test_idle():
    pass
"""


def test_the_suite_cpu_benchmark_counts_a_groups_children(tmp_path, capfd):
    """bench/suite_cpu.py on a one-worker run: the file whose test burns 0.5 s of CPU in a child
    process is reported with at least that much, under the worker's children."""
    import importlib.util

    (tmp_path / "test_burn.py").write_text(BURNS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    spec = importlib.util.spec_from_file_location("suite_cpu", ROOT / "bench" / "suite_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = module.main(["--", "-p", "tests.conftest", "-n", "1", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"),
                        str(tmp_path)])
    out = capfd.readouterr().out
    assert code == 0, out[-2000:]
    line = next(line for line in out.splitlines() if line.endswith("test_burn.py"))
    children = float(line.split("children")[1].split(")")[0])
    assert children >= 0.45, line
    assert "2 tests" in line and "machine CPU busy" in out, out[-2000:]
