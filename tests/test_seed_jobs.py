"""The seed jobs, replayed: ``docs/seed-jobs.md`` is parsed and each row of its tables is an
assertion on the plan ``invoke explain`` computes for that job. The doc and the test cannot
drift: a row that does not hold, or that the parser cannot read, fails here."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from matrix.deploy.explain import explain
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "seed-jobs.md"
MATRIX = load_matrix(ROOT / "stacks.yaml")
EXPLAIN_LINE = re.compile(r"^explain: `invoke explain (.+)`$")
TICKED = re.compile(r"`([^`]+)`")


@dataclass
class Job:
    title: str
    args: list[str]
    rows: list[tuple[str, list[str]]] = field(default_factory=list)  # (seed cell, assertions)
    prose: str = ""  # the section's text between its title and the explain line


def parse_doc(text: str) -> list[Job]:
    jobs: list[Job] = []
    title = ""
    prose: list[str] = []
    for line in text.splitlines():
        if line.startswith("## "):
            title, prose = line[3:].strip(), []
            continue
        match = EXPLAIN_LINE.match(line)
        if match:
            jobs.append(Job(title, shlex.split(match.group(1)), prose=" ".join(prose)))
            continue
        prose.append(line)
        if jobs and line.startswith("| ") and not line.startswith(("| seed setting", "|---")):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            assert len(cells) == 3, f"{jobs[-1].title}: a row needs 3 cells: {line}"
            assertions = TICKED.findall(cells[1])
            assert assertions, f"{jobs[-1].title}: no backticked assertion in: {line}"
            jobs[-1].rows.append((cells[0], assertions))
    return jobs


def run_explain(args: list[str]):
    options, command = args, []
    if "--" in args:
        cut = args.index("--")
        options, command = args[:cut], args[cut + 1:]
    values = dict(zip(options[::2], options[1::2]))
    assert set(values) <= {"--stack", "--instance-type", "--nodes", "--launcher", "--scheduler",
                           "--rdzv"}, values
    scheduler = values.get("--scheduler", "batch")
    return explain(MATRIX, values["--stack"], values["--instance-type"], int(values["--nodes"]),
                   values.get("--launcher", "mpirun" if scheduler == "batch" else None), command,
                   scheduler=scheduler, rdzv=values.get("--rdzv")).plan


def check(plan, assertion: str) -> None:
    """One assertion of the doc's grammar (see docs/seed-jobs.md)."""
    env = plan.environment
    argv = " ".join(plan.argv or [])
    for prefix, actual in (("argv: ", argv),):
        if assertion.startswith(prefix):
            assert assertion[len(prefix):] in actual, f"{assertion!r} not in {actual!r}"
            return
    simple = {"launcher": plan.launcher["unit"], "runner": plan.launcher.get("runner"),
              "fabric": plan.fabric["kind"], "slots": str(plan.slots["count"]),
              "efa devices": str(len(plan.facts["efa_devices"])),
              "scheduler": plan.role.get("scheduler"), "role": plan.role["mode"]}
    key, sep, value = assertion.partition(": ")
    if sep and key in simple:
        assert simple[key] == value, f"{assertion!r}: found {simple[key]!r}"
        return
    if assertion.startswith("file "):
        path, _, line = assertion[5:].partition(": ")
        files = {f["path"]: f["content"].splitlines() for f in plan.files}
        assert path in files, f"{assertion!r}: plan writes {sorted(files)}"
        assert line in files[path], f"{assertion!r}: {files[path]}"
        return
    if assertion.endswith(" unset"):
        name = assertion[:-6]
        assert name not in env, f"{name} is set to {env.get(name)!r}"
        return
    if " has " in assertion:
        name, _, text = assertion.partition(" has ")
        assert text in env.get(name, ""), f"{assertion!r}: {env.get(name)!r}"
        return
    name, sep, value = assertion.partition("=")
    assert sep and re.match(r"^[A-Z_][A-Z0-9_]*$", name), f"cannot read assertion {assertion!r}"
    assert plan.value(name) == value and env.get(name) == value, (
        f"{assertion!r}: the plan sets {plan.value(name)!r}")


JOBS = parse_doc(DOC.read_text(encoding="utf-8"))


def test_the_doc_lists_every_seed_job():
    titles = " ".join(job.title for job in JOBS)
    for needed in ("p3dn.24xlarge, nccl-tests over EFA", "EKS", "AWS Batch MNP", "TCP",
                   "BERT / fairseq", "DL1"):
        assert needed in titles, needed
    assert all(len(job.rows) >= 5 for job in JOBS), [(j.title, len(j.rows)) for j in JOBS]


@pytest.mark.parametrize("job", JOBS, ids=[j.title.split(".")[0] for j in JOBS])
def test_seed_job(job):
    plan = run_explain(job.args)
    assert plan.problems == [], plan.problems
    failures = []
    for seed, assertions in job.rows:
        for assertion in assertions:
            try:
                check(plan, assertion)
            except AssertionError as exc:
                failures.append(f"[{seed}] {exc}")
    assert not failures, "\n".join(failures)


def test_the_checker_can_fail():
    """Each assertion form rejects a wrong value (a test that cannot fail proves nothing)."""
    plan = run_explain(JOBS[0].args)
    for wrong in ("NCCL_SOCKET_IFNAME==eth0", "FI_PROVIDER=efa", "NCCL_SOCKET_IFNAME unset",
                  "argv: -np 17", "launcher: deepspeed", "fabric: tcp", "slots: 4",
                  "efa devices: 2", "LD_LIBRARY_PATH has /nowhere", "file /x: A=b",
                  "not an assertion"):
        with pytest.raises(AssertionError):
            check(plan, wrong)


def _command(job: Job) -> list[str]:
    return job.args[job.args.index("--") + 1:] if "--" in job.args else []


def test_nccl_tests_commands_name_a_binary_the_stack_installs():
    """Issue 16 item 11: a job that runs nccl-tests names the path the stack's nccl-tests layer
    installs (its options.prefix/bin, on PATH, as the rendered Dockerfile copies it), or says
    that its stack has no nccl-tests layer."""
    runs = [job for job in JOBS if _command(job) and _command(job)[0].endswith("_perf")]
    assert runs, "no seed job runs nccl-tests"
    for job in runs:
        binary = _command(job)[0]
        name = binary.rsplit("/", 1)[-1]
        stack_name = job.args[job.args.index("--stack") + 1]
        layer = MATRIX.stack(stack_name).layer("nccl-tests")
        if layer is None:
            assert f"`{stack_name}` stack has no nccl-tests layer" in job.prose, job.title
            continue
        bindir = f"{layer.spec['options']['prefix']}/bin"
        assert binary in (name, f"{bindir}/{name}"), f"{job.title}: {binary} is not in {bindir}"
        dockerfile = next((ROOT / "images" / "generated" / stack_name).glob("*-nccl-tests.Dockerfile"))
        text = dockerfile.read_text(encoding="utf-8")
        assert f"ENV PATH={bindir}:$PATH" in text and f"test -x {bindir}/all_reduce_perf" in text
