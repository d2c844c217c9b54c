"""The default stack end to end on the real engine: built from nothing, rebuilt as a no-op, every
layer tested in its own container, labels that answer what is inside."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from matrix.deploy.rehearse import LABEL
from matrix.image import build, testing
from matrix.image.plan import plan
from matrix.model.loader import load_matrix
from tests.layer_checks import apt_cache_files

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_second_build_rebuilds_nothing(docker_client, cpu_tcp_build):
    result, _ = cpu_tcp_build
    again = build.build(docker_client, result, ["cpu-tcp"], console=Console(width=160))
    assert {r.status for r in again} == {"cached"}


def test_layer_tests_pass_and_are_recorded(docker_client, cpu_tcp_build, tmp_path):
    result, _ = cpu_tcp_build
    outcome = testing.run_stack_tests(docker_client, result, "cpu-tcp",
                                      console=Console(width=160), state=tmp_path)
    tested = {r.layer.component: r for r in outcome}
    for component in ("ssh", "libfabric", "openmpi", "python", "mpi4py", "pytorch", "deepspeed",
                      "entrypoint", "_stack"):
        assert tested[component].passed > 0 and tested[component].ok, component
    from matrix.image import testrecord
    final_id = docker_client.images.get(result.chains["cpu-tcp"][-1]).id
    assert testrecord.has_passed(final_id, tmp_path)


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
    matrix = load_matrix(ROOT / "stacks.yaml")
    result = plan(matrix)
    for name, stack in matrix.stacks.items():
        # Buildable here: a bootstrapped base and nothing downloaded from GitHub or AWS.
        if stack.base.bootstrap and not any(cv.spec.get("source") == "download"
                                            for cv in stack.layers):
            continue
        for layer in result.chain(name):
            if testing.test_files(layer.component):
                yield pytest.param(result, name, layer, id=f"{name}-{layer.component}")


@pytest.mark.parametrize(("result", "stack", "layer"), list(_unbuildable_layers()))
def test_layer_tests_of_other_stacks_are_collected(result, stack, layer, tmp_path):
    """Stacks whose base cannot be had here still get their layer tests collected (they run in
    the GitHub workflow, where the registries are reachable)."""
    spec = tmp_path / "layer.json"
    spec.write_text(json.dumps(testing.layer_description(result, stack, layer)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", f"--mnp-layer={spec}",
                           *map(str, testing.test_files(layer.component))],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "test" in proc.stdout


def test_invoke_run_three_node_allreduce_leaves_nothing(docker_client, cpu_tcp_image):
    """`invoke run --stack cpu-tcp --nodes 3 -- <allreduce>` exits 0 and cleans up after itself."""
    # what any rehearsal made (labelled by invoke run); other containers on the engine (the
    # other test shard's) are not this test's business
    rehearsal = {"label": LABEL}
    before_containers = {c.id for c in docker_client.containers.list(all=True, filters=rehearsal)}
    before_networks = {n.id for n in docker_client.networks.list(filters=rehearsal)}
    program = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
               "print('allreduce', c.Get_size(), c.allreduce(c.Get_rank() + 1))")
    proc = subprocess.run([sys.executable, "-m", "invoke", "run", "--stack", "cpu-tcp", "--nodes",
                           "3", "--late-node", "1", "--", "python3", "-c", program],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.stdout.count("allreduce 3 6") == 3
    assert {c.id for c in docker_client.containers.list(all=True, filters=rehearsal)} == \
        before_containers
    assert {n.id for n in docker_client.networks.list(filters=rehearsal)} == before_networks
