"""Parallel layer builds and concurrent builds of one stack, on the real engine with small
throwaway stacks (tests/build_project.py): stacks `one` and `two` share alpha and beta, then
branch into gamma and delta."""

from __future__ import annotations

import contextlib
import multiprocessing
import re
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from matrix.errors import UserError
from matrix.image import schedule
from tests.build_project import built_on_parent_or_why, project_files, run_build

pytestmark = pytest.mark.docker
project_fixture = pytest.fixture(name="project")(project_files)

SLOW = "RUN sleep 4\n"
# The build itself records when its RUN step started and ended (epoch seconds, in the layer); the
# token makes the step new to the engine's cache, so the times are this build's. Between the two
# the step waits at a barrier on the host's loopback (builds run with the host's network) that
# lets both branches on only once both have reached it: builds one after the other cannot pass
# it (the first gives up after BARRIER_WAIT seconds and fails its build), and side by side ones
# pass it however late one of them starts on a loaded engine.
BARRIER_WAIT = 120
STAMPED = ("RUN echo {token} && date +%s.%N > /build-start "
           "&& bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && read -r -t {wait} go <&3' "
           "&& date +%s.%N > /build-end\n")


@contextlib.contextmanager
def barrier(parties: int):
    """A loopback TCP port that answers every one of ``parties`` connections once all arrived."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(BARRIER_WAIT)

    def gather() -> None:
        waiting = []
        try:
            while len(waiting) < parties:
                waiting.append(server.accept()[0])
            for conn in waiting:
                conn.sendall(b"go\n")
        except OSError:
            pass  # timed out or closed: the waiting builds fail their step
        finally:
            for conn in waiting:
                conn.close()

    thread = threading.Thread(target=gather, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        thread.join(5)


def build_window(docker_client, ref: str) -> tuple[float, float]:
    """When the stamped RUN step of the layer ``ref`` ran: (start, end) in epoch seconds."""
    out = docker_client.containers.run(ref, ["cat", "/build-start", "/build-end"],
                                       entrypoint=[], remove=True)
    start, end = (float(value) for value in out.split())
    return start, end


LAYER_LINE = re.compile(r"^(\[\d+/\d+\] [^:]+: |  \[[^\]]+\] step \d+/\d+ )")


def unreadable_lines(log: str) -> list[str]:
    """Progress lines of a non-terminal build log (after the base check, before the summary
    table) that do not say which layer they belong to."""
    wrong = []
    for line in log.splitlines():
        if line.strip() == "build summary":  # the summary table's title
            break
        if line.strip() and not line.startswith("base ") and not LAYER_LINE.match(line):
            wrong.append(line)
    return wrong


def test_default_jobs_fit_the_machine():
    assert 2 <= schedule.default_jobs() <= schedule.MAX_DEFAULT_JOBS


def test_two_branches_build_side_by_side_with_true_tags(docker_client, project):
    token = uuid.uuid4().hex
    with barrier(2) as port:
        for name in ("gamma", "delta"):
            template = project["images"] / name / "Dockerfile.j2"
            template.write_text(template.read_text() + STAMPED.format(token=token, port=port,
                                                                       wait=BARRIER_WAIT))
        result, statuses = run_build(docker_client, project, ["one", "two"], jobs=2)
    assert [s for _, s in statuses] == ["built"] * 6
    log = project["log"]
    # Both branches' RUN steps ran at the same time: each started before the other ended.
    gamma = build_window(docker_client, result.chains["one"][-1])
    delta = build_window(docker_client, result.chains["two"][-1])
    assert gamma[0] < delta[1] and delta[0] < gamma[1], (gamma, delta)
    assert built_on_parent_or_why(docker_client, result, ["one", "two"]) == []
    assert unreadable_lines(log) == []
    # Each layer's log holds its own build and nothing of the layer built beside it.
    logs = {layer.name: (project["state"] / "logs" / f"{layer.tag}.log").read_text(encoding="utf-8")
            for layer in result.order(["one", "two"])}
    assert 'echo "gamma 1.0"' in logs["gamma 1.0"] and 'echo "delta 1.0"' not in logs["gamma 1.0"]
    assert 'echo "delta 1.0"' in logs["delta 1.0"] and 'echo "gamma 1.0"' not in logs["delta 1.0"]
    for name in ("one", "two"):
        final = docker_client.images.get(f"{project['repo']}:{name}")
        assert final.id == docker_client.images.get(result.chains[name][-1]).id


def test_failure_in_one_branch_stops_cleanly(docker_client, project):
    (project["images"] / "gamma" / "Dockerfile.j2").write_text(
        (project["images"] / "gamma" / "Dockerfile.j2").read_text()
        + "RUN echo gamma-breaks && exit 7\n")
    delta = project["images"] / "delta" / "Dockerfile.j2"
    delta.write_text(delta.read_text() + SLOW)
    with pytest.raises(UserError) as caught:
        run_build(docker_client, project, ["one", "two"], jobs=2)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("layer gamma 1.0 failed to build; full log: ")
    log_file = message.rsplit(": ", 1)[1]
    assert "gamma-breaks" in Path(log_file).read_text(encoding="utf-8")
    log = project["log"]
    assert "gamma 1.0: FAILED" in log
    # delta was already running: it finishes (and its tag is true); nothing new starts.
    assert "delta 1.0: done" in log
    assert log.count("_stack: skipped") == 2
    assert not docker_client.images.list(name=f"{project['repo']}:one")


def _build_in_process(project: dict, names: list[str], start_at: float, out) -> None:
    """One of two concurrent builds: its own process and client, as a second terminal has."""
    import docker

    client = docker.from_env(timeout=600)
    while time.time() < start_at:
        time.sleep(0.01)
    try:
        _, statuses = run_build(client, project, names, jobs=1)
        out.put(("ok", statuses))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def test_concurrent_builds_of_one_stack_keep_tags_true(docker_client, project):
    for name in ("alpha", "beta", "gamma"):
        template = project["images"] / name / "Dockerfile.j2"
        template.write_text(template.read_text() + "RUN sleep 2\n")
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    start_at = time.time() + 5
    procs = [spawn.Process(target=_build_in_process, args=(
        {k: v for k, v in project.items() if k != "log"}, ["one"], start_at, out))
        for _ in range(2)]
    for proc in procs:
        proc.start()
    answers = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert [kind for kind, _ in answers] == ["ok", "ok"], answers
    statuses = [status for _, pairs in answers for _, status in pairs]
    # Each layer was built once, by one of the two; the other found it under its tag.
    assert statuses.count("built") == 4 and statuses.count("cached") == 4, answers
    result, again = run_build(docker_client, project, ["one"])
    assert [s for _, s in again] == ["cached"] * 4
    assert built_on_parent_or_why(docker_client, result, ["one"]) == []


@pytest.mark.parametrize("value, expected", [
    ("0", "--jobs 0: must be at least 1"),
    ("many", "--jobs 'many': expected a whole number"),
])
def test_jobs_option_is_one_line(value, expected):
    from tests.test_cli import NO_ENGINE, USAGE, invoke, one_error_line

    assert expected in one_error_line(invoke("build", "--jobs", value, env=NO_ENGINE), USAGE)
