"""The default stack end to end on the real engine: built from nothing, rebuilt as a no-op, every
layer tested in its own container, labels that answer what is inside."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from matrix.image import build, testing
from matrix.jobs.rehearse import LABEL
from matrix.model.loader import load_matrix
from tests.helpers import project_matrix, project_plan
from tests.layer_checks import apt_cache_files

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_second_build_rebuilds_nothing(docker_client, cpu_tcp_build):
    result, _ = cpu_tcp_build
    again = build.build(docker_client, result, ["cpu-tcp"], console=Console(width=160))
    assert {r.status for r in again} == {"cached"}


@pytest.mark.xdist_group("cpu-tcp layer tests")  # with the README's examples that run them
def test_layer_tests_pass_and_are_recorded(docker_client, cpu_tcp_build):
    """In the project's own record, as `invoke test` keeps it: the first of this test and the
    README's examples to run them runs them, the others read its record."""
    result, _ = cpu_tcp_build
    outcome = testing.run_stack_tests(docker_client, result, "cpu-tcp",
                                      console=Console(width=160))
    tested = {r.layer.component: r for r in outcome}
    for component in ("ssh", "libfabric", "openmpi", "python", "mpi4py", "pytorch", "deepspeed",
                      "entrypoint", "_stack"):
        assert tested[component].passed > 0 and tested[component].ok, component
    from matrix.image import testrecord
    final_id = docker_client.images.get(result.chains["cpu-tcp"][-1]).id
    assert testrecord.has_passed(final_id)


def test_labels_name_every_component(docker_client, cpu_tcp_image):
    matrix = load_matrix(ROOT / "stacks.yaml")
    labels = docker_client.images.get(cpu_tcp_image).labels
    for layer in matrix.stack("cpu-tcp").layers:
        assert labels[f"io.github.mnp-stacks.component.{layer.component}"] == layer.version
    assert labels["org.opencontainers.image.title"] == "cpu-tcp"
    assert labels["io.github.mnp-stacks.fabric"] == "tcp"


def test_final_tags_agree(docker_client, cpu_tcp_image):
    ref = subprocess.run([sys.executable, "-m", "invoke", "ref", "--stack", "cpu-tcp"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert ref == cpu_tcp_image
    assert docker_client.images.get("mnp-stacks:cpu-tcp").id == \
        docker_client.images.get(cpu_tcp_image).id


def test_image_size_within_budget(docker_client, cpu_tcp_image):
    budget = load_matrix(ROOT / "stacks.yaml").stack("cpu-tcp").size_budget_mb
    assert docker_client.images.get(cpu_tcp_image).attrs["Size"] <= budget * 1_000_000


def test_bootstrapped_base_has_the_official_apt_settings(docker_client, cpu_tcp_build):
    from matrix.image.bootstrap import DOCKER_CONFIG

    result, _ = cpu_tcp_build
    base = result.matrix.stack("cpu-tcp").base
    for path, (text, _mode) in DOCKER_CONFIG.items():
        out = docker_client.containers.run(base.image, ["cat", f"/{path}"], remove=True,
                                           entrypoint=[])
        assert out.decode() == text, path
    assert apt_cache_files(docker_client, base.image) == []


def test_no_layer_adds_apt_caches(docker_client, cpu_tcp_build):
    """The bootstrapped base carries the official image's docker-clean apt settings, so no layer
    keeps downloaded .deb files or pkgcache.bin/srcpkgcache.bin."""
    result, _ = cpu_tcp_build
    found = {layer.name: files for layer in result.chain("cpu-tcp")
             if (files := apt_cache_files(docker_client, layer.ref))}
    assert found == {}


def _unbuildable_layers():
    matrix, result = project_matrix(), project_plan()
    for name, stack in matrix.stacks.items():
        # Buildable here: a bootstrapped base and nothing downloaded from GitHub or AWS.
        if stack.base.bootstrap and not any(cv.spec.get("source") == "download"
                                            for cv in stack.layers):
            continue
        for layer in result.chain(name):
            if testing.test_files(layer.component):
                yield pytest.param(result, name, layer, id=f"{name}-{layer.component}")


UNBUILDABLE = list(_unbuildable_layers())


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, tuple[Path, Path, str]]:
    """Each unbuildable layer's tests in a pytest session of its own with the arguments
    ``invoke test`` gives it, all of them in one process (tests/layer_dry_run.py): per layer,
    its folder, its junit file and its exit code."""
    folder = tmp_path_factory.mktemp("dry-runs")
    jobs, runs = [], {}
    for param in UNBUILDABLE:
        result, stack, layer = param.values
        here = folder / param.id
        here.mkdir()
        spec = here / "layer.json"
        spec.write_text(json.dumps(testing.layer_description(result, stack, layer)))
        junit = here / "junit.xml"
        jobs.append({"code": str(here / "code"), "args": [
            "-q", "-p", "no:cacheprovider", "--hosts=docker://not-started", f"--mnp-layer={spec}",
            f"--junitxml={junit}", *map(str, testing.test_files(layer.component))]})
        runs[param.id] = (here, junit)
    (folder / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "layer_dry_run.py"),
                           str(folder / "jobs.json")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return {key: (here, junit, (here / "code").read_text()) for key, (here, junit) in runs.items()}


def _defined_tests(files: list[Path]) -> set[str]:
    """``file::name`` of every test function the layer's test files define."""
    names = set()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names |= {f"{path.stem}::{node.name}" for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    return names


def test_other_stacks_have_layer_tests_to_check():
    """The parametrized test below would pass with nothing to check: the stacks it covers are
    the ones that cannot be built here, and each has layer tests."""
    matrix = load_matrix(ROOT / "stacks.yaml")
    covered = {param.values[1] for param in UNBUILDABLE}
    assert covered and covered < set(matrix.stacks), covered


@pytest.mark.parametrize(("result", "stack", "layer"), UNBUILDABLE)
def test_layer_tests_of_other_stacks_would_run(result, stack, layer, dry_runs, request):
    """Stacks whose base cannot be had here get their layer tests run up to the test bodies
    (they run whole in the GitHub workflow, where the registries are reachable): each test the
    layer's files define is collected for this layer and passes its setup, none is skipped."""
    _, junit, code = dry_runs[request.node.callspec.id]
    files = testing.test_files(layer.component)
    report = junit.read_text(encoding="utf-8")[-3000:] if junit.exists() else "(no junit)"
    assert code == "0", report
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    ran = {f"{case.get('classname').rsplit('.', 1)[-1]}::{case.get('name').split('[')[0]}"
           for case in cases if not list(case)}  # no skipped/failure/error child
    assert ran == _defined_tests(files), report
    assert len(ran) and all(not list(case) for case in cases), report


def test_invoke_run_three_node_allreduce_leaves_nothing(docker_client, cpu_tcp_image):
    """`invoke run --stack cpu-tcp --nodes 3 -- <allreduce>` exits 0 and cleans up after itself."""
    # what this rehearsal made: invoke run labels it with its run id (other rehearsals, run by
    # other pytest workers at the same time, are not this test's business)
    program = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
               "print('allreduce', c.Get_size(), c.allreduce(c.Get_rank() + 1))")
    proc = subprocess.run([sys.executable, "-m", "invoke", "run", "--stack", "cpu-tcp", "--nodes",
                           "3", "--late-node", "1", "--", "python3", "-c", program],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.stdout.count("allreduce 3 6") == 3
    run_id = re.search(r"rehearsal (\w+):", proc.stdout + proc.stderr)
    assert run_id, proc.stdout[-3000:]
    rehearsal = {"label": f"{LABEL}={run_id[1]}"}
    assert docker_client.containers.list(all=True, filters=rehearsal) == []
    assert docker_client.networks.list(filters=rehearsal) == []
