"""Issue 17, High 3 on a real engine: dockerd restarted (as `systemctl restart docker` does) while
a layer's RUN step is running. The build ends with one line naming the engine, the layer and its
log; no content tag is left for the layer that was cut off; the same build, run again once the
engine is back, completes with every tag naming the image its child was built on; and the engine
keeps no container from the cut-off step.

The engine is a second dockerd the test starts itself (tests/second_engine.py), with the throwaway
project of tests/build_project.py on the Debian base copied over from the first engine.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import docker
import pytest

from matrix.errors import UserError
from tests.build_project import built_on_parent_or_why, project_files, run_build
from tests.second_engine import SecondEngine, usable

pytestmark = [pytest.mark.docker, pytest.mark.slow]
project_fixture = pytest.fixture(name="project")(project_files)

BASE = "debian:bookworm"
SLOW_STEP = "RUN sleep 15\n"  # long enough to restart the engine under it


@pytest.fixture
def engine(docker_client):
    why = usable()
    if why:
        pytest.skip(why)
    # A short path: a unix socket's path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="mnp-engine-", dir="/tmp"))
    try:
        with SecondEngine(root, "mnptest0", "172.31.251.1/24", "mnptest") as second:
            save = subprocess.Popen([second.cli[0], "save", BASE], stdout=subprocess.PIPE)
            subprocess.run([*second.cli, "load", "-q"], stdin=save.stdout, check=True,
                           capture_output=True)
            assert save.wait() == 0
            yield second
    finally:
        shutil.rmtree(root, ignore_errors=True)


def wait_for_running_step(client, seconds: float = 120) -> None:
    """Until the slow step's container runs (not an earlier step's, which lives milliseconds)."""
    deadline = time.monotonic() + seconds
    while not any("sleep 15" in " ".join(c.attrs["Config"]["Cmd"] or ())
                  for c in client.containers.list()):
        assert time.monotonic() < deadline, "the slow RUN step never started"
        time.sleep(0.1)


def test_engine_restart_mid_build(engine, project):
    alpha = project["images"] / "alpha" / "Dockerfile.j2"
    alpha.write_text(alpha.read_text() + SLOW_STEP)
    client = docker.DockerClient(base_url=engine.url, version="1.41", timeout=120)
    outcome: dict = {}

    def first_build() -> None:
        try:
            run_build(client, project, ["one"])
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    builder = threading.Thread(target=first_build)
    builder.start()
    wait_for_running_step(client)
    engine.restart()
    builder.join(180)
    assert not builder.is_alive()

    error = outcome.get("error")
    assert isinstance(error, UserError), repr(error)
    message = str(error)
    assert "\n" not in message and "Traceback" not in message
    assert f"Docker engine at {engine.url}" in message, message
    assert "layer alpha 1.0" in message, message
    log = next((project["state"] / "logs").glob("alpha-*.log"))
    assert f"log: {log}" in message, message

    client = docker.DockerClient(base_url=engine.url, version="1.41", timeout=120)
    assert not client.images.list(name=project["repo"]), "a tag survived the cut-off build"

    result, statuses = run_build(client, project, ["one"])
    assert [status for _, status in statuses] == ["built"] * len(statuses)
    assert built_on_parent_or_why(client, result, ["one"]) == []
    assert client.containers.list(all=True) == [], "a container of the cut-off step is left"


def test_a_step_killed_on_a_healthy_engine_is_the_layers_failure(docker_client, project):
    """The other side of the same check: a RUN step killed while the engine stays up (the OOM
    killer, a `docker kill`) is the layer's failure, with its log, not an engine fault."""
    alpha = project["images"] / "alpha" / "Dockerfile.j2"
    alpha.write_text(alpha.read_text() + "RUN sh -c 'kill -9 $$' && true\n")  # not PID 1, not exec'd
    with pytest.raises(UserError) as failure:
        run_build(docker_client, project, ["one"])
    message = str(failure.value)
    assert message.startswith("layer alpha 1.0 failed to build; full log: "), message
    assert "returned a non-zero code: 137" in Path(message.rsplit(": ", 1)[1]).read_text()
