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
from tests.publish.conftest import build_image

pytestmark = pytest.mark.docker
project_fixture = pytest.fixture(name="project")(project_files)


def _push_base(client, base: str, ref: str, content: str) -> str:
    """Build a one-file image on ``base``, push it as ``ref``; its image ID."""
    image_id = build_image(client, f"FROM {base}\nRUN echo {content} > /base-content\n", ref)
    repository, tag = ref.rsplit(":", 1)
    for event in client.images.push(repository, tag=tag, stream=True, decode=True):
        assert "error" not in event, event
    client.images.remove(ref)  # only the registry has it now
    return image_id


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


# -- `invoke ref` (issue 44): a reference only where the base is known by content --------------

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def _invoke_ref(*args: str, env: dict[str, str] | None = None):
    import os
    import subprocess
    import sys

    from matrix.model.settings import ROOT

    return subprocess.run([sys.executable, "-m", "invoke", "ref", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, check=False)


def test_ref_refuses_a_base_no_engine_resolves_in_one_line():
    """Without an engine the first tag would hash the base's name: a tag no build makes. A CI
    step recording it would record a reference that never exists."""
    from tests.helpers import one_line

    line = one_line(_invoke_ref("--stack", "cpu-tcp", env=NO_ENGINE), 1)
    assert "stack cpu-tcp: its base debian:bookworm is unresolved: no Docker engine answers" in line
    assert "start the engine (`invoke engine`)" in line and "pin the base by digest" in line


def test_ref_refuses_a_base_the_engine_does_not_hold(docker_client, tmp_path):
    from matrix.model.settings import ROOT
    from tests.helpers import one_line

    absent = f"127.0.0.1:9/mnp-absent-{uuid.uuid4().hex[:8]}/base:1"
    stacks = tmp_path / "stacks.yaml"
    stacks.write_text((ROOT / "stacks.yaml").read_text().replace(
        "image: debian:bookworm", f"image: {absent}"))
    line = one_line(_invoke_ref("--stack", "cpu-tcp", "--stacks", str(stacks)), 1)
    assert f"its base {absent} is unresolved: not in the local engine yet" in line
    assert "run `invoke build --stack cpu-tcp`" in line


def test_ref_of_a_base_pinned_by_digest_needs_no_engine(tmp_path):
    from matrix.model.settings import ROOT

    pinned = "debian@sha256:" + "ab" * 32
    stacks = tmp_path / "stacks.yaml"
    stacks.write_text((ROOT / "stacks.yaml").read_text().replace(
        "image: debian:bookworm", f'image: "{pinned}"'))
    proc = _invoke_ref("--stack", "cpu-tcp", "--stacks", str(stacks), env=NO_ENGINE)
    assert proc.returncode == 0, proc.stderr
    expected = plan(load_matrix(stacks), ["cpu-tcp"], engine=None).chains["cpu-tcp"][-1]
    assert proc.stdout.strip() == expected
