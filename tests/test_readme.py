"""README.md is a manual: at most 400 lines, its command table the one the tasks make, and every
command example in it runs, exactly as written.

The command table is what ``python -m matrix.cli.manual`` prints (:func:`matrix.cli.manual.table`,
made from the tasks' declarations), pasted between its two markers; this file only reads the
README and never rewrites it or any other tracked file.

The examples are the lines of the README's ``sh`` code blocks, and the complete commands quoted
inline outside the command table (`` `invoke stacks --values scheduler` ``; not the syntax lines
with placeholders such as ``S`` or ``[--all]``, nor the table's task names). Each is handed to
``bash -c`` verbatim (quotes, ``&&`` and trailing comments included), in the project root with
the project's virtual environment on PATH (as inside ``./dev``), and must exit 0. Examples that
need the built cpu-tcp image are marked ``docker`` and ``slow``. ``./dev invoke check`` runs the
whole suite, this file included, so it is not run from inside it: ``.ci/run`` runs exactly that
line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from entrypoint.schedulers import ORDER
from matrix.cli import manual
from tests.helpers import stacks_yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
STACKS = stacks_yaml()["stacks"]
BLOCK = re.compile(r"^(?P<indent>[ \t]*)```sh\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
CI_ONLY = "./dev invoke check"
CI_RUNS = (CI_ONLY, "invoke check")  # the whole suite: .ci/run runs it (the first, verbatim)


def examples() -> list[str]:
    found = []
    for block in BLOCK.finditer(README):
        for line in block.group("body").splitlines():
            command = line.strip()
            if command and not command.startswith("#"):
                found.append(command)
    return found


INLINE = re.compile(r"`((?:\./dev )?invoke [^`]*)`")
PLACEHOLDER = re.compile(r"\[|\.\.\.|\b[A-Z]+\b")


def outside_the_command_table(text: str) -> str:
    """The README without its generated command table, whose cells name tasks, not examples."""
    if manual.BEGIN not in text:
        return text
    before, rest = text.split(manual.BEGIN, 1)
    return before + rest.split(manual.END, 1)[-1]


def inline_examples() -> list[str]:
    """Complete inline commands: no placeholder (``S``, ``URI``), option list or ellipsis."""
    found = []
    for match in INLINE.finditer(outside_the_command_table(README)):
        command = match.group(1)
        if not PLACEHOLDER.search(command) and command not in found:
            found.append(command)
    return found


EXAMPLES = examples()
EXAMPLES += [e for e in inline_examples() if e not in {c.split("  #", 1)[0].strip() for c in EXAMPLES}]


def without_comment(command: str) -> str:
    """The command with a trailing ``# ...`` comment removed (none of them quotes a ``#``)."""
    return command.split("  #", 1)[0].strip()


def needs_image(command: str) -> bool:
    return any(f"invoke {verb}" in command for verb in ("build", "run", "test", "engine"))


def run(command: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("COLUMNS", None)
    return subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


README_DIGEST_URI = ("123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp-stacks@sha256:"
                     "2f1d3c0a5b7e9d8c6f4a2e0b1d3c5a7e9f8d6c4b2a0e1f3d5c7b9a8e6f4d2c0a")
# What each example must print, beyond exiting 0 (keyed by the command without its comment).
CHECKS: dict[str, Callable[[str], bool]] = {
    "invoke stacks --names": lambda out: out.split()[:2] == ["cpu-tcp", "cpu-mpi"],
    # the adapters a job is submitted to, in the entrypoint's detection order (its registry)
    "invoke stacks --values scheduler": lambda out: out.split() == [
        adapter.NAME for adapter in ORDER if adapter.SUBMITTED],
    # cpu-mpi's first five layers are cpu-tcp's; each stack adds its label-only layer.
    "invoke plan --stack cpu-tcp --stack cpu-mpi": lambda out: (
        f"{len(STACKS['cpu-tcp']['layers']) + len(STACKS['cpu-mpi']['layers']) + 2 - 5} layers "
        "for 2 stack(s), 5 shared") in out,
    "invoke plan --all --json": lambda out: json.loads(out)["stacks"] == list(STACKS)
                                            and all(layer["ref"] for layer in json.loads(out)["layers"]),
    "invoke render --all && invoke lint": lambda out: out.rstrip().endswith(
        "rendered Dockerfiles are fresh and pass hadolint"),
    "source completion/mnp-stacks.bash": lambda out: True,
    # mnp-stacks: the project's version; a team's file planned outside the checkout
    "mnp-stacks --version": lambda out: out == "mnp-stacks {}\n".format(re.search(
        r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)[1]),
    "mkdir -p /tmp/team && cp stacks.yaml /tmp/team/team-stacks.yaml && cd /tmp/team && mnp-stacks "
    "plan --stacks team-stacks.yaml --stack cpu-mpi":
        lambda out: f"{len(STACKS['cpu-mpi']['layers']) + 1} layers for 1 stack(s)" in out,
    "invoke stacks": lambda out: "cpu-tcp (default)" in out,
    "invoke matrix": lambda out: out.startswith('{"include":[{"stack":"cpu-tcp"'),
    "invoke build": lambda out: "cpu-tcp: mnp-stacks:cpu-tcp" in out,
    "invoke build --json": lambda out: '"mnp-stacks:cpu-tcp"' in out,
    "invoke test": lambda out: "cpu-tcp" in out,
    'invoke run --stack cpu-tcp --nodes 3 -- python3 -c "from mpi4py import MPI; '
    'c = MPI.COMM_WORLD; print(c.allreduce(1))"':
        # each rank's line as it printed it (issue 43: no --tag-output unless MNP_TAG_OUTPUT=1)
        lambda out: [line for line in out.splitlines() if line.strip() == "3"] == ["3"] * 3,
    "./dev invoke build --stack cpu-tcp --test": lambda out: "cpu-tcp: mnp-stacks:cpu-tcp" in out,
    # invoke k8s / invoke sbatch: the manifest and the script as written to stdout
    "invoke k8s --kind mpijob --stack cpu-tcp --nodes 2 --instance-type c5n.18xlarge --image-uri "
    f"{README_DIGEST_URI} --pvc fsx-pvc:/fsx -- python3 /fsx/train.py":
        lambda out: yaml.safe_load(out)["kind"] == "MPIJob" and "claimName: fsx-pvc" in out,
    "invoke sbatch --stack cpu-tcp --nodes 2 --instance-type c5n.18xlarge --image-uri "
    f"{README_DIGEST_URI} --mount /fsx:/fsx -- python3 /fsx/train.py":
        lambda out: "#SBATCH --nodes=2" in out and "--container-mounts=/fsx:/fsx" in out,
    # NCCL 2.20.5 (torch 2.3.1's wheel) understands the exact-match '=' form; 32 EFA on p5.
    "invoke explain --stack cuda12.1-efa --instance-type p5.48xlarge --nodes 4 -- python3 train.py":
        lambda out: "NCCL_SOCKET_IFNAME==eth0" in out and "uverbs31" in out
                    and " -np 32 " in out and out.rstrip().splitlines()[-1] != "",
}


def test_the_readme_examples_are_found():
    """The parser sees the examples this file is about (a README edit cannot hide them)."""
    assert "./dev invoke build --stack cpu-tcp --test   # build the default stack from nothing and " \
           "test every layer" in EXAMPLES
    assert any(without_comment(e) == CI_ONLY for e in EXAMPLES)
    assert any(e.startswith("invoke run --stack cpu-tcp --nodes 3 -- python3 -c \"from mpi4py")
               for e in EXAMPLES)
    assert "invoke stacks --values scheduler" in EXAMPLES
    assert "invoke build --stack S --test" not in EXAMPLES
    # the command table's cells name tasks; a bare `invoke jobdef` is no example to run
    assert "invoke jobdef" not in EXAMPLES and "invoke k8s" not in EXAMPLES
    unchecked = [e for e in EXAMPLES
                 if without_comment(e) not in CHECKS and without_comment(e) not in CI_RUNS]
    assert not unchecked, f"README examples without an expected output here: {unchecked}"
    stale = sorted(set(CHECKS) - {without_comment(e) for e in EXAMPLES})
    assert not stale, f"expected outputs of examples the README no longer has: {stale}"


README_MAX_LINES = 400  # a manual: task details are in --help, dated runs in docs/measurements.md
DOC_LINK = re.compile(r"\]\((docs/[^)#\s]+\.md)(?:#([^)\s]+))?\)")


def test_the_readme_is_a_manual_of_at_most_400_lines():
    """Task details live in each task's ``--help`` (made from the declarations), reference tables
    and run logs in docs/ (settings: docs/entrypoint.md; which CI job runs what:
    docs/workflows.md; dated runs: docs/measurements.md), so the README stays a manual."""
    lines = len(README.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}"


def test_the_command_table_is_the_one_the_tasks_make(monkeypatch):
    """The README holds ``python -m matrix.cli.manual``'s table verbatim (one row a task, its
    summary from the task's own declaration) and no other command table: a task added, renamed
    or re-described fails here until its printed table is pasted in. Read only: nothing is
    rewritten."""
    # tasks.py checks the command line of an invoke run at import; pytest's is none of its own
    monkeypatch.setattr(sys, "argv", ["test_readme"])
    table = manual.table()
    assert table in README, (
        "README.md's command table is not the one the tasks make: replace the lines from "
        f"{manual.BEGIN!r} to {manual.END!r} with the output of `python -m matrix.cli.manual`")
    assert README.count(manual.BEGIN) == 1 and README.count(manual.END) == 1
    assert README.count("| command |") == 1, "a second, hand-written command table"


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading: lower case, punctuation but ``-`` and ``_``
    dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_docs_link_in_the_readme_reaches_its_section():
    """What moved out of the README is one link away: each ``docs/*.md#anchor`` names a file
    and a heading that exist."""
    links = DOC_LINK.findall(README)
    assert ("docs/entrypoint.md", "settings") in links
    for path, fragment in links:
        doc = ROOT / path
        assert doc.is_file(), path
        if fragment:
            anchors = {github_anchor(line.lstrip("#")) for line in
                       doc.read_text(encoding="utf-8").splitlines() if line.startswith("#")}
            assert fragment in anchors, f"README.md links {path}#{fragment}: no such heading"


def test_ci_runs_the_readme_test_command_as_written():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f"exec {CI_ONLY}\n" in ci


FAST = [e for e in EXAMPLES if without_comment(e) not in CI_RUNS and not needs_image(e)]
WITH_IMAGE = [e for e in EXAMPLES if without_comment(e) not in CI_RUNS and needs_image(e)]
# The examples that run cpu-tcp's layer tests share a worker with tests/test_cpu_tcp.py's run of
# them: one after the other, the first runs them and the others are reported from its record
# (matrix/image/testing.py), instead of three runs of DeepSpeed's JIT build side by side.
LAYER_TESTS_GROUP = pytest.mark.xdist_group("cpu-tcp layer tests")


def with_image(command: str):  # noqa: ANN201 (a pytest parameter set)
    runs_layer_tests = re.search(r"invoke test\b|--test\b", without_comment(command))
    return pytest.param(command, marks=[LAYER_TESTS_GROUP] if runs_layer_tests else [])


def ids(commands: list[str]) -> list[str]:
    return [without_comment(c).split(" -- ")[0] for c in commands]


@pytest.mark.parametrize("command", FAST, ids=ids(FAST))
def test_example(command):
    proc = run(command, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert CHECKS[without_comment(command)](proc.stdout), proc.stdout[-3000:]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("command", [with_image(c) for c in WITH_IMAGE], ids=ids(WITH_IMAGE))
def test_example_with_the_cpu_tcp_image(command, cpu_tcp_image):
    proc = run(command)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert CHECKS[without_comment(command)](proc.stdout), proc.stdout[-3000:]
