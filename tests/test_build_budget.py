"""Per-layer size budgets (layer_budget_mb) on the real engine, and the PyTorch wheel split that
keeps cuda13.2's layers under theirs."""

from __future__ import annotations

import re

import pytest

from matrix.errors import UserError
from matrix.image.plan import plan
from matrix.model.loader import load_matrix
from matrix.model.settings import ROOT
from tests.build_project import project_files, run_build, stacks_text

project_fixture = pytest.fixture(name="project")(project_files)

BIG_STEP = "RUN head -c 3000000 /dev/urandom > /big\n"


@pytest.mark.docker
def test_layer_over_its_budget_fails_with_one_line(docker_client, project):
    project["stacks"].write_text(stacks_text(project["repo"], budget="    layer_budget_mb: 2\n"))
    gamma = project["images"] / "gamma" / "Dockerfile.j2"
    gamma.write_text(gamma.read_text() + BIG_STEP)
    with pytest.raises(UserError) as caught:
        run_build(docker_client, project, ["one"])
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(r"stacks\.yaml:\d+: stack one: layer gamma 1\.0 \(mnp-test-\w+:gamma-1\.0-\w+\) "
                     r"adds a 3 MB filesystem layer, over its layer_budget_mb of 2 \(step: .*head -c "
                     r"3000000", message), message


@pytest.mark.docker
def test_component_budget_admits_one_bigger_layer(docker_client, project):
    project["stacks"].write_text(stacks_text(
        project["repo"], budget="    layer_budget_mb: {default: 2, gamma: 5}\n"))
    gamma = project["images"] / "gamma" / "Dockerfile.j2"
    gamma.write_text(gamma.read_text() + BIG_STEP)
    _, statuses = run_build(docker_client, project, ["one"])
    assert [s for _, s in statuses] == ["built"] * 4


def test_pytorch_steps_name_pins_of_their_version_once():
    matrix = load_matrix(ROOT / "stacks.yaml")
    for version, spec in matrix_component(matrix, "pytorch").items():
        steps = (spec.get("options") or {}).get("pip_steps", [])
        named = [name for step in steps for name in step]
        assert len(named) == len(set(named)), version
        assert set(named) <= set(spec.get("pip", {})), version
        assert "torch" not in named, version  # torch installs last, with the self-check


def test_cuda13_pytorch_layer_has_one_run_per_step():
    matrix = load_matrix(ROOT / "stacks.yaml")
    result = plan(matrix, ["cuda13.2-tcp", "cuda13.2-efa"])
    layers = [layer for layer in result.order(["cuda13.2-tcp", "cuda13.2-efa"])
              if layer.component == "pytorch"]
    assert len(layers) == 1  # both stacks share the one split PyTorch image
    steps = matrix.stack("cuda13.2-tcp").layer("pytorch").spec["options"]["pip_steps"]
    runs = [line for line in layers[0].dockerfile.splitlines() if line.startswith("RUN ")]
    assert len(runs) == len(steps) + 1
    assert "'torch==2.15.0 " in layers[0].dockerfile.rsplit("RUN ", 1)[1]
    for stack in ("cuda13.2-tcp", "cuda13.2-efa"):
        assert matrix.stack(stack).layer_budget("pytorch") == 2000


def matrix_component(matrix, component: str) -> dict:
    """The versions of ``component`` that the matrix's stacks use, with their specs."""
    return {cv.version: cv.spec for stack in matrix.stacks.values() for cv in stack.layers
            if cv.component == component}
