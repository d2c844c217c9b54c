"""The builder when the engine or the project folder fails: one line naming what failed, no
traceback. Engine faults come from tests/fake_engine.py, a fake engine on a unix socket that drops
connections mid-stream or refuses to start containers the way a restarting dockerd does."""

from __future__ import annotations

import io

import docker
import pytest
from rich.console import Console

from matrix.errors import UserError
from matrix.image import build
from matrix.image.plan import plan
from matrix.model.loader import load_matrix
from tests.build_project import project_files, run_build, stacks_text
from tests.fake_engine import FakeEngine

project_fixture = pytest.fixture(name="project")(project_files)


def build_on(engine: FakeEngine, project: dict, stacks_file_text: str | None = None) -> None:
    if stacks_file_text:
        project["stacks"].write_text(stacks_file_text)
    client = docker.DockerClient(base_url=engine.url, version="1.41", timeout=10)
    # planned on the engine that builds (the fake one), as invoke build does: the base's digest
    # is the one that engine has
    result = plan(load_matrix(project["stacks"]), ["one"], images=project["images"],
                  root=project["images"].parent, engine=client)
    build.build(client, result, ["one"], console=Console(file=io.StringIO(), width=200),
                state=project["state"])


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.docker
def test_connection_broken_mid_build_names_engine_layer_and_log(tmp_path, project):
    with FakeEngine(tmp_path, "drop_build", {"debian:bookworm"}) as engine, \
            pytest.raises(UserError) as failure:
        build_on(engine, project)
    message = one_line(failure)
    assert f"Docker engine at {engine.url} failed while building layer alpha 1.0" in message
    assert "ProtocolError" in message or "ChunkedEncodingError" in message
    log = next((project["state"] / "logs").glob("alpha-*.log"))
    assert f"log: {log}" in message
    assert "the engine failed mid-build" in log.read_text()


@pytest.mark.docker
def test_connection_dropped_on_tag_check(tmp_path, project):
    with FakeEngine(tmp_path, "drop_inspect", {"debian:bookworm"}) as engine, \
            pytest.raises(UserError) as failure:
        build_on(engine, project)
    message = one_line(failure)
    assert f"Docker engine at {engine.url} failed while building layer alpha 1.0" in message
    assert "ConnectionError" in message


@pytest.mark.docker
def test_engine_refusing_to_start_the_base_check_container(tmp_path, project):
    text = stacks_text(project["repo"]).replace(
        "    provides: {python: \"3.11.2\"}\n",
        "    provides: {python: \"3.11.2\"}\n"
        "    bootstrap: {suite: bookworm, mirror: \"http://deb.debian.org/debian\"}\n")
    with FakeEngine(tmp_path, "refuse_start", {"debian:bookworm"}) as engine, \
            pytest.raises(UserError) as failure:
        build_on(engine, project, text)
    message = one_line(failure)
    assert (f"Docker engine at {engine.url} failed while checking base image debian:bookworm: "
            "APIError: OCI runtime create failed: fake engine refuses") in message
    # The container it created for the check was removed again.
    assert any(r.startswith("DELETE") and "/containers/" in r for r in engine.requests)


@pytest.mark.docker
def test_layer_log_path_that_is_a_folder_is_one_line(docker_client, project):
    matrix = load_matrix(project["stacks"])
    result = plan(matrix, ["one"], images=project["images"], root=project["images"].parent)
    log = project["state"] / "logs" / f"{result.chain('one')[0].tag}.log"
    log.mkdir(parents=True)
    with pytest.raises(UserError) as failure:
        run_build(docker_client, project, ["one"])
    assert f"layer alpha 1.0: cannot write its build log {log}: Is a directory" in one_line(failure)
