"""Detection that cannot silently pick the wrong scheduler (issue 23): when the variables of two
schedulers are present, the one that started the process wins, and the dry run names the
variables it ignored and why. Environments are each adapter's ``example`` (what that scheduler
gives a process) plus what job scripts export: an sbatch recipe's ``MASTER_ADDR``/``RANK``/
``WORLD_SIZE``, enroot's PyTorch hook (NVIDIA/enroot conf/hooks/extra/50-slurm-pytorch.sh:
``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``=SLURM_NTASKS, ``RANK``=SLURM_PROCID,
``LOCAL_RANK``=SLURM_LOCALID in every task of an image that defines ``PYTORCH_VERSION``)."""

import json
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
            "torchrun": "/usr/local/bin/torchrun"}
# What an sbatch recipe exports before srun (24 = 3 nodes x 8 GPUs), every task inherits it.
SBATCH_EXPORTS = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500", "WORLD_SIZE": "24",
                  "RANK": "1"}
# What enroot's PyTorch hook adds to the task on node 2 of `srun -N3 --ntasks-per-node=1`.
ENROOT_HOOK = {"MASTER_ADDR": "node1", "MASTER_PORT": "61031", "WORLD_SIZE": "3", "RANK": "1",
               "LOCAL_RANK": "0"}
# A script that exports torchrun's own options (PET_*), as TrainJob's plugin sets them.
PET_EXPORTS = {"PET_NNODES": "24", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "node1"}


def example(name, nodes=3, rank=1, **extra):
    env = schedulers.MODULES[name].example(nodes, rank)
    env.update(extra)
    return env


def slurm_batch_script(**extra):
    env = example("slurm", 3, 0, **extra)
    for name in ("SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
                 "SLURM_STEP_TASKS_PER_NODE"):
        del env[name]
    return env


def facts():
    return NodeFacts(address="10.0.0.5", interface="eth0", address_reason="test", is_root=True,
                     binaries=dict(BINARIES), home="/root", versions={"pytorch": "2.1.0"},
                     slots=8, slots_source="test: 8 GPUs")


def dry_run(env, command=("python3", "train.py")):
    cfg = config.load(env)
    return cfg, plan.make_plan(cfg, facts(), list(command), dict(env, PATH="/bin"))


def test_a_slurm_step_with_exported_pytorch_variables_stays_a_slurm_job_in_the_dry_run():
    """The user's path: the real entrypoint's dry run. Before, it planned a PyTorchJob and
    `torchrun --nnodes 24 --node_rank 1`, waiting for 21 nodes that never come."""
    env = dict(os.environ, PYTHONPATH=str(REPO), MNP_DRY_RUN="1", SLURM_JOB_ID="7",
               SLURM_STEP_ID="0", SLURM_STEP_NODELIST="node[1-3]", SLURM_NODEID="1",
               **SBATCH_EXPORTS)
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "python3", "train.py"], env=env,
                          capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    assert "scheduler: slurm (detected from SLURM_JOB_ID)" in lines
    assert "role: child, node 1 of 3, main node index 0" in lines
    ignored = [line for line in lines if line.startswith("ignored: ")]
    assert ignored == [
        "ignored: pytorchjob's MASTER_ADDR, RANK, WORLD_SIZE, MASTER_PORT (job scripts export "
        "these names too: sbatch recipes, and enroot's PyTorch hook in every Slurm task); "
        "slurm's SLURM_JOB_ID wins: Slurm sets SLURM_* for the batch script and every task it "
        "starts; a pod has none"]
    command = [line for line in lines if line.startswith("command: ")][0]
    assert " --nnodes 3 --node_rank 1 " in command and " --master_addr node1 " in command


# (the scheduler's own environment, what was exported on top, the scheduler expected, nodes)
STARTED_OVER_EXPORTED = [
    ("slurm step", example("slurm", 3, 1), SBATCH_EXPORTS, "slurm", 3),
    ("slurm step, enroot hook", example("slurm", 3, 1), ENROOT_HOOK, "slurm", 3),
    ("slurm step, PET_*", example("slurm", 3, 1), PET_EXPORTS, "slurm", 3),
    ("slurm batch script", slurm_batch_script(), SBATCH_EXPORTS, "slurm", 3),
    ("batch", example("batch", 2, 1), SBATCH_EXPORTS, "batch", 2),
    ("batch, LOCAL_RANK", example("batch", 2, 1), {"LOCAL_RANK": "0"}, "batch", 2),
    ("batch, PET_*", example("batch", 2, 1), PET_EXPORTS, "batch", 2),
    ("mpijob launcher", example("mpijob"), ENROOT_HOOK, "mpijob", None),
    ("mpijob worker", {"K_MPI_JOB_ROLE": "worker"}, PET_EXPORTS, "mpijob", None),
]


@pytest.mark.parametrize("label, own, exported, expected, nodes", STARTED_OVER_EXPORTED,
                         ids=[case[0] for case in STARTED_OVER_EXPORTED])
def test_the_scheduler_that_started_the_process_wins_over_exported_names(
        label, own, exported, expected, nodes):
    cfg, p = dry_run(dict(own, **exported))
    assert cfg.scheduler == expected, label
    if nodes is not None:
        assert cfg.num_nodes == nodes
    ignored = [line for line in p.text().splitlines() if line.startswith("ignored: ")]
    assert ignored and all(" wins: " in line for line in ignored), ignored
    names = set(exported) & {"MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "PET_NODE_RANK"}
    assert all(any(name in line for line in ignored) for name in names), ignored
    assert p.role["node"]["ignored"] == [line[len("ignored: "):] for line in ignored]


RANKS = [("OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}),
         ("PMIX_RANK", {"PMIX_RANK": "2"}),
         ("LOCAL_RANK", {"LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "none"})]


@pytest.mark.parametrize("scheduler", ["batch", "slurm", "mpijob", "pytorchjob", "trainjob"])
@pytest.mark.parametrize("variable, launched", RANKS, ids=[r[0] for r in RANKS])
def test_a_launchers_rank_runs_its_command_under_every_scheduler(scheduler, variable, launched):
    cfg, p = dry_run(dict(example(scheduler, 2, 1), **launched))
    assert (cfg.scheduler, cfg.mode, p.role["detected_from"]) == ("rank", "rank", variable)
    assert p.argv == ["python3", "train.py"]
    assert any(line.startswith(f"ignored: {scheduler}'s ") for line in p.text().splitlines())


def test_enroot_hook_local_rank_is_a_rank_only_where_the_step_runs_several_tasks_per_node():
    one_per_node = dict(example("slurm", 3, 1), **ENROOT_HOOK)
    assert schedulers.choose(one_per_node).scheduler == "slurm"
    eight = dict(example("slurm", 3, 1), SLURM_STEP_TASKS_PER_NODE="8(x3)", SLURM_NTASKS="24",
                 SLURM_LOCALID="5", SLURM_PROCID="13", LOCAL_RANK="5", RANK="13",
                 WORLD_SIZE="24", MASTER_ADDR="node1")
    table = schedulers.choose(eight)
    assert (table.scheduler, table.rank) == ("rank", 5)
    slurm_line = [line for line in table.ignored if line.startswith("slurm's SLURM_JOB_ID")][0]
    assert slurm_line.endswith("rank's LOCAL_RANK wins: it is this task's SLURM_LOCALID and the "
                               "Slurm step runs 8 tasks on this node: each task is one rank")
    # a value exported once in the batch script is the same in every task: not this task's
    assert schedulers.choose(dict(eight, LOCAL_RANK="0")).scheduler == "slurm"


@pytest.mark.parametrize("forced", ["batch", "slurm", "pytorchjob", "trainjob", "single"])
def test_mnp_scheduler_decides_and_the_dry_run_names_what_it_overrode(forced):
    env = dict(example("slurm", 2, 1), **dict(example("batch", 2, 1),
                                               **dict(example("trainjob", 2, 1), RANK="1",
                                                      WORLD_SIZE="2", MASTER_ADDR="m")))
    table = schedulers.choose(dict(env, MNP_SCHEDULER=forced))
    assert (table.scheduler, table.detected_from) == (forced, "MNP_SCHEDULER=" + forced)
    others = {"batch", "slurm", "pytorchjob"} - {forced}
    assert {line.split("'")[0] for line in table.ignored} == others
    assert all(line.endswith(f"MNP_SCHEDULER={forced} decides") for line in table.ignored)


def test_equally_sure_schedulers_say_which_came_first_and_how_to_choose():
    table = schedulers.choose(dict(example("batch", 2, 1), **example("slurm", 2, 1)))
    assert table.scheduler == "batch"
    assert table.ignored[0].endswith("(as sure: first in the detection order; set "
                                     "MNP_SCHEDULER to choose)")


def test_one_schedulers_own_variables_are_not_listed_as_another():
    """A PyTorchJob sets PET_NODE_RANK and PET_NNODES too (training-operator v1.7.0), which
    TrainJob's adapter reads: that is one scheduler, nothing was ignored."""
    for name in ("pytorchjob", "trainjob", "slurm", "batch"):
        assert schedulers.choose(example(name, 2, 1)).ignored == [], name


def test_the_json_dry_run_carries_the_ignored_lines():
    env = dict(os.environ, PYTHONPATH=str(REPO), MNP_DRY_RUN="json", **example("slurm", 3, 1),
               **SBATCH_EXPORTS)
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "python3", "train.py"], env=env,
                          capture_output=True, text=True, timeout=60)
    node = json.loads(proc.stdout)["role"]["node"]
    assert (node["scheduler"], node["num_nodes"]) == ("slurm", 3)
    assert node["ignored"][0].startswith("pytorchjob's MASTER_ADDR, RANK, WORLD_SIZE")
