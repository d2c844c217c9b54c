"""Scheduler adapters: each one's node table from the variables its scheduler really sets, the
detection order, ``MNP_SCHEDULER``, and one-line errors naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import schedulers
from entrypoint.schedulers import batch, mpijob, pytorchjob, rank, single, slurm, trainjob
from entrypoint.settings import config
from entrypoint.settings.config import ConfigError

# What a task saw under `srun -N3 --ntasks-per-node=1` on node2 of a real Slurm 22.05 cluster
# (the variables the adapter reads, copied from the dump).
SRUN_NODE2 = {
    "SLURMD_NODENAME": "node2", "SLURM_JOB_ID": "31", "SLURM_JOBID": "31",
    "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3", "SLURM_LOCALID": "0",
    "SLURM_NNODES": "3", "SLURM_NODEID": "1", "SLURM_NODELIST": "node[1-3]", "SLURM_NPROCS": "3",
    "SLURM_NTASKS": "3", "SLURM_PROCID": "1", "SLURM_STEPID": "0", "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[1-3]", "SLURM_STEP_NUM_NODES": "3",
    "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
    "SLURM_TASKS_PER_NODE": "1(x3)",
}
# The batch script of `sbatch -N3 --ntasks-per-node=2` on node1: no SLURM_STEP_*.
SBATCH_SCRIPT = {
    "SLURMD_NODENAME": "node1", "SLURM_JOB_ID": "32", "SLURM_JOB_NODELIST": "node[1-3]",
    "SLURM_JOB_NUM_NODES": "3", "SLURM_LOCALID": "0", "SLURM_NNODES": "3", "SLURM_NODEID": "0",
    "SLURM_NODELIST": "node[1-3]", "SLURM_NTASKS": "6", "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_JOB_CPUS_PER_NODE": "2(x3)",
}
BATCH_CHILD = {
    "AWS_BATCH_JOB_ID": "abc#1", "AWS_BATCH_JOB_NODE_INDEX": "1",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "3",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.0.5",
}
# PyTorchJob pj (Master + 1 Worker), the worker's pod; training-operator release-1.9 envvar.go.
PYTORCHJOB_WORKER = {
    "MASTER_ADDR": "pj-master-0", "PET_MASTER_ADDR": "pj-master-0", "MASTER_PORT": "23456",
    "PET_MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1", "PET_NODE_RANK": "1",
    "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PYTHONUNBUFFERED": "1",
}
# An elastic PyTorchJob with etcd (elastic.go): no master, ranks from the rendezvous.
PYTORCHJOB_ELASTIC = {
    "PET_RDZV_ENDPOINT": "etcd-service:2379", "PET_RDZV_BACKEND": "etcd", "PET_NNODES": "1:3",
    "PET_RDZV_ID": "imagenet", "PET_MAX_RESTARTS": "3", "PET_NPROC_PER_NODE": "8",
}
# TrainJob tj, node 1 (trainer torch plugin).
TRAINJOB_NODE1 = {
    "PET_NNODES": "2", "PET_NPROC_PER_NODE": "8", "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500", "JOB_COMPLETION_INDEX": "1",
}
MPIJOB_LAUNCHER = {
    "K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10", "OMPI_MCA_orte_set_default_slots": "8",
}


def test_srun_task_on_node2():
    table = schedulers.choose(SRUN_NODE2)
    assert (table.scheduler, table.detected_from, table.role) == ("slurm", "SLURM_JOB_ID", "child")
    assert (table.node_rank, table.num_nodes, table.main_address) == (1, 3, "node1")
    assert table.hosts == ["node1", "node2", "node3"] and table.slots == [1, 1, 1]
    assert table.rendezvous is False
    assert table.extra["launch"] == "srun step 0"
    assert table.extra["this node"] == "node2"


def test_srun_task_on_the_first_node_is_main():
    assert schedulers.choose(dict(SRUN_NODE2, SLURM_NODEID="0", SLURM_PROCID="0")).role == "main"


def test_a_one_node_srun_step_is_single():
    env = dict(SRUN_NODE2, SLURM_NODEID="0", SLURM_PROCID="0", SLURM_STEP_NODELIST="node2",
               SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE="1", SLURM_NTASKS="1")
    table = schedulers.choose(env)
    assert (table.role, table.hosts, table.main_address) == ("single", ["node2"], "node2")


def test_a_step_on_part_of_the_job_uses_the_steps_nodes():
    env = dict(SRUN_NODE2, SLURM_STEP_NODELIST="node[2-3]", SLURM_STEP_NUM_NODES="2",
               SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_NODEID="0", SLURM_NTASKS="2",
               SLURM_PROCID="0")
    table = schedulers.choose(env)
    assert (table.hosts, table.main_address, table.node_rank) == (["node2", "node3"], "node2", 0)


def test_the_sbatch_script_is_the_launcher_of_the_allocation():
    table = schedulers.choose(SBATCH_SCRIPT)
    assert (table.scheduler, table.role, table.node_rank) == ("slurm", "launcher", 0)
    assert table.hosts == ["node1", "node2", "node3"] and table.slots == [2, 2, 2]
    assert "batch script" in table.extra["launch"]


def test_an_salloc_shell_has_no_node_rank():
    env = {k: v for k, v in SBATCH_SCRIPT.items() if k not in ("SLURM_NODEID", "SLURM_PROCID",
                                                               "SLURM_LOCALID")}
    table = schedulers.choose(env)
    assert (table.role, table.node_rank, table.num_nodes) == ("launcher", None, 3)


@pytest.mark.parametrize("changes, variable", [
    ({"SLURM_NODEID": "one"}, "SLURM_NODEID"),
    ({"SLURM_NODEID": "3"}, "SLURM_NODEID"),
    ({"SLURM_NODEID": "-1"}, "SLURM_NODEID"),
    ({"SLURM_NODEID": None}, "SLURM_NODEID"),
    ({"SLURM_STEP_NODELIST": "node[1-3"}, "SLURM_STEP_NODELIST"),
    ({"SLURM_STEP_NODELIST": "node[1-4]"}, "SLURM_STEP_NODELIST"),
    ({"SLURM_STEP_NUM_NODES": "x"}, "SLURM_STEP_NUM_NODES"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_STEP_TASKS_PER_NODE": "one"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_PROCID": "3"}, "SLURM_PROCID"),
])
def test_bad_slurm_values_are_one_line_naming_the_variable(changes, variable):
    env = dict(SRUN_NODE2)
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    with pytest.raises(ConfigError) as info:
        schedulers.choose(env)
    assert info.value.variable == variable
    assert "\n" not in str(info.value)


def test_slurm_without_a_nodelist_names_the_missing_variable():
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST: is not set"):
        slurm.table({"SLURM_JOB_ID": "1"})


def test_batch_child_and_its_parity_with_config():
    table = schedulers.choose(BATCH_CHILD)
    assert (table.scheduler, table.role, table.node_rank, table.num_nodes) == ("batch", "child",
                                                                               1, 3)
    assert (table.main_address, table.rendezvous, table.main_rank) == ("10.0.0.5", True, 0)
    cfg = config.load(BATCH_CHILD)  # today's Batch reading: the adapter must agree with it
    assert (cfg.mode, cfg.node_index, cfg.num_nodes, cfg.main_address) == (
        table.role, table.node_rank, table.num_nodes, table.main_address)


@pytest.mark.parametrize("env", [
    {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
     "AWS_BATCH_JOB_NUM_NODES": "3"},
    {"AWS_BATCH_JOB_NODE_INDEX": "2", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "2",
     "AWS_BATCH_JOB_NUM_NODES": "3"},
    {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
     "AWS_BATCH_JOB_NUM_NODES": "1"},
])
def test_batch_roles_agree_with_config(env):
    table, cfg = schedulers.choose(env), config.load(env)
    assert (table.role, table.node_rank, table.main_rank) == (cfg.mode, cfg.node_index,
                                                              cfg.main_index)
    assert table.rendezvous == (cfg.mode != "single")


@pytest.mark.parametrize("changes, variable", [
    ({"AWS_BATCH_JOB_NUM_NODES": None}, "AWS_BATCH_JOB_NUM_NODES"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "3"}, "AWS_BATCH_JOB_NODE_INDEX"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "x"}, "AWS_BATCH_JOB_NODE_INDEX"),
    ({"AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": None},
     "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
    ({"AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "127.0.0.1"},
     "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
])
def test_bad_batch_values_name_the_variable_like_config(changes, variable):
    env = dict(BATCH_CHILD)
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    with pytest.raises(ConfigError) as adapter:
        batch.table(env)
    with pytest.raises(ConfigError) as today:
        config.load(env)
    assert adapter.value.variable == today.value.variable == variable


def test_pytorchjob_worker():
    table = schedulers.choose(PYTORCHJOB_WORKER)
    assert (table.scheduler, table.detected_from, table.role) == ("pytorchjob", "PET_MASTER_ADDR",
                                                                  "child")
    assert (table.node_rank, table.num_nodes, table.main_address) == (1, 2, "pj-master-0")
    assert table.slots is None and table.extra["nproc per node"].startswith("auto")
    assert table.extra["master port"] == "23456"


def test_an_older_pytorchjob_without_pet_variables():
    env = {"MASTER_ADDR": "pj-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "0"}
    table = schedulers.choose(env)
    assert (table.scheduler, table.role, table.num_nodes) == ("pytorchjob", "main", 3)


def test_elastic_pytorchjob_is_a_peer_with_its_bounds():
    table = schedulers.choose(PYTORCHJOB_ELASTIC)
    assert (table.scheduler, table.detected_from, table.role) == ("pytorchjob",
                                                                  "PET_RDZV_ENDPOINT", "peer")
    assert (table.node_rank, table.num_nodes, table.slots) == (None, 3, [8, 8, 8])
    assert table.extra["nnodes"] == "1:3" and table.extra["rdzv backend"] == "etcd"
    assert table.extra["rdzv endpoint"] == "etcd-service:2379"
    assert table.extra["max restarts"] == "3"


@pytest.mark.parametrize("changes, variable", [
    ({"PET_NNODES": "3:1"}, "PET_NNODES"),
    ({"PET_NNODES": "two"}, "PET_NNODES"),
    ({"PET_RDZV_ENDPOINT": "etcd-service:99999"}, "PET_RDZV_ENDPOINT"),
    ({"PET_MAX_RESTARTS": "-1"}, "PET_MAX_RESTARTS"),
    ({"PET_NPROC_PER_NODE": "0"}, "PET_NPROC_PER_NODE"),
])
def test_bad_elastic_values(changes, variable):
    with pytest.raises(ConfigError) as info:
        pytorchjob.table(dict(PYTORCHJOB_ELASTIC, **changes))
    assert info.value.variable == variable


def test_pytorchjob_rank_must_be_below_the_node_count():
    with pytest.raises(ConfigError, match="PET_NODE_RANK: 2 is not below PET_NNODES=2"):
        schedulers.choose(dict(PYTORCHJOB_WORKER, PET_NODE_RANK="2", RANK="2"))


def test_trainjob_node():
    table = schedulers.choose(TRAINJOB_NODE1)
    assert (table.scheduler, table.detected_from, table.role) == ("trainjob", "PET_NODE_RANK",
                                                                  "child")
    assert (table.node_rank, table.num_nodes, table.main_address) == (1, 2, "tj-node-0-0.tj")
    assert table.slots == [8, 8] and table.extra["master port"] == "29500"


@pytest.mark.parametrize("changes, variable", [
    ({"PET_NODE_RANK": "2"}, "PET_NODE_RANK"),
    ({"PET_NODE_RANK": "x"}, "PET_NODE_RANK"),
    ({"PET_NNODES": "1:2"}, "PET_NNODES"),
    ({"PET_MASTER_PORT": "0"}, "PET_MASTER_PORT"),
])
def test_bad_trainjob_values(changes, variable):
    with pytest.raises(ConfigError) as info:
        trainjob.table(dict(TRAINJOB_NODE1, **changes))
    assert info.value.variable == variable


def test_mpijob_launcher_reads_the_operators_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("nccl-worker-0.nccl.default.svc slots=8\n"
                        "nccl-worker-1.nccl.default.svc slots=8\n")
    env = dict(MPIJOB_LAUNCHER, OMPI_MCA_orte_default_hostfile=str(hostfile))
    table = schedulers.choose(env)
    assert (table.scheduler, table.role, table.num_nodes) == ("mpijob", "launcher", 2)
    assert table.hosts == ["nccl-worker-0.nccl.default.svc", "nccl-worker-1.nccl.default.svc"]
    assert table.slots == [8, 8] and table.rendezvous is False


def test_mpijob_launcher_intel_hostfile_form(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# workers\nw-0.w.ns.svc:4\nw-1.w.ns.svc:4\n")
    table = mpijob.table({"K_MPI_JOB_ROLE": "launcher", "I_MPI_HYDRA_HOST_FILE": str(hostfile)})
    assert (table.hosts, table.slots) == (["w-0.w.ns.svc", "w-1.w.ns.svc"], [4, 4])


def test_mpijob_launcher_away_from_the_pod_says_the_hostfile_is_missing(tmp_path):
    env = dict(MPIJOB_LAUNCHER, OMPI_MCA_orte_default_hostfile=str(tmp_path / "none"))
    table = mpijob.table(env)
    assert table.hosts is None and table.extra["hostfile"].endswith(": not there")
    assert len(table.problems) == 1 and "OMPI_MCA_orte_default_hostfile=" in table.problems[0]


def test_a_bad_hostfile_line_names_the_variable_and_line(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w-0 slots=8\nw-1 slots=many\n")
    env = dict(MPIJOB_LAUNCHER, OMPI_MCA_orte_default_hostfile=str(hostfile))
    with pytest.raises(ConfigError, match=r"OMPI_MCA_orte_default_hostfile: .*line 2: 'many'"):
        schedulers.choose(env)


def test_mpijob_worker_and_bad_role():
    assert schedulers.choose({"K_MPI_JOB_ROLE": "worker"}).role == "worker"
    with pytest.raises(ConfigError, match="K_MPI_JOB_ROLE: 'master' is not launcher or worker"):
        schedulers.choose({"K_MPI_JOB_ROLE": "master"})


@pytest.mark.parametrize("env, variable", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, "OMPI_COMM_WORLD_RANK"),
    (dict(SRUN_NODE2, PMIX_RANK="1", PMIX_NAMESPACE="slurm.pmix.31.0"), "PMIX_RANK"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, "PMI_RANK"),
    (dict(PYTORCHJOB_WORKER, LOCAL_RANK="0", TORCHELASTIC_RUN_ID="none"), "LOCAL_RANK"),
])
def test_a_rank_runs_the_command_whatever_scheduler_started_the_job(env, variable):
    table = schedulers.choose(env)
    assert (table.scheduler, table.detected_from, table.role) == ("rank", variable, "rank")


def test_a_rank_beyond_the_world_size_is_an_error():
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_RANK: 4 is not below "
                                          "OMPI_COMM_WORLD_SIZE=4"):
        rank.table({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"})


def test_no_variables_is_a_single_node():
    table = schedulers.choose({"HOME": "/root", "MASTER_ADDR": "x"})
    assert (table.scheduler, table.detected_from, table.role, table.num_nodes) == (
        "single", None, "single", 1)
    assert table == single.table({})


def test_order_is_data_and_covers_every_adapter():
    assert schedulers.NAMES == ("rank", "batch", "mpijob", "pytorchjob", "trainjob", "slurm",
                                "single")
    assert schedulers.ORDER[-1] is single and single.detect({"SLURM_JOB_ID": "1"}) is None


def test_each_example_is_detected_by_its_own_adapter():
    examples = {"slurm": SRUN_NODE2, "batch": BATCH_CHILD, "pytorchjob": PYTORCHJOB_WORKER,
                "trainjob": TRAINJOB_NODE1, "mpijob": MPIJOB_LAUNCHER}
    for name, env in examples.items():
        found = [m.NAME for m in schedulers.ORDER if m.detect(env)]
        # A PyTorchJob also sets PET_NODE_RANK (training-operator >= v1.7.0), which TrainJob's
        # adapter recognises: the order puts pytorchjob first. Every other example is
        # recognised by one adapter.
        expected = [name, "trainjob"] if name == "pytorchjob" else [name]
        assert found == expected, (name, found)
        assert schedulers.detect(env)[0] == name


def test_mnp_scheduler_overrides_detection():
    env = dict(SRUN_NODE2, PMIX_RANK="1", MNP_SCHEDULER="slurm")
    table = schedulers.choose(env)
    assert (table.scheduler, table.detected_from) == ("slurm", "MNP_SCHEDULER=slurm")
    assert schedulers.choose(dict(SRUN_NODE2, MNP_SCHEDULER="single")).role == "single"
    assert schedulers.choose(dict(SRUN_NODE2, MNP_SCHEDULER="AUTO")).scheduler == "slurm"


def test_a_forced_scheduler_without_its_variables_names_what_is_missing():
    with pytest.raises(ConfigError, match="SLURM_JOB_ID: is not set"):
        schedulers.choose({"MNP_SCHEDULER": "slurm"})


def test_an_unknown_scheduler_is_one_line_with_a_suggestion():
    with pytest.raises(ConfigError) as info:
        schedulers.choose({"MNP_SCHEDULER": "slrum"})
    message = str(info.value)
    assert message.startswith("MNP_SCHEDULER: 'slrum' is not one of rank, batch")
    assert message.endswith("(did you mean slurm?)") and "\n" not in message


def test_dry_run_lines_say_what_was_detected_and_from_where():
    lines = schedulers.choose(SRUN_NODE2).lines()
    assert lines[:4] == ["scheduler: slurm (detected from SLURM_JOB_ID)",
                         "role: child (node 1 of 3)", "main node: node1",
                         "hosts: node1, node2, node3 (3)"]
    assert "slots per node (from the scheduler): 1(x3)" in lines
    assert "nodes wired by: the scheduler" in lines
    batch_lines = schedulers.choose(BATCH_CHILD).lines()
    assert "nodes wired by: the entrypoint (rendezvous with the main node)" in batch_lines


def test_long_host_lists_stay_one_short_line():
    env = dict(SRUN_NODE2, SLURM_STEP_NODELIST="n[001-200]", SLURM_STEP_NUM_NODES="200",
               SLURM_STEP_TASKS_PER_NODE="8(x199),4", SLURM_NTASKS="1596")
    lines = schedulers.choose(env).lines()
    hosts = [line for line in lines if line.startswith("hosts:")][0]
    assert hosts.endswith("n008, ... 192 more (200)")
    assert "slots per node (from the scheduler): 8(x199),4" in lines


@pytest.mark.parametrize("name", schedulers.NAMES)
@pytest.mark.parametrize("num_nodes, node_rank", [(1, 0), (2, 0), (2, 1), (4, 3)])
def test_each_example_environment_is_recognised_by_its_own_adapter(name, num_nodes, node_rank):
    """``example`` feeds ``invoke explain --scheduler``: it must be what ``choose`` reads back."""
    env = schedulers.MODULES[name].example(num_nodes, node_rank)
    table = schedulers.choose(env)
    assert table.scheduler == name
    if name in ("batch", "slurm", "pytorchjob", "trainjob"):
        assert (table.node_rank, table.num_nodes) == (node_rank, num_nodes)
        expected = "single" if num_nodes == 1 else ("main" if node_rank == 0 else "child")
        assert table.role == expected


def test_a_trainjob_node_without_its_master_address_is_one_line_naming_pet_master_addr():
    """issue 23: before, the plan put `--master_addr '<node-0>'` on torchrun and exited 0. The
    torch plugin sets PET_MASTER_ADDR for torchrun whenever it sets PET_NODE_RANK (torch.go
    EnforceMLPolicy); without it no node can find node 0."""
    env = {k: v for k, v in TRAINJOB_NODE1.items() if not k.startswith("PET_MASTER_")}
    with pytest.raises(ConfigError) as info:
        schedulers.choose(env)
    message = str(info.value)
    assert message.startswith("PET_MASTER_ADDR: is not set, but PET_NODE_RANK=1 and "
                              "PET_NNODES=2 are: the Trainer's torch plugin sets it for torchrun")
    assert "\n" not in message
    with pytest.raises(ConfigError, match="^PET_MASTER_ADDR: is not set"):
        schedulers.choose(dict(env, MNP_SCHEDULER="trainjob"))
    single_node = dict(env, PET_NNODES="1", PET_NODE_RANK="0")  # nothing to find
    assert schedulers.choose(single_node).role == "single"


def test_the_dry_run_of_a_trainjob_node_without_its_master_stops_with_exit_2():
    env = {k: v for k, v in TRAINJOB_NODE1.items() if not k.startswith("PET_MASTER_")}
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), MNP_DRY_RUN="1",
               **env)
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "python3", "train.py"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("mnp-entrypoint: error: PET_MASTER_ADDR: is not set")
    assert len(proc.stderr.strip().splitlines()) == 1
