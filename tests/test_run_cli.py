"""``invoke run``'s command line (issue 31): ``--env NAME=VALUE`` checked as the entrypoint checks
the same variables, one line and exit 2 on bad input, before Docker is asked anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from matrix.errors import UsageError
from matrix.jobs.rehearse import parse_env

ROOT = Path(__file__).resolve().parent.parent


def invoke_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "run", "--stack", "cpu-tcp", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("option", "names"), [
    ("MNP_HELTH=full", ["MNP_HELTH", "did you mean MNP_HEALTH"]),
    ("MNP_HEALTH=fast", ["MNP_HEALTH", "fast"]),
    ("MNP_RENDEZVOUS_PORT=70000", ["MNP_RENDEZVOUS_PORT"]),
    ("=x", ["--env", "NAME=VALUE"]),
    ("MNP_HEALTH", ["--env", "NAME=VALUE"]),
    ("AWS_BATCH_JOB_ATTEMPT=3", ["AWS_BATCH_JOB_ATTEMPT", "sets"]),
    ("MNP_SECRET=abc", ["MNP_SECRET", "sets"]),
])
def test_a_bad_env_option_is_one_line_and_exit_2(option, names):
    proc = invoke_run("--env", "MNP_LAUNCHER=none", "--env", option, "--", "true")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for name in names:
        assert name in lines[0], lines[0]


def test_good_env_options_are_the_nodes_environment():
    assert parse_env(["MNP_HEALTH=full", "DATA=/fsx/a=b", "EMPTY="], 3) == {
        "MNP_HEALTH": "full", "DATA": "/fsx/a=b", "EMPTY": ""}
    with pytest.raises(UsageError, match="MNP_NP"):
        parse_env(["MNP_NP=0"], 3)
