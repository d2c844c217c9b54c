"""The entrypoint's records carry every field through equality and their JSON form (issue 36):
a field set on a ``NodeTable`` (or the ``Elastic``/``LauncherSsh`` it holds) and left out of
``FIELDS`` would vanish from the dry run's JSON and compare equal to a table without it."""

import inspect
import json

import pytest

from entrypoint import schedulers
from entrypoint.schedulers import base


def every_field_set():
    table = base.NodeTable(
        "slurm", "SLURM_JOB_ID", "main", node_rank=0, num_nodes=2, main_address="node-a",
        hosts=["node-a", "node-b"], slots=[1, 1], rendezvous=False, extra={"k": "v"},
        main_rank=0, master_port=29501, rank=3,
        elastic=base.Elastic("c10d", "node-a:29400", "1:2", rdzv_id="job", max_restarts=2,
                             conf="timeout=60"),
        slots_are="tasks", launcher_ssh=base.LauncherSsh("-p 2222", "why", "where"),
        other_ways="srun --mpi=pmix", nproc_word="gpu", problems=["a problem"],
        runs_ranks=False, wiring_id="1234")
    table = table.wired("MNP_LAUNCHER=mpirun needs SSH")
    table.ignored.append("AWS_BATCH_JOB_ID: not this scheduler")
    return table


def test_fields_are_every_attribute():
    table = every_field_set()
    assert set(vars(table)) == set(base.NodeTable.FIELDS)
    init = set(inspect.signature(base.NodeTable.__init__).parameters) - {"self"}
    assert init <= set(base.NodeTable.FIELDS)
    for record in (table.elastic, table.launcher_ssh):
        assert set(vars(record)) == set(type(record).FIELDS)


def test_a_node_table_round_trips_through_json_with_every_field():
    table = every_field_set()
    back = base.NodeTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert back == table
    assert back.to_dict() == table.to_dict()
    assert isinstance(back.elastic, base.Elastic) and back.elastic.conf == "timeout=60"
    assert isinstance(back.launcher_ssh, base.LauncherSsh)
    assert back.tasks_here() == 1 and back.wired_because.startswith("MNP_LAUNCHER")


@pytest.mark.parametrize("field", [f for f in base.NodeTable.FIELDS])
def test_each_field_changes_equality(field):
    """Two tables that differ in any one field are not equal (no field outside equality)."""
    one, other = every_field_set(), every_field_set()
    value = getattr(other, field)
    changed = {str: "changed", int: 99, bool: not value, list: ["x"], dict: {"x": "y"},
               type(None): "set"}.get(type(value))
    if changed is None:  # a nested record: change one of its fields
        changed = type(value).from_dict(dict(value.to_dict(), **{type(value).FIELDS[0]: "z"}))
    setattr(other, field, changed)
    assert one != other and (one == other) is False, field


def test_unknown_keys_are_refused():
    with pytest.raises(ValueError, match="no field nope"):
        base.NodeTable.from_dict(dict(every_field_set().to_dict(), nope=1))


def test_every_schedulers_example_round_trips():
    """The adapters' own examples (what each scheduler sets) give tables that survive JSON."""
    for adapter in schedulers.ORDER:
        table = schedulers.choose(dict(adapter.example(3, 1), MNP_SCHEDULER=adapter.NAME))
        assert base.NodeTable.from_dict(json.loads(json.dumps(table.to_dict()))) == table


def test_settings_are_read_only_once_loaded():
    """Settings are read once (issue 36): nothing after ``load`` may change them."""
    from entrypoint.settings import config
    cfg = config.load({})
    with pytest.raises(AttributeError, match="read-only"):
        cfg.launcher = "torchrun"
    assert config.Config(launcher="torchrun").launcher == "torchrun"  # built by hand: settable


def test_wiring_a_slurm_step_gives_new_records_and_edits_none():
    """The Slurm self-wiring decision returns a wired copy of the scheduler's table; the table
    the adapter gave is left as it was."""
    from entrypoint.settings import config, wiring
    env = dict(schedulers.MODULES["slurm"].example(3, 1), MNP_LAUNCHER="mpirun")
    cfg = config.load(env)
    assert cfg.rendezvous and cfg.node.wired_because.startswith("MNP_LAUNCHER=mpirun needs SSH")
    given = schedulers.choose(env)
    before = given.to_dict()
    decision = wiring.decide(config.Config(node=given, mode=given.role, launcher="mpirun",
                                           launcher_explicit=True))
    assert decision is not None and decision.node.rendezvous and decision.main_index == 0
    assert given.to_dict() == before and not given.rendezvous


# -- LaunchRequest (entrypoint/launchers/base.py) ---------------------------------------------

def every_request_field_set():
    from entrypoint.core.nodes import NodeInfo
    from entrypoint.launchers.base import LaunchRequest
    from entrypoint.probe.facts import NodeFacts
    facts = NodeFacts(instance_type="p4d.24xlarge", gpus=8, efa_devices=["uverbs0"],
                      versions={"deepspeed": "0.14.4"}, binaries={"pdsh": "/usr/bin/pdsh"},
                      address="10.0.0.5", interface="eth0", slots=8, is_root=True)
    return LaunchRequest(
        ["python3", "train.py"], [NodeInfo(0, "10.0.0.5", 8, "ssh-ed25519 AAA"),
                                  NodeInfo(1, "10.0.0.6", 8, "ssh-ed25519 BBB")],
        1, 8, 16, ("10.0.0.5", 29500), ("node-a", 29501), "/run/mnp/hostfile", ["PATH", "X"],
        ["--bind-to", "none"], {"PATH": "/bin", "X": "1"}, {"X": "1"}, facts, "launcher",
        True, "/run/mnp", every_field_set(), {"MNP_DEEPSPEED_LAUNCHER": "openmpi"},
        base.Elastic("c10d", "node-a:29400", "1:2"))


def test_a_launch_request_round_trips_through_json_with_every_field():
    from entrypoint.launchers.base import LaunchRequest
    request = every_request_field_set()
    data = json.loads(json.dumps(request.to_dict()))
    assert set(data) == set(LaunchRequest.FIELDS)
    init = set(inspect.signature(LaunchRequest.__init__).parameters) - {"self"}
    assert init == set(LaunchRequest.FIELDS)  # nothing set outside the constructor
    back = LaunchRequest.from_dict(data)
    assert back == request and back.to_dict() == request.to_dict()
    assert back.master == ("10.0.0.5", 29500) and back.table[1].host_key == "ssh-ed25519 BBB"
    assert back.facts.to_dict() == request.facts.to_dict() and back.node == request.node
    assert isinstance(back.elastic, base.Elastic) and back.elastic.nnodes == "1:2"
    with pytest.raises(ValueError, match="missing .*'np'"):
        LaunchRequest.from_dict({k: v for k, v in data.items() if k != "np"})


@pytest.mark.parametrize("field", __import__("entrypoint.launchers.base", fromlist=["x"])
                         .LaunchRequest.FIELDS)
def test_each_launch_request_field_changes_equality(field):
    from entrypoint.probe.facts import NodeFacts
    one = every_request_field_set()
    value = getattr(one, field)
    changed = {str: "changed", int: 99, bool: not value, list: [], dict: {},
               tuple: ("other", 1)}.get(type(value))
    if changed is None:  # a record: another one
        changed = {NodeFacts: NodeFacts(gpus=1), base.NodeTable: None, base.Elastic: None}[
            type(value)]
    other = one.replace(**{field: changed})
    assert one != other and (one == other) is False, field
    assert one.to_dict()[field] != other.to_dict()[field], field


def test_a_launch_request_is_read_only():
    request = every_request_field_set()
    with pytest.raises(AttributeError, match="read-only"):
        request.launcher_args = ["--changed"]
    assert request.replace(np=4).np == 4 and request.np == 16


def test_the_request_the_plan_hands_a_unit_is_complete_and_round_trips(monkeypatch):
    """The user's path: ``make_plan`` builds the request once with every field (no placeholder
    filled in later); the unit sees its own option and the final environment and exports."""
    from entrypoint import launchers
    from entrypoint.launchers.base import LaunchRequest
    from entrypoint.plan import make as plan
    from entrypoint.probe.facts import NodeFacts
    from entrypoint.settings import config
    seen = []
    unit = launchers.UNITS["deepspeed"]
    original = type(unit).launch

    def spy(self, request):
        seen.append(request)
        return original(self, request)

    facts = NodeFacts(address="10.0.0.5", interface="eth0", address_reason="test", slots=2,
                      slots_source="test", binaries={"sshd": "/usr/sbin/sshd",
                                                     "mpirun": "/usr/bin/mpirun"},
                      versions={"deepspeed": "0.14.4"}, home="/root")
    cfg = config.load({"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
                       "AWS_BATCH_JOB_NUM_NODES": "2", "MNP_SECRET": "s",
                       "MNP_LAUNCHER": "deepspeed", "MNP_DEEPSPEED_LAUNCHER": "openmpi"})
    monkeypatch.setattr(type(unit), "launch", spy)
    made = plan.make_plan(cfg, facts, ["python3", "train.py"], {"PATH": "/bin", "X": "1"})
    (request,) = seen
    assert request.options == {"MNP_DEEPSPEED_LAUNCHER": "openmpi"}
    assert made.launcher["runner"] == "openmpi"
    assert request.environment["X"] == "1" and "X" in request.exports
    assert request.np == 4 and request.mode == cfg.mode and request.state_dir == cfg.state_dir
    assert LaunchRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
