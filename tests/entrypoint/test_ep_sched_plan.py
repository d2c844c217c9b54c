"""``make_plan`` under every scheduler: one decision from the scheduler's node table (issue 15).

The environments are each adapter's ``example`` (what that scheduler gives a process, with the
sources in the adapter) or written out as the real cluster tests observed them.
"""

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


def facts(**kw):
    values = dict(address="10.0.0.5", interface="eth0", address_reason="test", is_root=True,
                  binaries=dict(BINARIES), home="/root", versions={"pytorch": "2.1.0"},
                  slots=2, slots_source="test: 2 GPUs")
    values.update(kw)
    return NodeFacts(**values)


def make(env, command=("python3", "train.py"), **node_facts):
    cfg = config.load(env)
    user_env = dict(env, PATH="/bin")
    return cfg, plan.make_plan(cfg, facts(**node_facts), list(command), user_env)


def example(name, nodes=3, rank=1, **extra):
    env = schedulers.MODULES[name].example(nodes, rank)
    env.update(extra)
    return env


def test_a_slurm_step_task_runs_torchrun_with_the_nodelists_first_host_as_master():
    cfg, p = make(example("slurm"))
    assert (cfg.scheduler, cfg.mode, cfg.rendezvous) == ("slurm", "child", False)
    assert p.launcher["unit"] == "torchrun" and not p.needs_ssh and p.problems == []
    assert p.argv[:11] == ["torchrun", "--nnodes", "3", "--node_rank", "1", "--nproc_per_node",
                           "2", "--master_addr", "node1", "--master_port", "29500"]
    assert p.rendezvous is None and p.ssh is None and p.hostfile == []
    assert p.environment["MNP_MASTER_ADDRESS"] == "node1"
    assert "scheduler: slurm (detected from SLURM_JOB_ID)" in p.text()


def test_a_slurm_batch_script_runs_mpirun_inside_the_allocation_without_hostfile_or_ssh():
    env = example("slurm", 3, 0, SLURM_TASKS_PER_NODE="2(x3)")
    for name in ("SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
                 "SLURM_STEP_TASKS_PER_NODE"):
        del env[name]
    cfg, p = make(env)
    assert cfg.mode == "launcher" and p.launcher["unit"] == "mpirun" and p.problems == []
    assert p.argv[:4] == ["/usr/bin/mpirun", "--allow-run-as-root", "-np", "6"]
    assert "--hostfile" not in p.argv and not p.launcher["needs_ssh"]
    names = [entry["name"] for entry in p.env]
    assert "OMPI_MCA_orte_default_hostfile" not in names and "OMPI_MCA_plm_rsh_args" not in names
    # each rank keeps its own Slurm variables: none is exported from the script's node
    assert not [a for a in p.argv if a.startswith("SLURM")]


def test_an_srun_mpi_pmix_task_is_a_rank_and_runs_the_command_itself():
    env = example("slurm", PMIX_RANK="1", PMIX_NAMESPACE="slurm.pmix.7.0")
    cfg, p = make(dict(env, MNP_LAUNCHER="mpirun"))
    assert (cfg.scheduler, cfg.mode) == ("rank", "rank")
    assert p.argv == ["python3", "train.py"] and p.launcher["unit"] == "none"
    assert any("MNP_LAUNCHER=mpirun not used" in n for n in p.notes)
    assert not [e for e in p.env if e["name"].startswith("OMPI_MCA_")]


@pytest.mark.parametrize("launcher", ["mpirun", "deepspeed"])
@pytest.mark.parametrize("rank", [0, 2])
def test_an_ssh_launcher_on_a_one_task_per_node_slurm_step_is_wired_by_the_entrypoint(
        launcher, rank):
    """pyxis' tasks have no srun for Open MPI's daemons: node 0 runs the launcher over the
    entrypoint's own rendezvous and per-job SSH, as on Batch, bound to the step's id."""
    env = example("slurm", 3, rank, MNP_LAUNCHER=launcher, SLURM_RESTART_COUNT="1")
    cfg, p = make(env, binaries=dict(BINARIES, deepspeed="/usr/local/bin/deepspeed"))
    assert (cfg.scheduler, cfg.mode, cfg.rendezvous) == ("slurm", ("main", "child")[rank > 0],
                                                         True)
    assert cfg.job_id == "slurm-1234.0.1" and cfg.main_index == 0
    assert cfg.main_address == (None if rank == 0 else "node1")
    assert p.needs_ssh and p.problems == [], p.problems
    assert ("nodes wired by: the entrypoint (rendezvous with the main node): "
            f"MNP_LAUNCHER={launcher} needs SSH between the nodes, which slurm does not serve"
            ) in p.text()
    if rank:
        assert p.rendezvous.startswith("register with node1:29410")


@pytest.mark.parametrize(("launcher", "runner"), [("mpirun", None), ("deepspeed", "openmpi")])
def test_open_mpi_keeps_off_slurms_launcher_and_allocation_where_the_entrypoints_wired_it(
        launcher, runner):
    """Open MPI 4 picks plm/ras slurm whenever SLURM_JOBID is set (srun sets it in every task):
    it would start its daemons with the srun a pyxis container lacks and reject the hostfile's
    addresses. A Batch node (no SLURM_JOBID) gets neither setting."""
    extra = {"MNP_LAUNCHER": launcher}
    if runner:
        extra["MNP_DEEPSPEED_LAUNCHER"] = runner
    binaries = dict(BINARIES, deepspeed="/usr/local/bin/deepspeed")
    _, p = make(example("slurm", 3, 0, **extra), binaries=binaries)
    assert (p.environment.get("OMPI_MCA_plm"), p.environment.get("OMPI_MCA_ras")) == (
        "rsh", "^slurm"), p.environment
    _, batch = make(example("batch", 3, 0, **extra), binaries=binaries)
    assert "OMPI_MCA_plm" not in batch.environment and "OMPI_MCA_ras" not in batch.environment


def test_a_wired_slurm_tasks_own_pytorch_variables_reach_no_rank():
    """pyxis' pytorch_setup and enroot's PyTorch hook set RANK etc. per task: node 0's must not
    reach every rank (mpirun's local ranks inherit its environment, the rest get -x)."""
    env = example("slurm", 3, 0, MNP_LAUNCHER="mpirun", RANK="0", LOCAL_RANK="0",
                  WORLD_SIZE="3", MASTER_ADDR="node1", MASTER_PORT="29500")
    _, p = make(env)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert name not in p.environment and name not in p.argv, name
    assert any(note.startswith("removed from the launcher's environment") for note in p.notes)
    _, torchrun = make(example("slurm", 3, 0, RANK="0", MASTER_ADDR="node1"))  # not wired
    assert "removed from the launcher's environment" not in " ".join(torchrun.notes)


def test_deepspeed_skips_its_own_ssh_check_where_the_entrypoints_wired_a_slurm_step():
    """The runner's `ssh <host> hostname` reads neither the job's port nor its keys, and a Slurm
    user's shared home keeps its own ~/.ssh/config (the entrypoint writes none there)."""
    binaries = dict(BINARIES, deepspeed="/usr/local/bin/deepspeed", pdsh="/usr/bin/pdsh")
    _, p = make(example("slurm", 3, 0, MNP_LAUNCHER="deepspeed"), binaries=binaries,
                versions={"pytorch": "2.1.0", "deepspeed": "0.14.4"})
    assert "--no_ssh_check" in p.argv and "--launcher" in p.argv, p.argv


def test_an_uneven_slurm_step_is_wired_by_no_node():
    """Tasks 2,1,1: node 0 cannot be wired (two tasks), so no node may wait for its rendezvous;
    every node's plan names the problem instead."""
    for rank in range(3):
        cfg, p = make(example("slurm", 3, rank, MNP_LAUNCHER="mpirun",
                              SLURM_STEP_TASKS_PER_NODE="2,1(x2)"))
        assert not cfg.rendezvous, rank
        assert p.problems, rank


def test_the_json_dry_run_says_why_the_entrypoint_wires_a_slurm_step():
    cfg, _ = make(example("slurm", 3, 1, MNP_LAUNCHER="mpirun"))
    assert cfg.node.to_dict()["wired_because"].startswith("MNP_LAUNCHER=mpirun needs SSH")


@pytest.mark.parametrize("extra", [
    {"MNP_LAUNCHER": "torchrun"},  # needs no SSH: the scheduler's wiring stays
    {"MNP_LAUNCHER": "none"},
    {},  # the default under a Slurm step is torchrun
])
def test_a_slurm_step_keeps_the_schedulers_wiring_unless_the_launcher_needs_ssh(extra):
    cfg, p = make(example("slurm", **extra))
    assert not cfg.rendezvous and p.rendezvous is None and not p.needs_ssh


def test_mpirun_on_a_slurm_step_of_several_tasks_per_node_is_a_problem_naming_the_slurm_ways():
    """Each of two tasks would start its own rendezvous and sshd on the same ports."""
    env = example("slurm", MNP_LAUNCHER="mpirun", SLURM_STEP_TASKS_PER_NODE="2(x3)")
    cfg, p = make(env)
    assert not cfg.rendezvous
    assert any("2 tasks of this Slurm step run on this node" in line for line in p.problems)


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_mpirun_in_a_kubeflow_pod_is_still_a_problem(kind):
    """Only a scheduler table with a wiring id (a Slurm step) lets the entrypoint wire nodes:
    an MPIJob is how Kubeflow runs mpirun."""
    cfg, p = make(example(kind, 2, 1, MNP_LAUNCHER="mpirun"))
    assert not cfg.rendezvous
    assert p.problems and "needs SSH between the nodes" in p.problems[0]


@pytest.mark.parametrize("kind,master,port", [("pytorchjob", "job-master-0", "23456"),
                                              ("trainjob", "tj-node-0-0.tj", "29500")])
def test_kubeflow_pods_run_torchrun_with_the_controllers_master_and_no_pet_variables(
        kind, master, port):
    env = example(kind, 2, 1, PET_NPROC_PER_NODE="4")
    cfg, p = make(env)
    assert (cfg.scheduler, cfg.mode) == (kind, "child")
    assert p.argv[:11] == ["torchrun", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node",
                           "4", "--master_addr", master, "--master_port", port]
    assert not [name for name in p.environment if name.startswith("PET_")]
    assert any(n.startswith("cleared PET_") for n in p.notes)


def test_an_elastic_peer_runs_torchrun_on_the_rendezvous_endpoint():
    env = {"PET_RDZV_ENDPOINT": "etcd-service:2379", "PET_RDZV_BACKEND": "etcd",
           "PET_NNODES": "2:3", "PET_RDZV_ID": "imagenet", "PET_MAX_RESTARTS": "3"}
    cfg, p = make(env)
    assert cfg.mode == "peer" and p.problems == []
    assert p.argv == ["torchrun", "--nnodes", "2:3", "--nproc_per_node", "2", "--rdzv_backend",
                      "etcd", "--rdzv_endpoint", "etcd-service:2379", "--rdzv_id", "imagenet",
                      "--max_restarts", "3", "train.py"]
    assert not [name for name in p.environment if name.startswith("PET_")]


def test_an_mpijob_launcher_runs_mpirun_over_the_operators_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("mj-worker-0.mj.default.svc slots=2\nmj-worker-1.mj.default.svc slots=2\n")
    env = example("mpijob", OMPI_MCA_orte_default_hostfile=str(hostfile))
    cfg, p = make(env)
    assert cfg.mode == "launcher" and p.problems == [] and p.launcher["needs_ssh"]
    assert p.argv[:4] == ["/usr/bin/mpirun", "--allow-run-as-root", "-np", "4"]
    assert "--hostfile" not in p.argv
    assert p.environment["OMPI_MCA_orte_default_hostfile"] == str(hostfile)
    assert p.environment["OMPI_MCA_plm_rsh_args"] == (
        "-o ConnectionAttempts=10 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")
    assert "K_MPI_JOB_ROLE" not in p.argv  # the launcher's role does not reach the ranks


def test_an_mpijob_worker_serves_ssh_and_runs_nothing():
    cfg, p = make({"K_MPI_JOB_ROLE": "worker"})
    assert cfg.mode == "worker" and p.launcher["unit"] == "none" and p.problems == []
    assert p.children.startswith("none: the launcher reaches this pod")


def test_batch_keeps_its_rendezvous_and_ssh():
    env = example("batch", 2, 0, MNP_SECRET="s")
    cfg, p = make(env)
    assert cfg.rendezvous and p.needs_ssh and p.rendezvous.startswith("listen on port")
    assert p.role["scheduler"] == "batch" and p.role["detected_from"] == "AWS_BATCH_JOB_NODE_INDEX"


def test_mnp_scheduler_overrides_detection():
    cfg, p = make(dict(example("slurm"), MNP_SCHEDULER="single"))
    assert (cfg.scheduler, cfg.mode) == ("single", "single")
    assert p.role["detected_from"] == "MNP_SCHEDULER=single"


def test_a_bad_scheduler_value_is_one_line_and_exit_2():
    env = dict(os.environ, MNP_SCHEDULER="slurn", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "true"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "mnp-entrypoint: error: MNP_SCHEDULER: 'slurn' is not one of rank, batch, mpijob, "
        "pytorchjob, trainjob, slurm, single, auto (did you mean slurm?)"]


def test_the_json_dry_run_names_the_scheduler_and_the_variable():
    env = dict(os.environ, PYTHONPATH=str(REPO), MNP_DRY_RUN="json",
               **schedulers.MODULES["trainjob"].example(2, 0))
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "python3", "train.py"], env=env,
                          capture_output=True, text=True, timeout=60)
    data = json.loads(proc.stdout)
    assert (data["role"]["scheduler"], data["role"]["detected_from"], data["role"]["mode"]) == (
        "trainjob", "PET_NODE_RANK", "main")
    assert data["role"]["node"]["main_address"] == "tj-node-0-0.tj"


def test_every_node_of_a_scheduler_that_wired_them_runs_the_command_with_launcher_none():
    for rank in (0, 1):
        _, p = make(dict(example("slurm", 2, rank), MNP_LAUNCHER="none"))
        assert p.argv == ["python3", "train.py"] and p.problems == []


def test_several_tasks_per_node_of_a_slurm_step_would_each_start_torchrun_a_problem():
    env = example("slurm", 2, 1, SLURM_STEP_TASKS_PER_NODE="8(x2)", SLURM_NTASKS="16")
    _, p = make(env)
    assert p.problems and p.problems[0].startswith("8 tasks of this Slurm step run on this node")
    _, p = make(dict(env, MNP_LAUNCHER="none"))  # each task runs the command: the user's choice
    assert p.problems == []


def test_an_elastic_peer_names_no_node_index_or_master_it_cannot_know():
    _, p = make({"PET_RDZV_ENDPOINT": "peer-0:29400", "PET_NNODES": "3"})
    # MNP_ATTEMPT is known on every node (1 without a scheduler retry counter)
    assert [name for name in p.environment if name.startswith("MNP_")] == ["MNP_ATTEMPT"]


@pytest.mark.parametrize("command", [["torchrun", "--nproc_per_node", "1", "train.py"],
                                     ["python3", "-m", "torch.distributed.run", "train.py"],
                                     ["/usr/bin/mpirun", "python3", "allreduce.py"]])
def test_a_command_that_is_a_launcher_runs_as_is_with_the_schedulers_variables(command):
    env = example("pytorchjob", 2, 1)
    _, p = make(env, command)
    assert p.argv == command and p.launcher["unit"] == "none" and p.problems == []
    assert p.environment["PET_NNODES"] == "2"  # left for the user's torchrun to read
    program = command[0].split("/")[-1]
    assert any(f"starts {program} itself" in n or "-m torch" in n for n in p.notes), p.notes
    _, p = make(dict(env, MNP_LAUNCHER="torchrun"), ["python3", "train.py"])
    assert p.argv[0] == "torchrun"


def test_batch_refuses_to_wrap_a_launcher_command_in_its_own():
    """issue 23: on Batch the entrypoint starts a launcher (mpirun by default) around the command;
    around `torchrun train.py` that nests jobs, so it is a problem line (tests in
    test_ep_launcher_command.py)."""
    _, p = make(example("batch", 2, 0, MNP_SECRET="s"), ["torchrun", "train.py"])
    assert p.problems and p.problems[0].startswith("the command starts torchrun itself")
