"""Property: whatever a stacks file holds, loading and planning end in a result or one clear line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matrix.errors import UserError
from matrix.loader import load_matrix
from matrix.plan import plan
from matrix.yamlsrc import loads

ROOT = Path(__file__).resolve().parent.parent
VALID = yaml.safe_load((ROOT / "stacks.yaml").read_text(encoding="utf-8"))

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += paths(value, prefix + (index,))
    return found


ALL_PATHS = paths(VALID)[1:]


@st.composite
def mutated(draw) -> str:
    data = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["replace", "delete", "rename"]))
            if action == "replace":
                parent[path[-1]] = draw(values)
            elif action == "delete":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[draw(st.text(max_size=6))] = parent.pop(path[-1])
        except (KeyError, IndexError, TypeError):
            continue
    return yaml.safe_dump(data, sort_keys=False)


def check(text: str, tmp: Path) -> None:
    path = tmp / "stacks.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        matrix = load_matrix(path)
        plan(matrix)
    except UserError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        assert "Traceback" not in message


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mutated())
def test_mutated_stacks_files(text, tmp_path):
    check(text, tmp_path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_arbitrary_text(text, tmp_path):
    check(text, tmp_path)


@settings(max_examples=100, deadline=None)
@given(data=values)
def test_arbitrary_yaml_values(data):
    text = yaml.safe_dump(data)
    try:
        located = loads(text, Path("x.yaml"))
        assert located.data == data or data != data  # floats compare by value
    except UserError as exc:
        assert "\n" not in str(exc)
