"""A command that is itself a launcher (issue 23): users copy their command lines, so
``MNP_LAUNCHER=torchrun`` with ``-- torchrun --nproc_per_node 8 train.py`` on Batch used to give
``torchrun ... --no_python torchrun ...``, and Batch's default mpirun started one torchrun per
slot. Where the entrypoint would start a launcher around it, the plan refuses with one line
naming what to write instead; where nothing wraps it (one node, a scheduler that wired the nodes
with MNP_LAUNCHER unset, ``MNP_LAUNCHER=none``) it runs as given."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import schedulers
from entrypoint.plan import make as plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config

REPO = Path(__file__).resolve().parents[2]
BINARIES = {"mpirun": "/usr/bin/mpirun", "sshd": "/usr/sbin/sshd", "python3": "/usr/bin/python3",
            "torchrun": "/usr/local/bin/torchrun", "deepspeed": "/usr/local/bin/deepspeed",
            "pdsh": "/usr/bin/pdsh"}
TORCHRUN = ["torchrun", "--nproc_per_node", "8", "train.py"]
MPIRUN = ["mpirun", "-np", "16", "python3", "train.py"]
COMMANDS = {"torchrun": TORCHRUN, "mpirun": MPIRUN,
            "torch.distributed.run": ["python3", "-m", "torch.distributed.run", "train.py"],
            "deepspeed": ["deepspeed", "train.py"]}


def make(env, command):
    cfg = config.load(env)
    node = NodeFacts(address="10.0.0.5", interface="eth0", address_reason="test", is_root=True,
                     binaries=dict(BINARIES), home="/root",
                     versions={"pytorch": "2.1.0", "deepspeed": "0.14.4"}, slots=8,
                     slots_source="test: 8 GPUs")
    return plan.make_plan(cfg, node, list(command), dict(env, PATH="/bin"))


def batch(index=0, **extra):
    return dict(schedulers.MODULES["batch"].example(2, index), MNP_SECRET="s", **extra)


@pytest.mark.parametrize("index", [0, 1], ids=["main", "child"])
@pytest.mark.parametrize("launcher", ["", "mpirun", "torchrun", "deepspeed"])
@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_batch_refuses_to_start_a_launcher_around_a_launcher_command(index, launcher, kind):
    env = batch(index, **({"MNP_LAUNCHER": launcher} if launcher else {}))
    p = make(env, COMMANDS[kind])
    assert len(p.problems) >= 1, p.argv
    line = p.problems[0]
    assert line.startswith("the command starts ") and "\n" not in line
    assert "give the program alone" in line and "MNP_LAUNCHER_ARGS" in line
    wrapper = launcher or "mpirun"
    assert f"the entrypoint would start {wrapper} around it" in line


def test_the_line_names_the_launcher_to_set_and_when_none_can_run_it_as_is():
    torch_line = make(batch(), TORCHRUN).problems[0]
    assert "with MNP_LAUNCHER=torchrun and torchrun's own options in MNP_LAUNCHER_ARGS" in \
        torch_line
    assert "MNP_LAUNCHER=none" not in torch_line  # on the main node alone it trains on one node
    mpi_line = make(batch(), MPIRUN).problems[0]
    assert mpi_line.endswith("or set MNP_LAUNCHER=none to run the command as is on the main "
                             "node, with the job's hostfile and SSH ready (only the variables it "
                             "passes itself reach the other nodes)")


def test_mnp_launcher_none_runs_a_launcher_command_as_is_on_batch():
    p = make(batch(MNP_LAUNCHER="none"), MPIRUN)
    assert p.problems == [] and p.argv == MPIRUN
    assert p.ssh is not None  # the per-job sshd and keys are there for its mpirun


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_a_single_node_runs_a_launcher_command_as_given(kind):
    p = make({"MNP_SLOTS_PER_NODE": "8"}, COMMANDS[kind])
    assert p.problems == [] and p.argv == COMMANDS[kind] and p.launcher["unit"] == "none"
    assert any(n.startswith("the command starts ") and "run as is on this node" in n
               for n in p.notes)


@pytest.mark.parametrize("scheduler", ["slurm", "pytorchjob", "trainjob"])
def test_an_explicit_launcher_around_a_launcher_command_is_refused_under_every_scheduler(
        scheduler):
    env = schedulers.MODULES[scheduler].example(2, 1)
    p = make(dict(env, MNP_LAUNCHER="torchrun"), TORCHRUN)
    assert p.problems and p.problems[0].startswith("the command starts torchrun itself and the "
                                                   "entrypoint would start torchrun around it "
                                                   "(MNP_LAUNCHER=torchrun)")
    if scheduler == "slurm":  # there none would run it alone on every node (issue 32)
        assert "MNP_LAUNCHER=none" not in p.problems[0]
    else:
        assert p.problems[0].endswith("or set MNP_LAUNCHER=none to run the command as is with "
                                      "the scheduler's variables")
    p = make(env, TORCHRUN)  # unset: the scheduler's PET_*/allocation reach the user's torchrun
    assert p.problems == [] and p.argv == TORCHRUN


def test_the_issue_example_stops_before_anything_starts():
    """The user's path: the real entrypoint on Batch's main node, dry run and real run."""
    env = dict(os.environ, PYTHONPATH=str(REPO), MNP_LAUNCHER="torchrun", **batch())
    dry = subprocess.run([sys.executable, "-m", "entrypoint"] + TORCHRUN,
                         env=dict(env, MNP_DRY_RUN="1"), capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 1
    problems = [line for line in dry.stdout.splitlines() if line.startswith("PROBLEM")]
    assert problems[0].startswith("PROBLEM (a real run stops here): the command starts torchrun "
                                  "itself and the entrypoint would start torchrun around it")
    run = subprocess.run([sys.executable, "-m", "entrypoint"] + TORCHRUN, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2  # the configuration class: never retried
    errors = [line for line in run.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "the command starts torchrun itself" in errors[0]
    assert "Traceback" not in run.stderr


# -- MNP_LAUNCHER=none on a Slurm step of one task per node (issue 32) -----------------------

@pytest.mark.parametrize("index", [0, 2], ids=["node0", "node2"])
@pytest.mark.parametrize("kind,unit", [("mpirun", "mpirun"), ("deepspeed", "deepspeed"),
                                       ("torchrun", "torchrun")])
def test_none_never_runs_a_launcher_command_alone_on_every_node_of_a_slurm_step(index, kind,
                                                                                unit):
    env = dict(schedulers.MODULES["slurm"].example(3, index), MNP_LAUNCHER="none")
    p = make(env, COMMANDS[kind])
    assert len(p.problems) == 1, p.problems
    line = p.problems[0]
    assert line.startswith(f"the command starts {kind} itself and MNP_LAUNCHER=none runs it as "
                           "is on each of the 3 nodes of this slurm step, with no hostfile, SSH "
                           "or secret: 3 separate jobs. Give the program alone")
    assert f"with MNP_LAUNCHER={unit} (" in line and "\n" not in line


def test_none_still_runs_a_program_on_every_task_and_a_launcher_on_one_slurm_node():
    p = make(dict(schedulers.MODULES["slurm"].example(3, 1), MNP_LAUNCHER="none"),
             ["python3", "train.py"])
    assert p.problems == [] and p.argv == ["python3", "train.py"]
    p = make(dict(schedulers.MODULES["slurm"].example(1, 0), MNP_LAUNCHER="none"), MPIRUN)
    assert p.problems == [] and p.argv == MPIRUN


def test_the_refusal_under_a_wired_slurm_step_does_not_suggest_none():
    env = dict(schedulers.MODULES["slurm"].example(3, 0), MNP_LAUNCHER="mpirun", MNP_SECRET="s")
    line = make(env, MPIRUN).problems[0]
    assert line.startswith("the command starts mpirun itself and the entrypoint would start "
                           "mpirun around it (MNP_LAUNCHER=mpirun)")
    assert "MNP_LAUNCHER=none" not in line, line
