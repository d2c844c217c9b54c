"""Issue 22's shape, checked: ``plan/`` names no launcher and no scheduler, nothing parses a
display string back, and a launcher unit is one module plus its registration."""

import ast
import importlib
import sys
from pathlib import Path

import pytest

from entrypoint import launchers, schedulers
from entrypoint.plan import make as plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.schedulers.base import ROLES
from entrypoint.settings import config

ROOT = Path(__file__).resolve().parents[2]
MAIN = {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_NUM_NODES": "2", "MNP_SECRET": "s"}


def strings(path):
    """The string constants of a module; "none" (a launcher's name and a word) only where it is
    compared with something or is an element of a collection."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    found.discard("none")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Compare, ast.Tuple, ast.List, ast.Set, ast.Dict)):
            found.update(c.value for c in ast.walk(node)
                         if isinstance(c, ast.Constant) and c.value == "none")
    return found


def named_in(folder, names):
    found = {}
    for path in sorted((ROOT / "entrypoint" / folder).rglob("*.py")):
        hits = sorted(strings(path) & names)
        if hits:
            found[path.name] = hits
    return found


# Scheduler names that are not also role names ("rank" and "single" are both).
SCHEDULER_NAMES = set(schedulers.NAMES) - set(ROLES)


def test_plan_names_no_launcher_and_no_scheduler():
    assert named_in("plan", set(launchers.NAMES) | SCHEDULER_NAMES) == {}


def test_the_name_check_sees_a_name():
    """Guard: the launchers' own room names them, so the check can find one."""
    assert "mpirun.py" in named_in("launchers", set(launchers.NAMES))


def split_on_extra(path):
    """``x.split(...)`` calls whose object reads an ``extra`` attribute or key."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("split", "rsplit", "partition", "rpartition"):
            inner = ast.dump(node.func.value)
            if "attr='extra'" in inner or "'extra'" in inner:
                hits.append(f"{path.name}:{node.lineno}")
    return hits


def test_no_value_is_parsed_back_out_of_a_display_string():
    found = [hit for package in ("entrypoint", "matrix")
             for path in sorted((ROOT / package).rglob("*.py")) for hit in split_on_extra(path)]
    assert found == []


def test_the_parse_check_sees_a_split(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('backend = node.extra.get("rdzv backend", "c10d").split(" ")[0]\n')
    assert split_on_extra(bad) == ["bad.py:1"]


TOY_UNIT = '''
from entrypoint.launchers.base import Launch, Unit


class Echo(Unit):
    """A toy launcher: prints what it was asked to start."""
    name = "echo-all"
    on_children = "runs echo-all with its own node index"
    env_propagation = "none"
    binary = "echo"
    source = "tests/entrypoint/test_ep_units.py"
    starts_without_ssh = True
    reaches_hosts = True

    def launch(self, request):
        launch = Launch(["echo", "np=%d" % request.np, "master=%s:%d" % request.master,
                         "node=%d" % request.node_index] + request.command)
        launch.notes.append("echo-all says hello")
        return launch


UNIT = Echo()
'''


@pytest.fixture
def toy_unit(tmp_path, monkeypatch):
    package = tmp_path / "toyunits"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "echo.py").write_text(TOY_UNIT)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("toyunits.echo")
    launchers.register(module.UNIT)
    yield module.UNIT
    launchers.unregister(module.UNIT.name)
    for name in ("toyunits.echo", "toyunits"):
        sys.modules.pop(name, None)


def test_a_new_unit_is_one_module_and_its_registration(toy_unit):
    facts = NodeFacts(address="10.0.0.5", interface="eth0", address_reason="test", slots=4,
                      slots_source="test", binaries={"sshd": "/usr/sbin/sshd"}, home="/root")
    cfg = config.load(dict(MAIN, MNP_LAUNCHER="echo-all"))
    p = plan.make_plan(cfg, facts, ["python3", "train.py"], {"PATH": "/bin"})
    assert p.launcher["unit"] == "echo-all"
    assert p.argv == ["echo", "np=8", "master=10.0.0.5:29500", "node=0", "python3", "train.py"]
    assert "echo-all says hello" in p.notes
    assert p.problems == []


def test_an_unregistered_unit_is_a_setting_error():
    with pytest.raises(config.ConfigError, match="MNP_LAUNCHER"):
        config.load(dict(MAIN, MNP_LAUNCHER="echo-all"))
