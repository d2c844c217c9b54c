"""Issue 32: ``invoke explain --scheduler S`` prints, for every role of the job S's writer
generates, exactly what that role's own dry run prints.

Each role's dry run is run here as the role would run it: the artefact is written by the writer
the user calls (``invoke jobdef``/``sbatch``/``k8s``, their build functions), each role is read
back from it (``matrix.jobs.roles``), and the entrypoint runs as its own process with exactly the
role's environment (the image's variables, then the scheduler's), ``MNP_DRY_RUN=1`` and the
role's arguments; a file the scheduler mounts (an MPIJob's hostfile) is written for it. Only the
probe is replaced: no node of these instance types exists here, so the process is handed the
facts its image and instance type declare (``explain.role_facts``: what only a node can probe
stays a placeholder). The section explain prints for the role must be that process's output,
line for line, and explain's exit rule the process's exit status.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import launchers
from matrix.image.declared import image_facts
from matrix.jobs import explain as ex
from matrix.jobs import roles, writers
from matrix.jobs.spec import JobSpec
from matrix.jobs.writer import Prepared
from tests.helpers import project_matrix

ROOT = Path(__file__).resolve().parent.parent
MATRIX = project_matrix()
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp-stacks@sha256:" + "e" * 64
COMMAND = ["python3", "train.py", "--epochs", "1"]
# The entrypoint as its own process, with the probe handing over the declared facts (argv: the
# project root, the facts file, then the role's arguments); the environment is the role's alone.
# Python 3.7+ started without LANG sets LC_CTYPE=C.UTF-8 in its own environment (PEP 538), as
# the image's python3 does on a node: that is the interpreter's, not the role's, so it goes.
DRY_RUN = """
import json, os, sys
if os.environ.get("LC_CTYPE") == "C.UTF-8" and "LANG" not in os.environ:
    del os.environ["LC_CTYPE"]
sys.path.insert(0, sys.argv[1])
from entrypoint.probe import facts
declared = json.load(open(sys.argv[2]))
facts.probe = lambda *args, **kwargs: facts.NodeFacts(**declared)
from entrypoint.run import main
sys.exit(main.main(sys.argv[3:]))
"""
# (stack, instance type): a CPU stack, a GPU stack over EFA (the seed job's p4d), a Gaudi stack
JOBS = [("cpu-tcp", "c5n.18xlarge"), ("cuda11.7-efa", "p4d.24xlarge"),
        ("synapseai1.6-efa", "dl1.24xlarge")]


def prepared(scheduler: str, itype: str, nodes: int, launcher: str | None) -> Prepared:
    """The writer's reading of its task's options for ``--scheduler scheduler`` (its Kubeflow
    kind), as invoke hands them over: the launcher, options and attempts its task writes."""
    writer = writers.for_scheduler(scheduler)
    typed = dict(writer.implied(scheduler), nodes=str(nodes), instance_type=itype)
    if launcher is not None:
        typed["launcher"] = launcher
    return writer.prepare(writer.task_options().parse(typed))


# every scheduler explain writes a job for, with the launcher its writer writes by default
SCHEDULED = {scheduler: prepared(scheduler, "c5n.18xlarge", 2, None).launcher
             for writer in writers.all_writers() for scheduler in writer.schedulers}


def written_roles(scheduler: str, stack: str, itype: str, nodes: int,
                  launcher: str) -> list[roles.Role]:
    """What the user's writer writes for the job (the writer its task calls), read back role by
    role."""
    writer = writers.for_scheduler(scheduler)
    given = prepared(scheduler, itype, nodes, launcher)
    job = JobSpec.of(MATRIX.stack(stack), itype, nodes, IMAGE, given.launcher, COMMAND,
                     attempts=given.attempts, elastic=given.elastic)
    return writer.roles(writer.render(job, given.options))


def own_dry_run(stack: str, role: roles.Role, tmp: Path) -> tuple[int, str]:
    """The role's entrypoint run with ``MNP_DRY_RUN=1``: its exit status and its output, with a
    mounted file named by the path the scheduler mounts it at."""
    image = image_facts(MATRIX, MATRIX.stack(stack))  # the image's own ENV, from its templates
    env = {**image.env, **role.env, "MNP_DRY_RUN": "1"}
    moved = {}
    for index, (path, content) in enumerate(sorted(role.files.items())):
        local = tmp / f"mounted{index}"
        local.write_text(content)
        moved[str(local)] = path
        env = {name: (str(local) if value == path else value) for name, value in env.items()}
    facts = tmp / "facts.json"
    facts.write_text(json.dumps(ex.role_facts(MATRIX, MATRIX.stack(stack), role).to_dict()))
    proc = subprocess.run([sys.executable, "-c", DRY_RUN, str(ROOT), str(facts), *role.argv],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    output = proc.stdout
    for local, path in moved.items():
        output = output.replace(local, path)
    return proc.returncode, output


def sections(text: str) -> dict[str, str]:
    """explain's text: role name -> the lines under its ``=== name: ... ===`` title."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("=== ") and line.endswith(" ==="):
            current = line[4:-4].split(": ", 1)[0]
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return {name: "\n".join(lines).strip("\n") for name, lines in found.items()}


# (scheduler, stack, instance type, nodes, launcher): every scheduler on every job, then every
# launcher on Batch, and one node with launcher none (no hostfile on the node: explain once
# decided that apart from the entrypoint, and said otherwise)
CASES = ([(scheduler, stack, itype, 3, launcher) for scheduler, launcher in SCHEDULED.items()
          for stack, itype in JOBS]
         + [("batch", "cpu-tcp", "c5n.18xlarge", 2, name) for name in launchers.NAMES]
         + [("batch", "cpu-tcp", "c5n.18xlarge", 1, "none"),
            ("slurm", "cpu-tcp", "c5n.18xlarge", 1, "none")])


@pytest.mark.parametrize(("scheduler", "stack", "itype", "nodes", "launcher"), CASES,
                         ids=[f"{s}-{st}@{i}x{n}-{la}" for s, st, i, n, la in CASES])
def test_explain_prints_each_roles_own_dry_run(scheduler, stack, itype, nodes, launcher,
                                              tmp_path):
    result = ex.explain(MATRIX, stack, itype, nodes, launcher, COMMAND, scheduler=scheduler)
    shown = sections(result.text())
    derived = written_roles(scheduler, stack, itype, nodes, launcher)
    assert list(shown) == [role.name for role in derived]
    statuses = []
    for role in derived:
        status, output = own_dry_run(stack, role, tmp_path)
        assert shown[role.name] == output.strip("\n"), role.name
        statuses.append(status)
    # explain fails (exit 1) exactly when some role's own dry run does
    assert bool(result.stops()) == any(statuses)


def test_the_gpu_mpijob_launcher_is_shown_without_devices_and_the_workers_with_them():
    """The seed job 'nccl-tests through the MPI operator on p4d': the launcher pod asks for no
    GPU or EFA device and the operator blanks NVIDIA_VISIBLE_DEVICES on it; each worker gets
    8 GPUs and 4 EFA devices. explain shows both roles as such, and neither stops."""
    result = ex.explain(MATRIX, "cuda11.7-efa", "p4d.24xlarge", 2, None,
                        ["/opt/nccl-tests/bin/all_reduce_perf", "-b", "8"], scheduler="mpijob")
    launcher, worker = result.sections
    assert (launcher.role.name, worker.role.name) == ("launcher", "worker-0")
    assert launcher.plan.facts["gpus"] == 0 and launcher.plan.facts["efa_devices"] == []
    assert launcher.role.env["NVIDIA_VISIBLE_DEVICES"] == ""
    assert worker.plan.facts["gpus"] == 8 and len(worker.plan.facts["efa_devices"]) == 4
    assert result.stops() == []
    text = result.text()
    assert "=== launcher: p4d.24xlarge, no devices passed in ===" in text
    assert "=== worker-0: p4d.24xlarge, 8 GPUs, 4 EFA devices passed in ===" in text
