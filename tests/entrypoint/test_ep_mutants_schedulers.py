"""Scheduler adapters: the exact decisions mutation testing found unchecked (bench/mutation.py).

Each test states a behaviour a user sees: which variable a one-line error names, what the dry
run's lines say, the defaults a node table has, the bounds of a count. They go through the public
functions (``schedulers.choose``, each adapter's ``table`` and ``example``, ``NodeTable``)."""

import operator

import pytest

from entrypoint import schedulers
from entrypoint.schedulers import base, batch, mpijob, nodelist, pytorchjob, rank, slurm, trainjob
from entrypoint.settings.config import ConfigError

BATCH = {"AWS_BATCH_JOB_ID": "abc#1", "AWS_BATCH_JOB_NODE_INDEX": "1",
         "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "3",
         "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.0.5"}


def error(function, *args):
    with pytest.raises(ConfigError) as caught:
        function(*args)
    return str(caught.value)


def without(env, *names):
    return {k: v for k, v in env.items() if k not in names}


# -- batch ------------------------------------------------------------------------------------
def test_batch_detected_from_the_node_index_whatever_the_role():
    for index, role in (("1", "child"), ("0", "main")):
        table = batch.table(dict(BATCH, AWS_BATCH_JOB_NODE_INDEX=index))
        assert (table.detected_from, table.role) == ("AWS_BATCH_JOB_NODE_INDEX", role)
    single = batch.table(dict(BATCH, AWS_BATCH_JOB_NUM_NODES="1", AWS_BATCH_JOB_NODE_INDEX="0"))
    assert (single.detected_from, single.role) == ("AWS_BATCH_JOB_NODE_INDEX", "single")


def test_batch_errors_name_the_right_variable():
    assert error(batch.table, {}) == (
        "AWS_BATCH_JOB_NUM_NODES: is not set: this is not an AWS Batch multi-node job")
    only_index = {"AWS_BATCH_JOB_NODE_INDEX": "1"}
    assert error(batch.table, only_index) == (
        "AWS_BATCH_JOB_MAIN_NODE_INDEX: is not set but AWS_BATCH_JOB_NODE_INDEX is: incomplete "
        "Batch MNP environment")
    two = {"AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0"}
    assert error(batch.table, two) == (
        "AWS_BATCH_JOB_NUM_NODES: is not set but AWS_BATCH_JOB_NODE_INDEX is: incomplete Batch "
        "MNP environment")
    only_num = {"AWS_BATCH_JOB_NUM_NODES": "3"}
    assert error(batch.table, only_num).startswith(
        "AWS_BATCH_JOB_NODE_INDEX: is not set but AWS_BATCH_JOB_NUM_NODES is")
    assert error(batch.table, dict(BATCH, AWS_BATCH_JOB_NUM_NODES="0")) == (
        "AWS_BATCH_JOB_NUM_NODES: 0 is below the minimum 1")


def test_batch_job_id_shown_only_when_set():
    assert batch.table(BATCH).extra == {"job id": "abc#1"}
    assert batch.table(without(BATCH, "AWS_BATCH_JOB_ID")).extra == {}


@pytest.mark.parametrize("address,message", [
    ("not-an-ip", "'not-an-ip' is not an IPv4 address"),
    ("127.0.0.1", "127.0.0.1 cannot be the main node's address"),
    ("0.0.0.0", "0.0.0.0 cannot be the main node's address"),
    ("224.0.0.1", "224.0.0.1 cannot be the main node's address"),
])
def test_batch_main_address_checked(address, message):
    env = dict(BATCH, AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=address)
    assert error(batch.table, env) == "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS: " + message


def test_batch_example_is_node_0_by_default():
    assert batch.example(3) == {"AWS_BATCH_JOB_ID": "<job-id>#0", "AWS_BATCH_JOB_NODE_INDEX": "0",
                                "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
                                "AWS_BATCH_JOB_NUM_NODES": "3"}
    assert batch.example(3, 2)["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] == "192.0.2.10"


# -- MNP_SCHEDULER ----------------------------------------------------------------------------
def test_unknown_scheduler_names_the_closest_one():
    message = error(schedulers.choose, {"MNP_SCHEDULER": "slrum"})
    assert message.startswith("MNP_SCHEDULER: 'slrum' is not one of rank, batch, ")
    assert message.endswith(" (did you mean slurm?)")
    assert "(did you mean" not in error(schedulers.choose, {"MNP_SCHEDULER": "zzzzzz"})


# -- NodeTable --------------------------------------------------------------------------------
def test_node_table_defaults():
    table = base.NodeTable("x", None, "single")
    assert (table.node_rank, table.num_nodes, table.main_rank) == (0, 1, 0)
    with pytest.raises(ValueError, match="unknown role 'boss'"):
        base.NodeTable("x", None, "boss")


def test_node_tables_compare_by_value():
    one, same = base.NodeTable("x", "A", "main", num_nodes=2), base.NodeTable("x", "A", "main",
                                                                                  num_nodes=2)
    other = base.NodeTable("x", "A", "child", num_nodes=2)
    # both operators, each way: __ne__ is its own method (Python 3.6 has no default for it)
    assert operator.eq(one, same) and not operator.ne(one, same)
    assert operator.ne(one, other) and not operator.eq(one, other)
    assert operator.ne(one, "NodeTable") and not operator.eq(one, object())
    assert repr(one).startswith("NodeTable(detected_from='A', elastic=None, extra={}, hosts=None, ")


def test_role_line_says_node_and_count_only_where_known():
    def role_line(**kwargs):
        return base.NodeTable("x", None, **kwargs).lines()[1]
    assert role_line(role="main", node_rank=0, num_nodes=3) == "role: main (node 0 of 3)"
    assert role_line(role="child", node_rank=None, num_nodes=None) == "role: child"
    assert role_line(role="launcher", num_nodes=2) == "role: launcher (starts the job on 2 node(s))"
    assert role_line(role="launcher", num_nodes=None) == "role: launcher"
    assert role_line(role="peer", num_nodes=3) == "role: peer"
    assert role_line(role="worker", num_nodes=3) == "role: worker"


def test_hosts_line_counts_what_it_does_not_show():
    nine = [f"n{i}" for i in range(9)]
    lines = base.NodeTable("x", None, "main", hosts=nine, num_nodes=9).lines()
    assert "hosts: n0, n1, n2, n3, n4, n5, n6, n7, ... 1 more (9)" in lines
    eight = base.NodeTable("x", None, "main", hosts=nine[:8], num_nodes=8).lines()
    assert "hosts: n0, n1, n2, n3, n4, n5, n6, n7 (8)" in eight


@pytest.mark.parametrize("slots,text", [
    ([2, 2, 2, 1], "2(x3),1"), ([1], "1"), ([4, 4], "4(x2)"), ([1, 2, 1], "1,2,1"),
    ([3, 3, 1, 1], "3(x2),1(x2)"),
])
def test_slots_line_in_slurms_short_form(slots, text):
    lines = base.NodeTable("x", None, "main", slots=slots).lines()
    assert "slots per node (from the scheduler): " + text in lines


def test_integer_bounds_and_messages():
    env = {"N": "5", "BAD": "five", "NEG": "-1"}
    assert base.integer(env, "N", maximum=5) == 5
    assert error(base.integer, env, "N", 0, 4) == "N: 5 is above the maximum 4"
    assert error(base.integer, env, "BAD") == "N: 'five' is not an integer".replace("N", "BAD")
    assert error(base.integer, env, "NEG") == "NEG: -1 is below the minimum 0"
    assert base.optional_integer(env, "UNSET") is None
    assert base.optional_integer({"Z": "0"}, "Z") == 0
    assert error(base.optional_integer, env, "NEG") == "NEG: -1 is below the minimum 0"


def test_slots_value_accepts_one_and_rejects_zero():
    assert base.slots_value({"S": "1"}, "S") == 1
    assert base.slots_value({"S": "auto"}, "S") is None
    assert error(base.slots_value, {"S": "0"}, "S") == "S: 0 is below the minimum 1"


# -- mpijob: the launcher's hostfile ----------------------------------------------------------
def launcher(path):
    return mpijob.table({"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(path)})


def test_hostfile_size_limit_is_exact(tmp_path):
    limit = 4 * 1024 * 1024
    path = tmp_path / "hostfile"
    head = b"node1 slots=2\n#"
    path.write_bytes(head + b"x" * (limit - len(head)))
    assert launcher(path).hosts == ["node1"]
    path.write_bytes(head + b"x" * (limit - len(head) + 1))
    assert error(launcher, path) == (
        f"OMPI_MCA_orte_default_hostfile: {ascii(str(path))} is larger than {limit} bytes")


@pytest.mark.parametrize("count,ok", [("0", False), ("1", True), ("4096", True), ("4097", False)])
def test_hostfile_slot_counts_are_1_to_max_slots(tmp_path, count, ok):
    path = tmp_path / "hostfile"
    path.write_text(f"node1 slots={count}\n")
    if ok:
        assert launcher(path).slots == [int(count)]
    else:
        assert error(launcher, path) == (f"OMPI_MCA_orte_default_hostfile: {ascii(str(path))} "
                                         f"line 1: {count!r} is not a slot count 1-4096")


def test_hostfile_host_colon_count_is_checked_as_one_count(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("node1:4:x\n")
    # one line naming the file's line, never a traceback from unpacking "node1:4:x"
    assert error(launcher, path).startswith(
        f"OMPI_MCA_orte_default_hostfile: {ascii(str(path))} line 1: ")


def test_hostfile_node_limit_and_empty_file(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("".join(f"n{i}\n" for i in range(10000)))
    table = launcher(path)
    assert table.num_nodes == 10000 and table.slots is None
    path.write_text("".join(f"n{i}\n" for i in range(10001)))
    assert error(launcher, path).endswith(f"{ascii(str(path))} names more than 10000 hosts")
    path.write_text("# nothing\n\n")
    assert error(launcher, path) == (
        f"OMPI_MCA_orte_default_hostfile: {ascii(str(path))} names no host")


def test_an_unreadable_hostfile_is_one_line():
    assert error(launcher, "/proc/self/mem") == (
        "OMPI_MCA_orte_default_hostfile: cannot read '/proc/self/mem': Input/output error")


def test_the_operators_default_hostfile_is_named_as_such():
    table = mpijob.table({"K_MPI_JOB_ROLE": "launcher"})
    assert table.extra["hostfile"].startswith(
        "/etc/mpi/hostfile (the operator's default path): ")  # not readable on this machine
    assert error(mpijob.table, {"K_MPI_JOB_ROLE": "boss"}) == (
        "K_MPI_JOB_ROLE: 'boss' is not launcher or worker")


# -- Slurm host lists and counts --------------------------------------------------------------
@pytest.mark.parametrize("text,message", [
    ("n[1", "'[' without ']' in 'n[1'"),
    ("n[[1]]", "nested '[' in 'n[[1]]'"),
    ("n1]", "']' without '[' in 'n1]'"),
    ("n[1]x", "'n[1]x': nothing may follow the last ']' (Slurm rejects it too)"),
    ("n[0-65536]", "range 0-65536 names more than 65536 hosts"),
    ("a[0-65535],b[1]", "the list names more than 65536 hosts (past the limit at 'b[1]')"),
])
def test_malformed_host_lists_say_why(text, message):
    with pytest.raises(ValueError) as caught:
        nodelist.expand(text)
    assert str(caught.value) == message


def test_host_list_limits_are_inclusive():
    assert len(nodelist.expand("n[0-65535]")) == 65536
    assert len(nodelist.expand("a[1-65535],b[1]")) == 65536


def test_task_counts_limits_and_messages():
    assert len(nodelist.expand_counts("1(x65535),2")) == 65536
    with pytest.raises(ValueError, match=r"^'1\(x65537\)' repeats 65537 times$"):
        nodelist.expand_counts("1(x65537)")
    with pytest.raises(ValueError) as caught:
        nodelist.expand_counts("2,a")
    assert str(caught.value) == "'a' is not N or N(xM)"


# -- Kubeflow: PyTorchJob (static and elastic), TrainJob; the ranks a launcher started ----------
STATIC = {"MASTER_ADDR": "pj-master-0", "RANK": "1", "WORLD_SIZE": "2"}
ELASTIC = {"PET_RDZV_ENDPOINT": "etcd-service:2379", "PET_NNODES": "1:3"}
TRAINJOB = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "tj-node-0-0.tj"}


def test_pytorchjob_static_roles_ranks_and_port():
    assert pytorchjob.detect(STATIC) == "MASTER_ADDR"
    assert pytorchjob.detect(dict(STATIC, PET_MASTER_ADDR="x")) == "PET_MASTER_ADDR"
    assert pytorchjob.detect(without(STATIC, "WORLD_SIZE")) is None
    child = pytorchjob.table(STATIC)
    assert (child.role, child.node_rank, child.num_nodes, child.main_address) == (
        "child", 1, 2, "pj-master-0")
    assert pytorchjob.table(dict(STATIC, RANK="0")).role == "main"
    assert pytorchjob.table(dict(STATIC, RANK="0", WORLD_SIZE="1")).role == "single"
    # release 1.9's PET_* win over the plain names
    table = pytorchjob.table(dict(STATIC, PET_NODE_RANK="0", PET_NNODES="4", MASTER_PORT="23456",
                                  PET_MASTER_PORT="29400"))
    assert (table.node_rank, table.num_nodes, table.master_port) == (0, 4, 29400)
    assert table.extra["master port"] == "29400"
    assert error(pytorchjob.table, dict(STATIC, RANK="2")) == "RANK: 2 is not below WORLD_SIZE=2"
    assert error(pytorchjob.table, dict(STATIC, PET_NODE_RANK="4", PET_NNODES="4")) == (
        "PET_NODE_RANK: 4 is not below PET_NNODES=4")


def test_pytorchjob_elastic_peer_and_its_lines():
    assert pytorchjob.detect(ELASTIC) == "PET_RDZV_ENDPOINT"
    peer = pytorchjob.table(ELASTIC)
    assert (peer.role, peer.node_rank, peer.num_nodes) == ("peer", None, 3)
    assert (peer.elastic.backend, peer.elastic.endpoint, peer.elastic.nnodes) == (
        "c10d", "etcd-service:2379", "1:3")
    assert peer.extra == {"rdzv endpoint": "etcd-service:2379", "nnodes": "1:3",
                          "rdzv backend": "c10d (torchrun's default here)"}
    full = pytorchjob.table(dict(ELASTIC, PET_RDZV_BACKEND="etcd", PET_MAX_RESTARTS="3",
                                 PET_RDZV_ID="job-1", PET_RDZV_CONF="timeout=900",
                                 PET_NPROC_PER_NODE="8", PET_RDZV_ENDPOINT="etcd-service"))
    assert full.elastic.endpoint == "etcd-service" and full.elastic.max_restarts == 3
    assert {k: full.extra[k] for k in ("rdzv backend", "max restarts", "rdzv id", "rdzv conf",
                                        "nproc per node")} == {
        "rdzv backend": "etcd", "max restarts": "3", "rdzv id": "job-1",
        "rdzv conf": "timeout=900", "nproc per node": "8 (PET_NPROC_PER_NODE)"}
    assert full.slots == [8, 8, 8] and full.slots_are == "processes"
    forced = pytorchjob.table({"PET_RDZV_ENDPOINT": "w-0:29400"})  # no PET_NNODES: one node
    assert forced.elastic.nnodes == "1:1" and forced.num_nodes == 1


@pytest.mark.parametrize("value,message", [
    ("0:2", "PET_NNODES: '0:2': need 1 <= MIN <= MAX <= 10000"),
    ("3:2", "PET_NNODES: '3:2': need 1 <= MIN <= MAX <= 10000"),
    ("1:10001", "PET_NNODES: '1:10001': need 1 <= MIN <= MAX <= 10000"),
    ("x", "PET_NNODES: 'x' is not N or MIN:MAX"),
])
def test_nnodes_bounds(value, message):
    assert error(pytorchjob.table, dict(ELASTIC, PET_NNODES=value)) == message


def test_nnodes_upper_bound_is_inclusive():
    assert pytorchjob.table(dict(ELASTIC, PET_NNODES="1:10000")).num_nodes == 10000
    assert pytorchjob.table(dict(ELASTIC, PET_NNODES="5")).elastic.nnodes == "5:5"


@pytest.mark.parametrize("value,expected", [
    ("etcd:1", ("etcd", 1)), ("etcd:65535", ("etcd", 65535)), ("etcd", ("etcd", None)),
    ("etcd:0", "PET_RDZV_ENDPOINT: 'etcd:0': the port must be 1-65535"),
    ("etcd:65536", "PET_RDZV_ENDPOINT: 'etcd:65536': the port must be 1-65535"),
    ("etcd:x", "PET_RDZV_ENDPOINT: 'etcd:x': the port must be 1-65535"),
    (":2379", "PET_RDZV_ENDPOINT: ':2379' is not HOST[:PORT]"),
    ("et cd:1", "PET_RDZV_ENDPOINT: 'et cd:1' is not HOST[:PORT]"),
])
def test_rendezvous_endpoint(value, expected):
    env = dict(ELASTIC, PET_RDZV_ENDPOINT=value)
    if isinstance(expected, str):
        assert error(pytorchjob.table, env) == expected
    else:
        host, port = expected
        assert pytorchjob.table(env).elastic.endpoint == host + (f":{port}" if port else "")


def test_nproc_per_node_names_its_variable():
    old = pytorchjob.table(dict(ELASTIC, PET_N_PROC_PER_NODE="4"))
    assert old.slots == [4, 4, 4] and old.extra["nproc per node"] == "4 (PET_N_PROC_PER_NODE)"
    auto = pytorchjob.table(dict(ELASTIC, PET_NPROC_PER_NODE="auto"))
    assert auto.slots is None and auto.slots_are is None
    assert auto.extra["nproc per node"].startswith("auto (PET_NPROC_PER_NODE)")


def test_trainjob_roles_port_and_errors():
    assert trainjob.detect(TRAINJOB) == "PET_NODE_RANK"
    assert trainjob.detect(without(TRAINJOB, "PET_NNODES")) is None
    node = trainjob.table(dict(TRAINJOB, PET_MASTER_PORT="29500", JOB_COMPLETION_INDEX="1"))
    assert (node.role, node.node_rank, node.num_nodes, node.main_address, node.master_port) == (
        "child", 1, 2, "tj-node-0-0.tj", 29500)
    assert node.extra == {"master port": "29500", "job completion index": "1"}
    assert trainjob.table(dict(TRAINJOB, PET_NODE_RANK="0")).role == "main"
    assert trainjob.table(dict(TRAINJOB, PET_NODE_RANK="0", PET_NNODES="1")).role == "single"
    assert trainjob.table(dict(TRAINJOB, PET_MASTER_ADDR="m:29400")).master_port == 29400
    assert error(trainjob.table, without(TRAINJOB, "PET_NNODES")) == (
        "PET_NNODES: is not set: a TrainJob node gets it from the trainer")
    assert error(trainjob.table, dict(TRAINJOB, PET_NNODES="1:2")) == (
        "PET_NNODES: 1:2: a TrainJob has a fixed node count")
    assert error(trainjob.table, dict(TRAINJOB, PET_NODE_RANK="2")) == (
        "PET_NODE_RANK: 2 is not below PET_NNODES=2")
    assert error(trainjob.table, dict(TRAINJOB, PET_MASTER_PORT="0")) == (
        "PET_MASTER_PORT: 0 is below the minimum 1")
    assert trainjob.example(2, 1)["PET_NODE_RANK"] == "1" and trainjob.example(2)[
        "JOB_COMPLETION_INDEX"] == "0"


@pytest.mark.parametrize("env,started_by,extra", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     "Open MPI mpirun", {"world size": "4 (OMPI_COMM_WORLD_SIZE)",
                         "local rank": "1 (OMPI_COMM_WORLD_LOCAL_RANK)"}),
    ({"PMIX_RANK": "2"}, "a PMIx server (srun --mpi=pmix or mpirun)", {}),
    ({"PMI_RANK": "0", "PMI_SIZE": "1"},
     "a PMI server (MPICH/Intel MPI hydra or srun --mpi=pmi2)", {"world size": "1 (PMI_SIZE)"}),
    ({"LOCAL_RANK": "0", "WORLD_SIZE": "8"}, "torchrun, torch.distributed.launch or deepspeed",
     {"world size": "8 (WORLD_SIZE)"}),
])
def test_a_rank_says_who_started_it(env, started_by, extra):
    table = rank.table(env)
    name = next(iter(env))
    assert (table.role, table.detected_from, table.rank) == ("rank", name, int(env[name]))
    assert table.extra == dict({"started by": started_by, "rank": f"{env[name]} ({name})"},
                               **extra)


def test_a_rank_beyond_its_world_is_an_error():
    assert error(rank.table, {"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"}) == (
        "OMPI_COMM_WORLD_RANK: 4 is not below OMPI_COMM_WORLD_SIZE=4")
    assert error(rank.table, {"PMI_RANK": "0", "PMI_SIZE": "0"}) == (
        "PMI_SIZE: 0 is below the minimum 1")
    assert rank.example(4, 2) == {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
                                  "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    assert rank.example(4)["OMPI_COMM_WORLD_RANK"] == "0"


# -- Slurm ------------------------------------------------------------------------------------
def test_slurm_step_and_script_variables():
    step = slurm.table(slurm.example(3, 1))
    assert (step.role, step.node_rank, step.main_address, step.slots) == (
        "child", 1, "node1", [1, 1, 1])
    assert step.extra == {"job id": "1234", "launch": "srun step 0", "this node": "node2",
                          "task": "SLURM_PROCID=1 of SLURM_NTASKS=3, SLURM_LOCALID=0"}
    assert slurm.table(slurm.example(1)).role == "single"
    assert slurm.table(slurm.example(2, 0)).role == "main"
    # a step's own list wins over the job's; a batch script reads the job's
    env = dict(slurm.example(3, 0), SLURM_STEP_NODELIST="node[1-2]", SLURM_STEP_NUM_NODES="2",
               SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_NTASKS="4")
    assert slurm.table(env).hosts == ["node1", "node2"]
    script = without(env, "SLURM_STEP_ID")
    launcher = slurm.table(script)
    assert (launcher.role, launcher.hosts, launcher.slots) == (
        "launcher", ["node1", "node2", "node3"], [1, 1, 1])
    assert launcher.extra["launch"] == "batch script or salloc shell (no SLURM_STEP_ID)"
    assert "task" not in launcher.extra
    salloc = slurm.table(without(script, "SLURM_NODEID"))
    assert salloc.role == "launcher" and salloc.node_rank is None
    old = slurm.table({"SLURM_JOBID": "7", "SLURM_STEPID": "2", "SLURM_NODEID": "0",
                       "SLURM_NODELIST": "a,b", "SLURM_GPUS_ON_NODE": "4"})
    assert (old.detected_from, old.extra["job id"], old.extra["launch"]) == (
        "SLURM_JOBID", "7", "srun step 2")
    assert old.extra["gpus on node"] == "4" and old.slots is None
    assert slurm.table(dict(slurm.example(2), SLURM_NTASKS="2")).extra["task"] == (
        "SLURM_PROCID=0 of SLURM_NTASKS=2, SLURM_LOCALID=0")
    unknown = slurm.table(without(slurm.example(2), "SLURM_NTASKS", "SLURM_LOCALID"))
    assert unknown.extra["task"] == "SLURM_PROCID=0 of SLURM_NTASKS=?, SLURM_LOCALID=?"


@pytest.mark.parametrize("change,message", [
    ({"SLURM_JOB_ID": None, "SLURM_JOBID": None}, "SLURM_JOB_ID: is not set: this is not a Slurm job"),
    ({"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None},
     "SLURM_JOB_NODELIST: is not set: Slurm names the job's nodes in it"),
    ({"SLURM_STEP_NODELIST": "node[1-"},
     "SLURM_STEP_NODELIST: is not a Slurm host list: '[' without ']' in 'node[1-'"),
    ({"SLURM_STEP_NODELIST": ","}, "SLURM_STEP_NODELIST: names no host"),
    ({"SLURM_STEP_NUM_NODES": "2"}, "SLURM_STEP_NODELIST: names 3 host(s) but SLURM_STEP_NUM_NODES=2"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
     "SLURM_STEP_TASKS_PER_NODE: gives 2 node(s) but the host list names 3"),
    ({"SLURM_STEP_TASKS_PER_NODE": "x"},
     "SLURM_STEP_TASKS_PER_NODE: is not a Slurm task count list like 2(x3),1: 'x' is not N or N(xM)"),
    ({"SLURM_NODEID": "3"}, "SLURM_NODEID: 3 is not below the node count 3 (SLURM_STEP_NUM_NODES)"),
    ({"SLURM_NODEID": "3", "SLURM_STEP_NUM_NODES": None, "SLURM_JOB_NUM_NODES": None},
     "SLURM_NODEID: 3 is not below the node count 3 (SLURM_STEP_NODELIST)"),
    ({"SLURM_PROCID": "3"}, "SLURM_PROCID: 3 is not below SLURM_NTASKS=3"),
    ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS: 0 is below the minimum 1"),
    ({"SLURM_STEP_NUM_NODES": "0"}, "SLURM_STEP_NUM_NODES: 0 is below the minimum 1"),
])
def test_slurm_errors_name_the_variable(change, message):
    env = slurm.example(3, 1)
    for name, value in change.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    assert error(slurm.table, env) == message


def test_slurm_host_count_limit():
    env = dict(slurm.example(2), SLURM_STEP_NODELIST="n[1-10001]", SLURM_STEP_NUM_NODES="10001")
    assert error(slurm.table, env) == "SLURM_STEP_NODELIST: names 10001 hosts, more than 10000"
    ok = dict(slurm.example(2), SLURM_STEP_NODELIST="n[1-10000]", SLURM_STEP_NUM_NODES="10000",
              SLURM_STEP_TASKS_PER_NODE="1(x10000)")
    assert slurm.table(ok).num_nodes == 10000
    script = without(dict(slurm.example(3), SLURM_NODEID="3"), "SLURM_STEP_ID")
    assert error(slurm.table, script) == (
        "SLURM_NODEID: 3 is not below the node count 3 (SLURM_JOB_NUM_NODES)")


def test_a_forced_rank_without_variables_names_open_mpis():
    assert error(schedulers.choose, {"MNP_SCHEDULER": "rank"}) == "OMPI_COMM_WORLD_RANK: is not set"
    table = rank.table({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
    assert "local rank" not in table.extra


def test_a_single_node_is_node_0_of_1():
    table = schedulers.choose({})
    assert (table.scheduler, table.role, table.node_rank, table.num_nodes) == (
        "single", "single", 0, 1)


def test_pytorchjob_port_and_world_bounds_and_examples():
    assert pytorchjob.table(dict(STATIC, MASTER_PORT="65535")).master_port == 65535
    assert pytorchjob.table(dict(STATIC, MASTER_PORT="1")).master_port == 1
    assert error(pytorchjob.table, dict(STATIC, MASTER_PORT="65536")) == (
        "MASTER_PORT: 65536 is above the maximum 65535")
    assert error(pytorchjob.table, dict(STATIC, PET_MASTER_PORT="0")) == (
        "PET_MASTER_PORT: 0 is below the minimum 1")
    assert error(pytorchjob.table, dict(STATIC, WORLD_SIZE="0")) == (
        "WORLD_SIZE: 0 is below the minimum 1")
    assert pytorchjob.example(2)["RANK"] == "0" and pytorchjob.example(2, 1)["PET_NODE_RANK"] == "1"
    assert pytorchjob.elastic_example(2, "etcd-v2")["PET_RDZV_ENDPOINT"] == "etcd-service:2379"
    c10d = pytorchjob.elastic_example(2)
    assert (c10d["PET_RDZV_ENDPOINT"], c10d["PET_NNODES"]) == ("job-worker-0:23456", "2:2")


def test_trainjob_port_bound_and_slurms_one_node_example():
    assert trainjob.table(dict(TRAINJOB, PET_MASTER_PORT="65535")).master_port == 65535
    assert error(trainjob.table, dict(TRAINJOB, PET_MASTER_PORT="65536")) == (
        "PET_MASTER_PORT: 65536 is above the maximum 65535")
    one = slurm.example(1)  # what srun -N1 really sets: no bracket, no repeat count
    assert (one["SLURM_STEP_NODELIST"], one["SLURM_STEP_TASKS_PER_NODE"]) == ("node1", "1")
    assert slurm.example(2)["SLURM_STEP_TASKS_PER_NODE"] == "1(x2)"
