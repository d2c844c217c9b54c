"""Issue 24: the start-up health gate's checks, MNP_ATTEMPT, and the outcomes' classes."""

import json
import os
from types import SimpleNamespace

import pytest

from entrypoint.core import errors
from entrypoint.plan import make as plan_mod
from entrypoint.probe import health
from entrypoint.probe.facts import NodeFacts
from entrypoint.run import outcome
from entrypoint.schedulers import mpijob
from entrypoint.settings import config
from matrix.model.instances import INSTANCE_TYPES


def test_the_promises_are_the_instance_tables():
    """Each row's promise is read from the right fields of the generated table (whose freshness
    tests/test_instances.py holds): a type outside the table promises nothing."""
    for name, row in INSTANCE_TYPES.items():
        assert health.promise(name) == {"gpus": row.gpus, "hpus": row.hpus,
                                        "efa": row.efa_interfaces, "shm_mib": row.shm_mib}, name
    assert health.promise("g4dn.12xlarge") is None and health.promise(None) is None


def gpu_node(gpus=8, efa=4, shm_mib=8192, itype="p4d.24xlarge"):
    return NodeFacts(instance_type=itype, instance_source="MNP_INSTANCE_TYPE", gpus=gpus,
                     slots=gpus, slots_source=f"nvidia-smi -L ({gpus} GPUs)",
                     efa_devices=[f"uverbs{i}" for i in range(efa)], shm_bytes=shm_mib << 20)


def test_a_healthy_node_passes_each_check_against_its_row():
    results = health.checks("basic", gpu_node(), "efa")
    assert [r["check"] for r in results] == ["GPUs", "EFA devices", "/dev/shm MiB"]
    assert all(r["ok"] for r in results) and health.failed(results) == []
    assert results[0]["row"] == "matrix/model/instances.yaml row p4d.24xlarge: gpus 8"


@pytest.mark.parametrize(("facts", "words"), [
    (gpu_node(gpus=7), "GPUs: 7 found (nvidia-smi -L (7 GPUs)), fewer than the 8 the instance "
                       "type promises (matrix/model/instances.yaml row p4d.24xlarge: gpus 8)"),
    (gpu_node(efa=3), "EFA devices: 3 found (/dev/infiniband/uverbs*), fewer than the 4"),
    (gpu_node(shm_mib=64), "/dev/shm MiB: 64 found (statvfs /dev/shm), fewer than the 8192"),
])
def test_a_node_short_of_its_promise_fails_naming_what_and_the_row(facts, words):
    (line,) = health.failed(health.checks("basic", facts, "efa"))
    assert line.startswith(words), line


def test_no_checks_when_off_or_the_type_is_unknown_and_no_efa_check_on_tcp():
    assert health.checks("off", gpu_node(gpus=1), "efa") == []
    assert health.checks("basic", gpu_node(itype=None), "efa") == []
    assert "EFA devices" not in [r["check"] for r in health.checks("basic", gpu_node(efa=0),
                                                                   "tcp")]


class Stat:
    def __init__(self, free_mib, dev=1):
        self.f_bavail, self.f_frsize, self.f_blocks, self.f_fsid = free_mib, 1 << 20, 10 ** 6, dev


def test_free_space_names_each_full_writable_file_system_once():
    mounts = ("overlay / overlay rw,relatime 0 0\n"
              "proc /proc proc rw 0 0\n"
              "/dev/vda /fsx ext4 rw 0 0\n"
              "/dev/vda /etc/hosts ext4 rw 0 0\n"
              "/dev/vdb /data xfs ro 0 0\n"
              "tmpfs /dev/shm tmpfs rw 0 0\n")
    sizes = {"/": Stat(50000, 1), "/fsx": Stat(100, 2), "/etc/hosts": Stat(100, 2),
             "/data": Stat(1, 3)}
    low = health.free_space(mounts, statvfs=lambda p: sizes[p])
    assert low == ["/fsx (ext4) has 100 MiB free, below the 1024 MiB a job needs to write its "
                   "checkpoints"]


def nodes(fwd, rev):
    return [{"node": i, "in_fwd": f, "in_rev": r} for i, (f, r) in enumerate(zip(fwd, rev))]


def test_the_verdict_names_the_node_whose_every_link_is_slow():
    # node 2's sends are throttled: node 0 receives it forward, node 1 in reverse
    result = {"nodes": nodes([0.05, 1.0, 0.9], [0.8, 0.05, 1.1]), "busbw": None}
    probe = health.bandwidth_plan("tcp", "none", None)
    ok, slowest, line = health.verdict(result, probe)
    assert not ok and slowest == 2
    assert line.startswith("node 2: 0.05 Gbit/s link bandwidth, floor 0.20 Gbit/s")
    ok, slowest, line = health.verdict({"nodes": nodes([1, 1, 1], [1, 1, 1]), "busbw": 2.0},
                                       probe)
    assert ok and "all-reduce bus bandwidth 2.00 GB/s" in line


def test_the_all_reduce_floor_cites_the_published_run():
    probe = health.bandwidth_plan("efa", "gpu", "p5.48xlarge")
    assert probe["backend"] == "nccl" and probe["allreduce_floor_gbs"] == 83.0
    assert probe["link_floor_gbps"] == health.TCP_LINK_FLOOR_GBPS
    ok, _, line = health.verdict({"nodes": nodes([90, 90], [90, 90]), "busbw": 80.0}, probe)
    assert not ok and "all-reduce bus bandwidth 80.0 GB/s, floor 83.0 GB/s" in line
    # the lowest healthy published p5 pair (166.62 GB/s in-place, 256 MiB) passes with room
    ok, _, _ = health.verdict({"nodes": nodes([90, 90], [90, 90]), "busbw": 166.62}, probe)
    assert ok


# -- MNP_ATTEMPT -----------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "attempt"), [
    ({}, 1), ({"AWS_BATCH_JOB_ATTEMPT": "3"}, 3), ({"SLURM_RESTART_COUNT": "0"}, 1),
    ({"SLURM_RESTART_COUNT": "2"}, 3), ({"TORCHELASTIC_RESTART_COUNT": "1"}, 2),
])
def test_the_attempt_comes_from_the_schedulers_counter(env, attempt):
    cfg = config.load(env)
    assert cfg.attempt == attempt


def test_a_bad_counter_is_one_line_naming_it():
    with pytest.raises(config.ConfigError, match="AWS_BATCH_JOB_ATTEMPT: 'x' is not an integer"):
        config.load({"AWS_BATCH_JOB_ATTEMPT": "x"})


def test_the_attempt_reaches_the_command_and_the_gate_is_in_the_plan(local_node, tmp_path):
    env = {"AWS_BATCH_JOB_ATTEMPT": "2", "MNP_INSTANCE_TYPE": "c5n.18xlarge"}
    dry = local_node.run(["python3", "t.py"], MNP_DRY_RUN="json", **env)
    plan = json.loads(dry.stdout)
    assert plan["environment"]["MNP_ATTEMPT"] == "2"
    assert plan["health"]["mode"] == "basic" and plan["health"]["instance_row"] == "c5n.18xlarge"
    text = local_node.run(["python3", "t.py"], MNP_DRY_RUN="1", MNP_HEALTH="full", **env).stdout
    assert "health (MNP_HEALTH=full)" in text and "bandwidth probe (gloo, at most 60s)" in text
    real = local_node.run(["sh", "-c", 'echo "attempt $MNP_ATTEMPT"'], MNP_HEALTH="off",
                          AWS_BATCH_JOB_ATTEMPT="2")
    assert real.returncode == 0 and real.stdout == "attempt 2\n", real.stderr


def test_a_single_node_short_of_its_shm_fails_basic_with_the_infrastructure_code(local_node):
    # this host's /dev/shm is below the 64000 MiB a dl1.24xlarge gets
    shm = os.statvfs("/dev/shm")
    if shm.f_blocks * shm.f_frsize >= 64000 << 20:
        pytest.skip("this host's /dev/shm is as large as a dl1's")
    result = local_node.run(["true"], MNP_INSTANCE_TYPE="dl1.24xlarge", MNP_SLOTS_PER_NODE="1")
    assert result.returncode == errors.INFRASTRUCTURE_EXIT, result.stderr
    last = result.stderr.splitlines()[-1]
    assert "exit 200 (infrastructure on node 0): health check failed on node 0: " in last
    assert "/dev/shm MiB" in last and "row dl1.24xlarge: shm_mib 64000" in last
    assert local_node.run(["true"], MNP_INSTANCE_TYPE="dl1.24xlarge", MNP_SLOTS_PER_NODE="1",
                          MNP_HEALTH="off").returncode == 0


# -- the outcomes ----------------------------------------------------------------------------

def test_a_childs_status_becomes_the_jobs_class():
    assert outcome.of_child(2, errors.INFRASTRUCTURE_EXIT).cls == errors.INFRASTRUCTURE
    assert outcome.of_child(2, 143).code == errors.INFRASTRUCTURE_EXIT  # its host went away
    assert (outcome.of_child(2, 3).code, outcome.of_child(2, 3).cls) == (3, errors.USER)
    assert outcome.of_child(1, 2).cls == errors.CONFIGURATION
    assert outcome.of_command(139, 0).cls == errors.USER  # a segfault is the command's


def test_every_plan_sets_mnp_attempt():
    cfg = config.Config(attempt=4, attempt_source="AWS_BATCH_JOB_ATTEMPT=4")
    facts = NodeFacts(binaries={"mpirun": "/usr/bin/mpirun"})
    p = plan_mod.make_plan(cfg, facts, ["python3", "t.py"], {})
    assert p.value("MNP_ATTEMPT") == "4"
    entry = [e for e in p.env if e["name"] == "MNP_ATTEMPT"][0]
    assert "resume from your last checkpoint" in entry["reason"]
    assert SimpleNamespace(**p.health).mode == "basic"


# -- a node that runs no ranks; the dry run's exit status (issue 32) --------------------------

def _launcher_of_a_gpu_mpijob(local_node, tmp_path):
    """What a GPU MPIJob's launcher pod sees: the operator's variables and hostfile, the job's
    MNP_INSTANCE_TYPE (the workers' type), and no GPU or EFA device (this host has none)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"job-worker-{i}.job.default.svc slots=8\n" for i in range(3)))
    bindir = local_node.fake_program("mpirun", "#!/bin/sh\nexit 0\n")
    env = dict(mpijob.example(3), OMPI_MCA_orte_default_hostfile=str(hostfile),
               MNP_INSTANCE_TYPE="p4d.24xlarge", MNP_FABRIC="efa", MNP_LAUNCHER="mpirun",
               MNP_SLOTS_PER_NODE="8", NVIDIA_VISIBLE_DEVICES="")
    return local_node.env(**env, PATH=f"{bindir}:{os.environ['PATH']}")


def test_a_node_that_runs_no_ranks_checks_no_device_against_the_row(local_node, tmp_path):
    env = _launcher_of_a_gpu_mpijob(local_node, tmp_path)
    dry = local_node.run(["python3", "train.py"], env=dict(env, MNP_DRY_RUN="json"))
    plan = json.loads(dry.stdout)
    assert plan["role"]["mode"] == "launcher"
    assert plan["health"]["checks"] == [] and plan["problems"] == [], plan["health"]
    assert dry.returncode == 0, dry.stderr
    real = local_node.run(["python3", "train.py"], env=env)
    assert real.returncode == 0, real.stderr  # the stand-in mpirun ran; no exit 200


def test_a_failing_health_check_makes_the_dry_run_exit_1(local_node):
    # a node of a p4d job (it runs ranks) on this host: no GPU, fewer than the row's 8
    dry = local_node.run(["python3", "t.py"], MNP_DRY_RUN="1", MNP_INSTANCE_TYPE="p4d.24xlarge",
                         MNP_FABRIC="tcp", MNP_SLOTS_PER_NODE="1")
    assert dry.returncode == 1, dry.stdout
    assert ("health check: GPUs found 0, expected >= 8 (matrix/model/instances.yaml row p4d.24xlarge: gpus 8)"
            ": FAILS (a real run stops here)") in dry.stdout
    as_json = local_node.run(["python3", "t.py"], MNP_DRY_RUN="json",
                             MNP_INSTANCE_TYPE="p4d.24xlarge", MNP_FABRIC="tcp",
                             MNP_SLOTS_PER_NODE="1")
    assert as_json.returncode == 1
    assert local_node.run(["python3", "t.py"], MNP_DRY_RUN="1", MNP_INSTANCE_TYPE="p4d.24xlarge",
                          MNP_FABRIC="tcp", MNP_SLOTS_PER_NODE="1",
                          MNP_HEALTH="off").returncode == 0
