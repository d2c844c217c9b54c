"""Issue 17, High 3 on a real engine: dockerd restarted while a layer's RUN step is running,
either as `systemctl restart docker` does (SIGTERM) or killed (SIGKILL: systemd's end for a stop
that outlasts its timeout, a slow shutdown under load, the OOM killer). The build ends with one
line naming the engine, the layer and its log; no content tag is left for the layer that was cut
off; the same build, run again once the engine is back, completes with every tag naming the image
its child was built on; and the engine keeps no container from the cut-off step, while a user's
container on it stays.

A killed dockerd never runs the build's own cleanup (``forcerm``), so its restarted engine always
holds the cut-off step's container: that case fails unless the builder removes it
(:mod:`matrix.image.cutoff`). After SIGTERM the daemon usually removes it itself; under load its
shutdown can end first, and then the builder's removal is what passes.

The engine is a second dockerd the test starts itself (tests/second_engine.py), with the throwaway
project of tests/build_project.py on the Debian base copied over from the first engine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import docker
import pytest
import requests

from matrix.errors import UserError
from matrix.image import cutoff
from tests.build_project import built_on_parent_or_why, project_files, run_build
from tests.second_engine import SecondEngine, usable

pytestmark = [pytest.mark.docker, pytest.mark.slow]
project_fixture = pytest.fixture(name="project")(project_files)

BASE = "debian:bookworm"
SLOW_STEP = "RUN sleep 15\n"  # long enough to restart the engine under it
BYSTANDER = "mnp-users-own"  # a user's container on the engine: the builder must leave it alone
ENGINE_START_S = 240  # a loaded 2-core machine: dockerd restores the killed step (10 s stop) first


@pytest.fixture
def engine(docker_client):
    why = usable()
    if why:
        pytest.skip(why)
    # A short path: a unix socket's path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="mnp-engine-", dir="/tmp"))
    try:
        with SecondEngine(root, "mnptest0", "172.31.251.1/24", "mnptest",
                          data_in_memory=True) as second:
            save = subprocess.Popen([second.cli[0], "save", BASE], stdout=subprocess.PIPE)
            subprocess.run([*second.cli, "load", "-q"], stdin=save.stdout, check=True,
                           capture_output=True)
            assert save.wait() == 0
            yield second
    finally:
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


def unmount_under(root: Path) -> None:
    """Unmount what the engines left under ``root``: a killed dockerd never unmounts its data
    root's bind mount or its network namespace file, and a busy mount would keep the test's
    engine (a copy of the Debian base) on disk after the rmtree."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def wait_for_running_step(client, seconds: float = 120) -> None:
    """Until the slow step's container runs (not an earlier step's, which lives milliseconds)."""
    deadline = time.monotonic() + seconds
    while not any("sleep 15" in " ".join(c.attrs["Config"]["Cmd"] or ())
                  for c in client.containers.list(ignore_removed=True)):
        assert time.monotonic() < deadline, "the slow RUN step never started"
        time.sleep(0.1)


def restart(engine: SecondEngine, how: signal.Signals) -> None:
    """Stop the engine with ``how`` and start it again. After SIGKILL its own containerd dies a
    moment later (the parent-death signal dockerd gives it); a dockerd started before that
    attaches to the dying one and times out, so wait for it to go first."""
    pidfile = engine.root / "exec" / "containerd" / "containerd.pid"
    containerd = int(pidfile.read_text()) if pidfile.exists() else 0
    engine.stop(sig=how)
    deadline = time.monotonic() + 60
    while containerd and time.monotonic() < deadline:
        try:
            os.kill(containerd, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    engine.start(seconds=ENGINE_START_S)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["restarted", "killed"])
def test_engine_restart_mid_build(engine, project, how):
    alpha = project["images"] / "alpha" / "Dockerfile.j2"
    alpha.write_text(alpha.read_text() + SLOW_STEP)
    client = docker.DockerClient(base_url=engine.url, version="1.41", timeout=120)
    client.containers.create(BASE, ["sleep", "15"], name=BYSTANDER)
    outcome: dict = {}

    def first_build() -> None:
        try:
            run_build(client, project, ["one"])
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    builder = threading.Thread(target=first_build)
    builder.start()
    wait_for_running_step(client)
    restart(engine, how)
    builder.join(180)
    assert not builder.is_alive()

    error = outcome.get("error")
    assert isinstance(error, UserError), repr(error)
    message = str(error)
    assert "\n" not in message and "Traceback" not in message
    assert f"Docker engine at {engine.url}" in message, message
    assert "layer alpha 1.0" in message, message
    assert "EngineGone: it stopped or restarted mid-build" in message, message
    assert message.endswith("run the command again once the engine answers"), message
    log = next((project["state"] / "logs").glob("alpha-*.log"))
    assert f"log: {log}" in message, message
    step = re.search(r"cut-off step's container ([0-9a-f]{12})", message)
    if how == signal.SIGKILL:  # the daemon cannot have removed it: the builder says what it did
        assert step, message
        assert f"Running in {step[1]}" in log.read_text(), "not the cut-off step's container"

    client = docker.DockerClient(base_url=engine.url, version="1.41", timeout=120)
    assert not client.images.list(name=project["repo"]), "a tag survived the cut-off build"

    result, statuses = run_build(client, project, ["one"])
    assert [status for _, status in statuses] == ["built"] * len(statuses)
    assert built_on_parent_or_why(client, result, ["one"]) == []
    if step and "the next build removes" in message:
        assert f"removed container {step[1]}, left by a build step of layer alpha" in \
            project["log"], project["log"]
    left = [c.name for c in client.containers.list(all=True, ignore_removed=True)]
    assert left == [BYSTANDER], f"a container of the cut-off step is left: {left}"


def test_a_step_whose_removal_failed_is_still_cut_off():
    """The builder's own words decide which container is the cut-off step's: one it announced and
    removed is not; one whose removal it reports failing (a daemon shutting down) still is."""
    steps = cutoff.Steps("layer alpha 1.0")
    for line in (" ---> eb41a85833f4\n", "Step 2/3 : RUN true\n", " ---> Running in 97b7f35cf0f6\n",
                 "Removing intermediate container 97b7f35cf0f6\n", " ---> 2f7d3c4865c4\n"):
        steps.see(line)
    assert steps.cut_off() is None
    steps.see("Step 3/3 : RUN sleep 15\n ---> Running in 4d5bb2654932\n")
    steps.see("Error removing intermediate container 4d5bb2654932: daemon is shutting down\n")
    assert steps.cut_off() == cutoff.CutOff("4d5bb2654932", "2f7d3c4865c4", "layer alpha 1.0")


def test_a_timed_out_read_is_not_a_cut_off_and_bad_records_are_dropped(tmp_path):
    """A client read that timed out leaves the engine running the step: nothing is removed or
    recorded. A record whose IDs are not the builder's 12 hex digits is dropped with one line,
    without asking the engine (no client is given: using it would fail this test)."""
    steps = cutoff.Steps("layer alpha 1.0")
    steps.see(" ---> 2f7d3c4865c4\nStep 3/3 : RUN sleep 15\n ---> Running in 4d5bb2654932\n")
    assert cutoff.after_fault(None, steps, tmp_path, "engine-a",
                              requests.exceptions.ReadTimeout("read timed out")) == ""
    assert not (tmp_path / "cut-off").exists()
    folder = tmp_path / "cut-off" / "engine-a"
    folder.mkdir(parents=True)
    (folder / "bad.json").write_text('{"container": "", "image": "2f7d3c4865c4", "layer": "x"}')
    said = []
    cutoff.sweep(None, tmp_path, "engine-a", said.append)
    assert not (folder / "bad.json").exists()
    assert len(said) == 1 and "ignored an unreadable record" in said[0], said


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
