"""Issue 32: every artefact works as generated. For every writer (Batch job definition, Slurm
script, Kubeflow manifest), every stack of stacks.yaml, one instance type per family and every
launcher the writer accepts, each role derived from the artefact itself (``matrix.jobs.roles``)
gets the entrypoint's own dry-run plan (``matrix.jobs.contract``): it must show no PROBLEM and no
failing health check. A writer may refuse a combination (one line, nothing written): then there
is no artefact to hold to the contract. Also per job: a launcher that reaches the other nodes
over SSH (mpirun, deepspeed) is started by one role at most, never by every node alone, and a
PyTorchJob's replicas use a restart policy whose retries the training-operator counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint import launchers
from matrix.cli import deploy as cli
from matrix.errors import UserError
from matrix.jobs import contract, jobdef, k8s, roles, sbatch
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(ROOT / "stacks.yaml")
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
# (writer, variant, scheduler the writer's refusal checks the plan under, launcher)
VARIANTS = (
    [("jobdef", name, "batch", name) for name in launchers.NAMES]
    + [("sbatch", f"{name}/srun", "batch" if name in sbatch.PER_RANK else "slurm", name)
       for name in launchers.NAMES]
    + [("sbatch", "mpirun/mpirun", "slurm", "mpirun")]
    + [("k8s", "pytorchjob", "pytorchjob", "torchrun"),
       ("k8s", "pytorchjob-elastic", "pytorchjob", "torchrun"),
       ("k8s", "trainjob", "trainjob", "torchrun"), ("k8s", "mpijob", "mpijob", "mpirun")])
COMMANDS = {"program": PROGRAM, "launcher command": ["mpirun", *PROGRAM]}


def generate(writer: str, variant: str, scheduler: str, launcher: str, stack: str, itype: str,
             command: list[str], failures: list[str]) -> list[roles.Role]:
    """What the writer's task writes, through the checks it makes before writing (the pair, the
    plan's problems, its own options), and the roles derived from it. UserError: refused. What
    is wrong with the artefact as a whole is added to ``failures``."""
    entry = MATRIX.stack(stack)
    if writer == "sbatch":
        sbatch.check_command(launcher, NODES, command)
    jobdef.check_pair(entry, itype, cli.SCHEDULER_NAMES[writer])
    cli._refuse_problems(MATRIX, stack, itype, NODES, launcher, command, scheduler)
    if writer == "jobdef":
        definition = jobdef.definition_for_stack(entry, NODES, itype, IMAGE, command=command,
                                                 launcher=launcher)
        return roles.batch_roles(definition)
    if writer == "sbatch":
        script = sbatch.build_sbatch_script(stack, NODES, itype, IMAGE, command,
                                            launcher=launcher, ranks=variant.split("/")[1],
                                            fabric=entry.fabric)
        return roles.slurm_roles(script, itype)
    kind = variant.split("-")[0]
    manifest = k8s.build_manifest(kind, stack, NODES, itype, IMAGE, command, fabric=entry.fabric,
                                  elastic=(1, NODES) if variant.endswith("elastic") else None)
    if kind == "pytorchjob":
        policies = {r["restartPolicy"] for r in manifest["spec"]["pytorchReplicaSpecs"].values()}
        if not policies <= {"Never", "OnFailure"}:  # retries the operator counts
            failures.append(f"restartPolicy {sorted(policies)}: retries the operator never "
                            "counts against backoffLimit")
    return roles.k8s_roles(manifest)


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
    failures = []
    accepted = 0
    for writer, variant, scheduler, launcher in VARIANTS:
        for what, command in COMMANDS.items():
            if what != "program" and launcher != launchers.AS_IS:
                continue  # a launcher command with a launcher: refused, tested elsewhere
            found: list[str] = []
            try:
                derived = generate(writer, variant, scheduler, launcher, stack, itype, command,
                                   found)
            except UserError:
                continue  # refused in one line, nothing written: no artefact to hold
            accepted += 1
            found.extend(check_job(stack, derived))
            failures.extend(f"{writer} {variant} ({what}): {line}" for line in found)
    assert accepted, "every writer refused every launcher"
    assert failures == [], "\n".join(failures)


def test_no_writer_imports_another():
    """Each writer renders the job from the shared room (spec.py, mounts.py, crds.py): adding a
    scheduler is one writer module and its role derivation."""
    import ast

    writers = ("jobdef", "sbatch", "k8s")
    for name in writers:
        tree = ast.parse((ROOT / "matrix" / "jobs" / f"{name}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {f"{node.module}.{alias.name}" for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) for alias in node.names}
        others = {f"matrix.jobs.{other}" for other in writers if other != name}
        assert not imported & others, (name, imported & others)


def test_every_notice_reaches_each_artefact_and_batch_tags_hold_only_tag_characters():
    """A CUDA stack's minimum driver (issue 33) is in what every writer renders, and the Batch
    tag keeps to the characters AWS tags allow."""
    import re

    from matrix.cli.deploy import notices_for
    from matrix.jobs import spec
    from matrix.model.drivers import driver_floor

    matrix = MATRIX
    stack = matrix.stacks["cuda12.1-efa"]
    notices = notices_for(stack)
    assert notices == [driver_floor(stack).line()] and "525.60.13" in notices[0]
    tags = spec.batch_tags(notices)
    assert all(re.fullmatch(r"[A-Za-z0-9 +\-=._:/@]{0,256}", value) for value in tags.values())
    assert "at least 525.60.13" in tags["mnp:notice-1"]
    assert notices_for(matrix.stacks["cpu-tcp"]) == []
