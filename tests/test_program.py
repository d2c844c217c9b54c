"""``mnp-stacks``, the installed command (matrix/cli/program.py), as a team outside the checkout
runs it: the console script pip wrote into the virtual environment, in a real process, from a
temporary directory holding the team's own stacks file; and ``./dev`` with nothing to run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from matrix.errors import EXIT_CANNOT, EXIT_USAGE
from tests.helpers import stacks_yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COMMAND = BIN / "mnp-stacks"
STACKS = stacks_yaml()
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"),
                    re.M).group(1)


def env() -> dict[str, str]:
    """The environment of a shell with the virtual environment on PATH (``./dev``'s)."""
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "COLUMNS": "100"}


def run(*args: str, cwd: Path, command: Path | str = COMMAND,
        timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(command), *args], cwd=cwd, capture_output=True, text=True,
                          env=env(), timeout=timeout, check=False)


@pytest.fixture
def team(tmp_path: Path) -> Path:
    """A team's repository outside the checkout: the project's stacks file copied as is, and a
    team file of its own with one stack under the team's name."""
    directory = tmp_path / "team"
    directory.mkdir()
    shutil.copy(ROOT / "stacks.yaml", directory / "stacks.yaml")
    own = dict(STACKS, default_stack="team-tcp", stacks={"team-tcp": STACKS["stacks"]["cpu-tcp"]})
    (directory / "team-stacks.yaml").write_text(yaml.safe_dump(own, sort_keys=False),
                                                encoding="utf-8")
    assert ROOT not in directory.resolve().parents
    return directory


def test_the_console_script_is_installed():
    assert COMMAND.is_file() and os.access(COMMAND, os.X_OK), \
        f"{COMMAND} is missing: install the project (./dev true) after changing pyproject.toml"


def test_stacks_names_read_the_stacks_file_of_the_directory_it_runs_in(team):
    copied = run("stacks", "--names", cwd=team)
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout.split() == list(STACKS["stacks"])
    own = run("stacks", "--names", "--stacks", "./team-stacks.yaml", cwd=team)
    assert (own.returncode, own.stdout, own.stderr) == (0, "team-tcp\n", "")


def test_plan_json_from_outside_is_the_checkouts_plan(team):
    """The same tasks: the plan of the copied file names the same content-addressed layers as
    ``invoke plan`` inside the checkout."""
    outside = run("plan", "--json", "--stacks", "stacks.yaml", "--stack", "cpu-mpi", cwd=team)
    inside = run("plan", "--json", "--stack", "cpu-mpi", cwd=ROOT, command=BIN / "invoke")
    assert outside.returncode == 0 and inside.returncode == 0, outside.stderr + inside.stderr
    plan = json.loads(outside.stdout)
    assert plan["stacks"] == ["cpu-mpi"]
    refs = [layer["ref"] for layer in plan["layers"]]
    assert refs == [layer["ref"] for layer in json.loads(inside.stdout)["layers"]]
    assert len(refs) == len(STACKS["stacks"]["cpu-mpi"]["layers"]) + 1  # + the stack's label layer


def test_render_writes_next_to_the_team_file(team):
    proc = run("render", "--stacks", "team-stacks.yaml", cwd=team)
    assert proc.returncode == 0, proc.stderr
    written = sorted(p.name for p in (team / "generated" / "team-tcp").glob("*.Dockerfile"))
    assert len(written) == len(STACKS["stacks"]["cpu-tcp"]["layers"]) + 1, written


def test_the_same_tasks_as_invoke_in_the_checkout(team):
    def names(proc: subprocess.CompletedProcess) -> list[str]:
        assert proc.returncode == 0, proc.stderr
        return [task["name"] for task in json.loads(proc.stdout)["tasks"]]

    ours = names(run("--list", "--list-format=json", cwd=team))
    assert ours == names(run("--list", "--list-format=json", cwd=ROOT, command=BIN / "invoke"))
    assert {"build", "plan", "stacks", "jobdef", "run"} <= set(ours)


@pytest.mark.parametrize("args, line", [
    (["plan", "cpu-tcp"], "stacks are given with --stack: mnp-stacks plan --stack cpu-tcp"),
    (["plan", "--stack"], "--stack needs a value, e.g. mnp-stacks plan --stack cpu-tcp"),
    (["plann"], "no task named 'plann'; did you mean plan? (the tasks: mnp-stacks --list)"),
    (["matrix", "--json"], "mnp-stacks matrix has no option --json; --json is an option of: "),
    (["run", "--nodes", "2", "python3", "train.py"],
     "the command goes after --: mnp-stacks run --nodes 2 -- python3 train.py"),
    (["-c", "tasks", "plan"], "mnp-stacks has no option -c: it runs this project's tasks"),
], ids=["bare-stack", "no-value", "no-task", "no-option", "no-dashdash", "collection"])
def test_a_command_line_mistake_is_one_line_and_exit_2(team, args, line):
    proc = run(*args, cwd=team)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {line}"), proc.stderr


def test_a_missing_stacks_file_is_one_line_and_exit_1(tmp_path):
    proc = run("plan", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (EXIT_CANNOT, "")
    assert proc.stderr.splitlines() == ["error: stacks.yaml: file not found"], proc.stderr


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_is_the_projects(tmp_path, flag):
    assert metadata.version("mnp-stacks") == VERSION
    proc = run(flag, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"mnp-stacks {VERSION}\n", "")


def test_completion_completes_mnp_stacks_with_the_team_files_stacks(team):
    script = (f"source {ROOT / 'completion' / 'mnp-stacks.bash'}; complete -p mnp-stacks; "
              "COMP_WORDS=(mnp-stacks plan --stacks team-stacks.yaml --stack te); COMP_CWORD=5; "
              '_mnp_stacks_complete; echo "stack: ${COMPREPLY[*]}"; '
              "COMP_WORDS=(mnp-stacks pla); COMP_CWORD=1; "
              '_mnp_stacks_complete; echo "task: ${COMPREPLY[*]}"')
    proc = subprocess.run(["bash", "-c", script], cwd=team, capture_output=True, text=True,
                          env=env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["complete -o default -F _mnp_stacks_complete mnp-stacks",
                                        "stack: team-tcp", "task: plan"], proc.stdout


def test_dev_alone_says_what_to_type_and_exits_2(tmp_path):
    proc = subprocess.run([str(ROOT / "dev")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (EXIT_USAGE, "")
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("usage: ./dev COMMAND")


def test_an_install_without_the_checkout_says_so_in_one_line(tmp_path):
    """A real non-editable install (pip, the project built as a wheel, into a folder with no
    checkout around it): the tasks cannot run, and the command says why in one line; its version
    still prints. Building needs setuptools from PyPI, as ``./dev``'s own install does."""
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    for package in ("matrix", "entrypoint"):
        shutil.copytree(ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                              "--target", str(site), str(source)],
                             capture_output=True, text=True, timeout=600, check=False)
    assert install.returncode == 0, install.stderr[-3000:]
    environment = {**env(), "PYTHONPATH": str(site)}

    def installed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(site / "bin" / "mnp-stacks"), *args], cwd=tmp_path,
                              capture_output=True, text=True, env=environment, timeout=120,
                              check=False)

    proc = installed("stacks", "--names")
    assert (proc.returncode, proc.stdout) == (EXIT_CANNOT, ""), proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: the project's files are not at {site} (no tasks.py, images): the tasks run from "
        "a checkout; install it editable there: pip install -e CHECKOUT (./dev does)"]
    version = installed("--version")
    assert (version.returncode, version.stdout) == (0, f"mnp-stacks {VERSION}\n")


@pytest.mark.docker
@pytest.mark.slow
def test_build_from_outside_the_checkout(team, cpu_tcp_image):
    """``mnp-stacks build --stack S`` with the team's copy builds the checkout's layers: the
    content-addressed tags match, so every layer is the image already built."""
    proc = run("build", "--stack", "cpu-tcp", "--stacks", "stacks.yaml", cwd=team, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"cpu-tcp: mnp-stacks:cpu-tcp = {cpu_tcp_image}\n" in proc.stdout, proc.stdout[-3000:]
    layers = len(STACKS["stacks"]["cpu-tcp"]["layers"]) + 1  # + the stack's label layer
    assert f"0 layer(s) built, {layers} cached" in proc.stdout, proc.stdout[-3000:]
