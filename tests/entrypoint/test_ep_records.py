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
