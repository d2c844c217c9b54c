"""deepspeed under a scheduler that names the hosts gets them (issue 23): an MPIJob launcher (the
operator's hostfile) and a Slurm batch script (the allocation). Before, the plan ran
``deepspeed --launcher pdsh --master_addr ... train.py`` with no ``--hostfile``: DeepSpeed then
reads ``/job/hostfile``, finds none and trains on the launcher's node alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

from entrypoint import schedulers
from entrypoint.plan import make as plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config

REPO = Path(__file__).resolve().parents[2]
BINARIES = {"mpirun": "/usr/bin/mpirun", "sshd": "/usr/sbin/sshd", "python3": "/usr/bin/python3",
            "deepspeed": "/usr/local/bin/deepspeed", "pdsh": "/usr/bin/pdsh"}
WORKERS = "mj-worker-0.mj.default.svc slots=4\nmj-worker-1.mj.default.svc slots=4\n"


def facts(slots=8):
    return NodeFacts(address="10.0.0.5", interface="eth0", address_reason="test", is_root=True,
                     binaries=dict(BINARIES), home="/root",
                     versions={"pytorch": "2.1.0", "deepspeed": "0.14.4"}, slots=slots,
                     slots_source=f"test: {slots} GPUs")


def make(env, node_facts):
    env = dict(env, MNP_LAUNCHER="deepspeed", MNP_STATE_DIR="/run/mnp")
    cfg = config.load(env)
    return plan.make_plan(cfg, node_facts, ["python3", "train.py"], dict(env, PATH="/bin"))


def hostfile_of(p):
    index = p.argv.index("--hostfile")
    path = p.argv[index + 1]
    return path, [f for f in p.files if f["path"] == path][0]["content"]


def mpijob_launcher(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(WORKERS)
    return dict(schedulers.MODULES["mpijob"].example(2),
                OMPI_MCA_orte_default_hostfile=str(hostfile))


def slurm_batch_script():
    env = schedulers.MODULES["slurm"].example(3, 0)
    for name in ("SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
                 "SLURM_STEP_TASKS_PER_NODE"):
        del env[name]
    return env


def test_an_mpijob_launcher_gives_deepspeed_the_operators_workers_and_slots(tmp_path):
    p = make(mpijob_launcher(tmp_path), facts(slots=1))  # the launcher pod has no GPU
    assert p.problems == []
    path, content = hostfile_of(p)
    assert path == "/run/mnp/deepspeed_hostfile"
    assert content == WORKERS  # the operator's hosts and slots
    assert p.argv[p.argv.index("--master_addr") + 1] == "mj-worker-0.mj.default.svc"
    # pdsh reaches the workers with the operator's keys and their fresh host keys
    assert p.environment["PDSH_SSH_ARGS_APPEND"] == (
        "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")
    assert "--no_ssh_check" in p.argv


def test_a_slurm_batch_script_gives_deepspeed_the_allocation_with_the_nodes_devices():
    p = make(slurm_batch_script(), facts(slots=8))
    path, content = hostfile_of(p)
    # Slurm's tasks per node (1 here) count tasks, not the processes DeepSpeed starts per GPU
    assert content == "node1 slots=8\nnode2 slots=8\nnode3 slots=8\n"
    why = [f["why"] for f in p.files if f["path"] == path][0]
    assert "not the scheduler's tasks per node" in why and "/job/hostfile" in why
    assert "PDSH_SSH_ARGS_APPEND" not in p.environment  # Slurm has no launcher SSH of its own
    assert p.argv[p.argv.index("--master_addr") + 1] == "node1"


def test_mnp_slots_per_node_sets_the_slurm_hostfiles_slots():
    env = dict(slurm_batch_script(), MNP_SLOTS_PER_NODE="4")
    _, content = hostfile_of(make(env, facts(slots=8)))
    assert content == "node1 slots=4\nnode2 slots=4\nnode3 slots=4\n"


def test_batch_and_single_nodes_keep_the_entrypoints_own_hostfile():
    batch = dict(schedulers.MODULES["batch"].example(2, 0), MNP_SECRET="s")
    p = make(batch, facts())
    assert p.argv[p.argv.index("--hostfile") + 1] == "/run/mnp/hostfile"
    assert not [f for f in p.files if f["path"].endswith("deepspeed_hostfile")]


def test_the_dry_run_of_an_mpijob_launcher_shows_the_hostfile_it_writes(tmp_path):
    """The user's path: the real entrypoint's JSON dry run in the launcher's environment."""
    env = dict(os.environ, PYTHONPATH=str(REPO), MNP_DRY_RUN="json", MNP_LAUNCHER="deepspeed",
               MNP_STATE_DIR=str(tmp_path / "state"), **mpijob_launcher(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "python3", "train.py"], env=env,
                          capture_output=True, text=True, timeout=60)
    data = json.loads(proc.stdout)
    path = str(tmp_path / "state" / "deepspeed_hostfile")
    assert data["argv"][data["argv"].index("--hostfile") + 1] == path
    assert [f["content"] for f in data["files"] if f["path"] == path] == [WORKERS]
