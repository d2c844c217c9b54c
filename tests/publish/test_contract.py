"""Issue 32: every artefact works as generated. For every writer the registry finds
(``matrix.jobs.writers``: Batch job definition, Slurm script, Kubeflow manifest), every stack of
stacks.yaml, one instance type per family and every variant the writer declares (each launcher
and option it accepts), each role its writer derives from the artefact itself (``Writer.roles``)
gets the entrypoint's own dry-run plan (``matrix.jobs.contract``): it must show no PROBLEM and no
failing health check. A writer may refuse a combination (one line, nothing written): then there
is no artefact to hold to the contract. Also per job: a launcher that reaches the other nodes
over SSH (mpirun, deepspeed) is started by one role at most, never by every node alone, and a
PyTorchJob's replicas use a restart policy whose retries the training-operator counts.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import launchers
from matrix.cli.jobtasks import refuse_stops
from matrix.errors import UserError
from matrix.jobs import contract, roles, spec, writers
from matrix.jobs.explain import IMAGE_URI
from matrix.jobs.request import JobRequest
from matrix.jobs.writer import Prepared, Variant, Writer
from tests.helpers import project_matrix
from tests.toy_modules import TOY_SCHEDULER, TOY_UNIT

ROOT = Path(__file__).resolve().parents[2]
MATRIX = project_matrix()
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/x@sha256:" + "d" * 64
NODES = 2
PROGRAM = ["python3", "train.py"]
SSH_LAUNCHERS = ("mpirun", "mpiexec", "deepspeed", "horovodrun")


def one_per_family(instances: tuple[str, ...]) -> list[str]:
    """The first instance type of each family (``p5``, ``p5en``, ``g6e``, ...) a stack lists."""
    seen: dict[str, str] = {}
    for name in instances:
        seen.setdefault(name.split(".")[0], name)
    return list(seen.values())


PAIRS = [(stack, itype) for stack, entry in MATRIX.stacks.items()
         for itype in one_per_family(entry.instances)]
COMMANDS = {"program": PROGRAM, "launcher command": ["mpirun", *PROGRAM]}


def generate(writer: Writer, variant: Variant, stack: str, itype: str,
             command: list[str]) -> object:
    """What the writer's task writes, through the checks it makes before writing (its own
    options, the pair, the plan of each role of the artefact, the job spec's).
    UserError: refused."""
    entry = MATRIX.stack(stack)
    writer.check(variant.launcher, NODES, command, variant.options)
    spec.check_pair(entry, itype, writer.scheduler_name)
    # the scheduler explain names the job by (a Kubeflow kind, else the writer's one)
    scheduler = (variant.scheduler if variant.scheduler in writer.schedulers
                 else writer.schedulers[0])
    job = JobRequest(writer, scheduler, MATRIX, entry, itype, NODES, tuple(command),
                     Prepared(variant.launcher, variant.options, spec.DEFAULT_ATTEMPTS,
                              (1, NODES) if variant.elastic else None))
    refuse_stops(job)  # the task's refusal of a plan that stops a role at start
    return job.render(IMAGE)


def artefact_failures(artefact: object) -> list[str]:
    """What is wrong with an artefact as a whole: a PyTorchJob's replicas must use a restart
    policy whose retries the training-operator counts against backoffLimit."""
    if not isinstance(artefact, dict) or artefact.get("kind") != "PyTorchJob":
        return []
    policies = {r["restartPolicy"] for r in artefact["spec"]["pytorchReplicaSpecs"].values()}
    if policies <= {"Never", "OnFailure"}:
        return []
    return [f"restartPolicy {sorted(policies)}: retries the operator never counts against "
            "backoffLimit"]


def contract_failures(stack: str, itype: str) -> tuple[dict[str, int], list[str]]:
    """Every registered writer's every variant of the job of ``stack`` on ``itype``: how many
    artefacts each writer wrote (by task), and what breaks the contract."""
    failures = []
    accepted: dict[str, int] = {}
    for writer in writers.all_writers():
        accepted.setdefault(writer.task, 0)
        for variant in writer.variants():
            for what, command in COMMANDS.items():
                if what != "program" and variant.launcher != launchers.AS_IS:
                    continue  # a launcher command with a launcher: refused, tested elsewhere
                try:
                    artefact = generate(writer, variant, stack, itype, command)
                except UserError:
                    continue  # refused in one line, nothing written: no artefact to hold
                accepted[writer.task] += 1
                found = artefact_failures(artefact) + check_job(stack, writer.roles(artefact))
                failures.extend(f"{writer.task} {variant.name} ({what}): {line}"
                                for line in found)
    return accepted, failures


def check_job(stack: str, derived: list[roles.Role]) -> list[str]:
    """Each role's stops, and a job whose every node starts an SSH launcher alone."""
    found = []
    starters = 0
    for role in derived:
        plan = contract.plan_role(MATRIX, MATRIX.stack(stack), role)
        found.extend(f"{role.name}: {line}" for line in plan.stops())
        if plan.argv and Path(plan.argv[0]).name in SSH_LAUNCHERS:
            starters += 1
    if starters > 1:
        found.append(f"{starters} roles each start an SSH launcher of their own")
    return found


@pytest.mark.parametrize(("stack", "itype"), PAIRS, ids=[f"{s}@{i}" for s, i in PAIRS])
def test_every_role_of_every_artefact_plans_without_a_problem(stack, itype):
    accepted, failures = contract_failures(stack, itype)
    assert any(accepted.values()), "every writer refused every launcher"
    assert failures == [], "\n".join(failures)


def writer_modules() -> dict[str, Path]:
    """Each registered writer's module and its file (from the registry, not a list here)."""
    found = {}
    for writer in writers.all_writers():
        name = type(writer).__module__
        found[name] = Path(sys.modules[name].__file__)
    return found


def imports_of(path: Path) -> set[str]:
    """The modules (and ``module.name``s) a file imports, at any depth."""
    tree = ast.parse(path.read_text())
    found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    found |= {f"{node.module}.{alias.name}" for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) for alias in node.names}
    found |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
              for alias in node.names}
    return found


def test_no_writer_imports_another():
    """Each writer renders the job spec from the shared room (spec.py, writer.py, roles.py,
    mounts.py, crds.py): adding a scheduler is one writer module with its role derivation."""
    modules = writer_modules()
    assert {"matrix.jobs.jobdef", "matrix.jobs.sbatch", "matrix.jobs.k8s"} <= set(modules)
    for name, path in modules.items():
        assert not imports_of(path) & (set(modules) - {name}), name


def test_nothing_in_the_jobs_room_names_a_writer():
    """explain, the contract, the spec and the registry reach the writers through the registry
    only: no module of matrix/jobs/ but a writer's own imports a writer module."""
    modules = writer_modules()
    for path in sorted((ROOT / "matrix" / "jobs").glob("*.py")):
        if f"matrix.jobs.{path.stem}" not in modules:
            assert not imports_of(path) & set(modules), path.name


# A fourth scheduler: the toy adapter (tests/toy_modules.py, one entrypoint module) and this
# writer (one matrix/jobs/ module): a JSON job file the toy scheduler starts one container per
# node from, giving each TOY_RANK, TOY_SIZE and the main node's address.
TOY_WRITER = '''"""A toy scheduler's job file: the image, nodes, environment, devices and command."""
from __future__ import annotations

import json
from typing import Any

from entrypoint.launchers import NAMES
from matrix.jobs.roles import Devices, Role
from matrix.jobs.runopts import RunOpts
from matrix.jobs.spec import JobSpec
from matrix.jobs.writer import Prepared, Variant, Writer


class ToyWriter(Writer):
    task = "toyjob"
    summary = "Toy scheduler's job file"
    file_name = "toy.json"
    scheduler_name = "the toy scheduler"
    schedulers = ("toy",)
    what = "the job file's command"

    def run_options(self) -> RunOpts:
        return RunOpts()  # the job's options alone

    def prepare(self, values: dict[str, Any]) -> Prepared:
        return Prepared(values["launcher"], None, values["attempts"])

    def variants(self) -> tuple[Variant, ...]:
        return tuple(Variant(name, name, None, "toy") for name in NAMES)

    def check(self, launcher: str, nodes: int, command: Any, options: Any) -> None:
        """Nothing of its own."""

    def render(self, spec: JobSpec, options: Any = None) -> dict[str, Any]:
        efa = spec.instance.efa_interfaces if spec.effective_fabric == "efa" else 0
        return {"image": spec.image_uri, "nodes": spec.nodes, "instance": spec.instance.name,
                "env": spec.environment(), "command": list(spec.command),
                "devices": [spec.instance.gpus, spec.instance.hpus, efa]}

    def text(self, artefact: dict[str, Any]) -> str:
        return json.dumps(artefact, indent=2)

    def roles(self, artefact: dict[str, Any]) -> list[Role]:
        size = artefact["nodes"]
        return [Role(f"toy node {rank}", dict(artefact["env"], TOY_RANK=str(rank),
                                              TOY_SIZE=str(size), TOY_MAIN="10.0.0.1"),
                     list(artefact["command"]), Devices(*artefact["devices"]),
                     artefact["instance"])
                for rank in sorted({0, size - 1})]


WRITER = ToyWriter()
'''
# In the copy: the contract over one pair, and which modules the writer checks cover.
CONTRACT_IN_COPY = """
import json
from tests.publish import test_contract as c
accepted, failures = c.contract_failures("cpu-tcp", "c5n.18xlarge")
c.test_no_writer_imports_another()
c.test_nothing_in_the_jobs_room_names_a_writer()
print(json.dumps({"accepted": accepted, "failures": failures, "modules": sorted(c.writer_modules())}))
"""


def test_a_fourth_writer_is_one_module_that_explain_and_the_contract_take_up(tmp_path):
    """In a copy of the tracked files with only the toy adapter and the toy writer added (one
    module each), ``invoke explain --scheduler toy`` derives its roles from the toy writer's
    artefact and the contract holds that writer's every variant to it; the real tree has no toy
    writer."""
    for name in filter(None, subprocess.run(["git", "ls-files", "-z"], cwd=ROOT,
                                            capture_output=True, check=True)
                       .stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / "entrypoint/schedulers/toy.py").write_text(TOY_SCHEDULER, encoding="utf-8")
    (tmp_path / "matrix/jobs/toyjob.py").write_text(TOY_WRITER, encoding="utf-8")
    (tmp_path / "entrypoint/launchers/toy.py").write_text(TOY_UNIT, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))

    def invoke_in_copy(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)

    # the writer's task, its --help and its options appear from its declarations
    listed = invoke_in_copy("--list")
    assert "toyjob" in listed.stdout and "Toy scheduler's job file" in listed.stdout, listed
    helped = invoke_in_copy("--help", "toyjob")
    assert "--instance-type" in helped.stdout and "(required)" in helped.stdout, helped
    values = invoke_in_copy("stacks", "--values", "launcher")
    assert "toy" in values.stdout.split(), values
    wrote = invoke_in_copy("toyjob", "--nodes", "2", "--instance-type", "c5n.18xlarge",
                           "--launcher", "toy", "--image-uri", IMAGE_URI, "--", "python3",
                           "train.py")
    assert wrote.returncode == 0, wrote.stderr[-2000:]
    assert json.loads(wrote.stdout)["env"]["MNP_LAUNCHER"] == "toy"
    explained = subprocess.run(
        [sys.executable, "-m", "invoke", "explain", "--scheduler", "toy", "--stack", "cpu-tcp",
         "--instance-type", "c5n.18xlarge", "--nodes", "2", "--", "python3", "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert explained.returncode == 0, explained.stderr[-2000:]
    assert "each role of what invoke toyjob writes" in explained.stdout
    assert "=== toy node 0:" in explained.stdout and "=== toy node 1:" in explained.stdout
    ran = subprocess.run([sys.executable, "-c", CONTRACT_IN_COPY], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    found = json.loads(ran.stdout.splitlines()[-1])
    assert found["accepted"]["toyjob"] > 0 and found["failures"] == [], found
    assert "matrix.jobs.toyjob" in found["modules"]
    assert "toyjob" not in {writer.task for writer in writers.all_writers()}


def test_every_notice_reaches_each_artefact_and_batch_tags_hold_only_tag_characters():
    """A CUDA stack's minimum driver (issue 33) is in what every writer renders, and the Batch
    tag keeps to the characters AWS tags allow."""
    import re

    from matrix.jobs import spec
    from matrix.jobs.request import notices_for
    from matrix.model.drivers import driver_floor

    matrix = MATRIX
    stack = matrix.stacks["cuda12.1-efa"]
    notices = notices_for(stack)
    assert notices == [driver_floor(stack).line()] and "525.60.13" in notices[0]
    tags = spec.batch_tags(notices)
    assert all(re.fullmatch(r"[A-Za-z0-9 +\-=._:/@]{0,256}", value) for value in tags.values())
    assert "at least 525.60.13" in tags["mnp:notice-1"]
    assert notices_for(matrix.stacks["cpu-tcp"]) == []
