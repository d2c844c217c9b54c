"""Layer tags follow the base's content (matrix/image/plan.py): a base re-pushed under the same
name and tag to the loopback registry gives a new first-layer tag once it is pulled; planning
twice with nothing changed gives the same tag; without an engine the base is unresolved."""

from __future__ import annotations

import contextlib
import io
import uuid

import docker.errors
import pytest
from rich.console import Console

from matrix.image import build
from matrix.image.plan import plan
from matrix.model.loader import load_matrix
from tests.build_project import project_files

pytestmark = pytest.mark.docker
project_fixture = pytest.fixture(name="project")(project_files)


def _push_base(client, base: str, ref: str, content: str) -> str:
    """Build a one-file image on ``base``, push it as ``ref``; its image ID."""
    image, _ = client.images.build(
        fileobj=io.BytesIO(f"FROM {base}\nRUN echo {content} > /base-content\n".encode()),
        tag=ref, rm=True, forcerm=True, pull=False)
    repository, tag = ref.rsplit(":", 1)
    for event in client.images.push(repository, tag=tag, stream=True, decode=True):
        assert "error" not in event, event
    client.images.remove(ref)  # only the registry has it now
    return image.id


def _plan(matrix, project, engine):
    return plan(matrix, ["one"], images=project["images"], root=project["images"].parent,
                engine=engine)


def _first_tag(matrix, project, client) -> tuple[str, str]:
    result = _plan(matrix, project, client)
    base = result.bases["debian-12"]
    return result.chain("one")[0].tag, base.digest


def test_repushed_base_moves_the_first_layer_tag(docker_client, project, registry, shell_base):
    ref = f"{registry.host}/team-{uuid.uuid4().hex[:8]}/base:1"
    stacks = project["stacks"]
    stacks.write_text(stacks.read_text().replace("image: debian:bookworm", f"image: {ref}"))
    matrix = load_matrix(stacks)
    console = Console(file=io.StringIO())
    first_id = _push_base(docker_client, shell_base, ref, f"first-{uuid.uuid4().hex}")
    try:
        unresolved = _plan(matrix, project, docker_client).bases["debian-12"]
        assert (unresolved.digest, unresolved.source.split(":")[0]) == ("", "unresolved")

        build.ensure_bases(docker_client, matrix, ["one"], console, pull=True)
        tag1, digest1 = _first_tag(matrix, project, docker_client)
        assert digest1 == first_id
        assert _first_tag(matrix, project, docker_client) == (tag1, digest1)  # nothing changed: same tag
        assert _plan(matrix, project, docker_client).bases["debian-12"].source \
            .startswith(f"pulled: {ref.rsplit(':', 1)[0]}@sha256:")

        second_id = _push_base(docker_client, shell_base, ref, f"second-{uuid.uuid4().hex}")
        build.ensure_bases(docker_client, matrix, ["one"], console, pull=True)
        tag2, digest2 = _first_tag(matrix, project, docker_client)
        assert digest2 == second_id != first_id
        assert tag2 != tag1
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(ref)


def test_plan_without_an_engine_leaves_the_base_unresolved(project):
    matrix = load_matrix(project["stacks"])
    result = _plan(matrix, project, None)
    assert result.bases["debian-12"].digest == ""
    assert result.bases["debian-12"].source == "unresolved: no Docker engine answers"
    pinned = "debian@sha256:" + "ab" * 32
    stacks = project["stacks"]
    stacks.write_text(stacks.read_text().replace("image: debian:bookworm", f"image: {pinned!r}"))
    base = _plan(load_matrix(stacks), project, None).bases["debian-12"]
    assert (base.digest, base.source) == ("sha256:" + "ab" * 32, "pinned in stacks.yaml")
