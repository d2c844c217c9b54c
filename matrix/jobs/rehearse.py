"""Rehearse an AWS Batch multi-node parallel job on one Docker engine.

:func:`rehearse` starts ``nodes`` containers of one image on a private bridge network and gives
them the variables Batch gives MNP nodes, in the order Batch starts them: the main node (index 0)
first, then, once it runs, the children in random order (optionally one of them late). Children
get the main container's address on that network as
``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS``; every node shares one random ``MNP_SECRET``.
The main node's output is streamed; when it exits, the children are stopped (as Batch does), every
node's log is written to a folder, and the containers and the network are removed. The result is
the main node's exit status. Cleanup also runs on failure and on Ctrl-C. ``mounts`` (``invoke run
--mount``, the same option the job definition takes) bind the same host folders at the same
container paths on every node, so a rehearsal reads the data paths the real job reads.

``attempts`` (``invoke run --attempts N``) does what Batch does under the retry strategy ``invoke
jobdef`` writes: a job that ends with the entrypoint's infrastructure code
(``entrypoint.core.errors.INFRASTRUCTURE_EXIT``) runs again, on fresh containers, with
``AWS_BATCH_JOB_ATTEMPT`` counting up; any other ending stops. Each attempt's class and reason
(the entrypoint's last line, and the failing node's own error line) is printed.

Output: the main node's output is the job's, so it is passed on byte for byte (``out``: no
decoding, no markup, no wrapping; a line is written whole, so the rehearsal's own lines never
cut one in two), and the rehearsal's own lines (``log``) are one line each. ``say`` and
``write_out`` are what ``invoke run`` uses for a terminal or a pipe alike.
"""

from __future__ import annotations

import contextlib
import random
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import docker
import docker.errors
import requests.exceptions

from entrypoint.core import errors as classes
from entrypoint.settings import config as entrypoint_config
from matrix.errors import UsageError, UserError
from matrix.jobs.mounts import Mount, docker_binds

Log = Callable[[str], None]
Out = Callable[[bytes], None]
# Test hooks (the Python API only): extra ``containers.create`` arguments for node ``index`` of
# attempt ``attempt`` (fake devices, another entrypoint for a node that never joins), and a call
# right after a node's container started (a tc qdisc on its link).
NodeOptions = Callable[[int, int], "dict[str, Any]"]
OnStart = Callable[[int, int, Any], None]
FINAL_LINE = re.compile(classes.FINAL_LINE_PATTERN)
LABEL = "mnp.rehearsal"
INTERRUPTED = 130  # shell convention for SIGINT
# After passing Ctrl-C or SIGTERM on: how long the main node has to stop its launcher (the
# entrypoint kills it MNP_STOP_TIMEOUT, 20 s, after forwarding the signal) and say so.
MAIN_STOP_S = 40.0
TIMED_OUT = 124  # as timeout(1)


_WRITE = threading.Lock()  # the streaming thread and the rehearsal's own lines share stdout


def say(line: str) -> None:
    """One of the rehearsal's own lines on stdout, whole: never folded, never read as markup."""
    with _WRITE:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def write_out(data: bytes) -> None:
    """The nodes' output on stdout exactly as the container wrote it."""
    with _WRITE:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


@dataclass
class _Rehearsal:
    """The Docker objects one rehearsal created, so they can all be removed."""

    run_id: str
    network: Any = None
    containers: dict[int, Any] = field(default_factory=dict)
    streamer: threading.Thread | None = None  # the main node's output, passed on


def batch_environment(index: int, nodes: int, run_id: str, main_ip: str | None,
                      attempt: int = 1) -> dict[str, str]:
    """The AWS Batch MNP variables for node ``index`` (main-node address on children only)."""
    env = {
        "AWS_BATCH_JOB_ID": f"rehearsal-{run_id}#{index}",
        "AWS_BATCH_JOB_ATTEMPT": str(attempt),
        "AWS_BATCH_JOB_NODE_INDEX": str(index),
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_NUM_NODES": str(nodes),
    }
    if index != 0 and main_ip:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main_ip
    return env


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Set by the rehearsal itself, as Batch sets them (and one secret per attempt): not the user's.
REHEARSAL_SETS = ("AWS_BATCH_JOB_", "MNP_SECRET")


def parse_env(items: Sequence[str], nodes: int) -> dict[str, str]:
    """``--env NAME=VALUE`` options as the nodes' environment. A name must be a variable name
    the rehearsal does not set itself; the ``MNP_*`` ones are read by the entrypoint's own
    ``settings.config.load`` (as the main node of this job reads them), so an unknown name or a
    bad value is the entrypoint's one line, here, before any container starts (exit 2)."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not ENV_NAME.match(name):
            raise UsageError(f"--env {item!a}: expected NAME=VALUE with NAME a variable name "
                             "(letters, digits, _), e.g. --env MNP_HEALTH=full")
        if name.startswith(REHEARSAL_SETS):
            raise UsageError(f"--env {name}: the rehearsal sets {name} on every node itself, as "
                             "Batch does; leave it out")
        if "\0" in value:
            raise UsageError(f"--env {name}: the value contains a NUL byte")
        env[name] = value
    settings = {name: value for name, value in env.items() if name.startswith("MNP_")}
    if settings:
        try:
            entrypoint_config.load({"AWS_BATCH_JOB_NODE_INDEX": "0",
                                    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
                                    "AWS_BATCH_JOB_NUM_NODES": str(nodes),
                                    "AWS_BATCH_JOB_ID": "rehearsal#0", **settings})
        except classes.ConfigError as exc:
            raise UsageError(f"--env {exc}") from None
    return env


def start_order(nodes: int, late_node: int | None, rng: random.Random) -> list[int]:
    """Children's start order: random, with ``late_node`` (if any) moved to the end."""
    children = [index for index in range(1, nodes) if index != late_node]
    rng.shuffle(children)
    return children + ([late_node] if late_node is not None else [])


def check_mounts(mounts: Sequence[Mount]) -> None:
    """Every ``--mount`` host folder exists here. Docker would create a missing one, empty: the
    job would then find nothing where the real job reads its data."""
    for mount in mounts:
        if not Path(mount.host).is_dir():
            raise UserError(f"--mount {mount.host}:{mount.container}: no folder {mount.host} on "
                            "this machine (a rehearsal binds the host folder the job reads)")


def _check_args(nodes: int, command: Sequence[str], late_node: int | None,
                mounts: Sequence[Mount] = ()) -> None:
    """One clear line for arguments that cannot describe a job."""
    check_mounts(mounts)
    if nodes < 1:
        raise UserError(f"--nodes {nodes}: need at least 1 node")
    if late_node is not None and not 1 <= late_node < nodes:
        raise UserError(f"--late-node {late_node}: must be a child node index, 1..{nodes - 1}")
    if not command:
        raise UserError("no command given to run on the nodes (put it after --)")


def _container_ip(container: Any, network_name: str) -> str | None:
    """The container's IPv4 address on ``network_name``; None once it has already exited."""
    container.reload()
    networks = container.attrs["NetworkSettings"]["Networks"] or {}
    address = (networks.get(network_name) or {}).get("IPAddress")
    if address:
        return address
    if container.status in ("exited", "dead"):
        return None
    raise UserError(f"container {container.name} got no address on {network_name}")


def _start_node(
    client: docker.DockerClient,
    run: _Rehearsal,
    image: str,
    index: int,
    command: Sequence[str],
    env: Mapping[str, str],
    mounts: Sequence[Mount] = (),
    extra: Mapping[str, Any] | None = None,
    before_start: Callable[[Any], None] | None = None,
) -> Any:
    """Create and start node ``index`` on the rehearsal network; remembered for cleanup.
    ``extra`` adds ``containers.create`` arguments (its ``environment`` is merged);
    ``before_start`` is called with the created container (to attach to its output)."""
    extra = dict(extra or {})
    container = client.containers.create(
        image,
        command=list(command),
        name=f"mnp-{run.run_id}-node{index}",
        hostname=f"node{index}",
        environment={**env, **extra.pop("environment", {})},
        labels={LABEL: run.run_id, f"{LABEL}.node": str(index)},
        network=run.network.name,
        init=False,
        volumes=docker_binds(mounts),
        **extra,
    )
    run.containers[index] = container
    if before_start is not None:
        before_start(container)
    container.start()
    return container


def _attach(container: Any) -> Any:
    """The container's stdout and stderr as they are written, attached before it starts. Not
    ``logs``: the json-file log driver stores text, so bytes that are not UTF-8 come back as
    U+FFFD; attaching reads what the process wrote."""
    return container.attach(stdout=True, stderr=True, stream=True, logs=False)


def _stream(source: Any, log: Log, out: Out | None = None) -> threading.Thread:
    """Forward a container's output (the chunks of ``_attach``) in a background thread: to
    ``out`` as it is, whole lines at a time (the bytes unchanged, newlines included); without
    ``out``, to ``log`` as text, one line per call (the Python API's callers that read lines)."""

    def emit(data: bytes) -> None:
        if out is not None:
            out(data)
            return
        for line in data[:-1].split(b"\n") if data.endswith(b"\n") else data.split(b"\n"):
            log(line.decode(errors="replace"))

    def pump() -> None:
        buffer = b""
        try:
            for chunk in source:
                buffer += chunk
                cut = buffer.rfind(b"\n") + 1
                if not cut:
                    continue
                whole, buffer = buffer[:cut], buffer[cut:]
                emit(whole)
        except (docker.errors.APIError, OSError, ValueError):
            return  # container removed under us: the final log is saved from the folder anyway
        if buffer:
            emit(buffer)

    thread = threading.Thread(target=pump, name="mnp-rehearsal-main-log", daemon=True)
    thread.start()
    return thread


def _wait_exit(container: Any, timeout_s: float | None) -> int:
    """The container's exit status; ``TIMED_OUT`` (after killing it) past ``timeout_s``."""
    try:
        return int(container.wait(timeout=timeout_s)["StatusCode"])
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as exc:
        if not isinstance(exc, requests.exceptions.ReadTimeout) and "timed out" not in str(exc):
            raise
        container.kill()
        return TIMED_OUT


def _save_logs(run: _Rehearsal, log_dir: Path, log: Log) -> None:
    """Write every node's output (stdout and stderr) and exit status to ``log_dir``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for index, container in sorted(run.containers.items()):
        try:
            container.reload()
            output = container.logs(stdout=True, stderr=True)
            status = container.attrs["State"].get("ExitCode")
        except docker.errors.APIError as exc:
            output, status = f"(log unavailable: {exc})\n".encode(), None
        (log_dir / f"node{index}.log").write_bytes(output)
        if index != 0 and status not in (0, None, 137, 143):
            log(f"node {index} exited with status {status} (see {log_dir / f'node{index}.log'})")


def _cleanup(client: docker.DockerClient, run: _Rehearsal, log: Log) -> None:
    """Remove the rehearsal's containers and network, whatever state they are in."""
    # ignore_removed: a container that goes away while it is listed is what this wants anyway
    for container in list(run.containers.values()) + client.containers.list(
        all=True, filters={"label": f"{LABEL}={run.run_id}"}, ignore_removed=True
    ):
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            log(f"could not remove container {container.name}: {exc}")
    if run.network is not None:
        try:
            run.network.remove()
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            log(f"could not remove network {run.network.name}: {exc}")


def rehearse(
    client: docker.DockerClient,
    image: str,
    nodes: int,
    command: list[str],
    late_node: int | None,
    env: dict[str, str],
    log: Log = print,
    *,
    late_delay_s: float = 5.0,
    log_dir: Path | None = None,
    timeout_s: float | None = None,
    stop_timeout_s: int = 10,
    seed: int | None = None,
    mounts: Sequence[Mount] = (),
    attempts: int = 1,
    node_options: NodeOptions | None = None,
    on_start: OnStart | None = None,
    out: Out | None = None,
) -> int:
    """Run ``command`` on ``nodes`` containers of ``image`` as Batch would; the main's status.

    ``env`` is added to every node (the ``MNP_*`` settings, say). ``late_node`` starts that child
    ``late_delay_s`` seconds after the others. Node logs go to ``log_dir`` (a new temporary
    folder by default; its path is logged), one subfolder per attempt when there are several.
    ``timeout_s`` bounds the main node's run (status 124 when exceeded). ``seed`` fixes the
    children's start order. Ctrl-C stops everything and returns 130. ``mounts`` are bound on
    every node. A job ending with the infrastructure code runs again, up to ``attempts`` runs.
    Containers and the network are always removed. ``out`` receives the main node's output
    as bytes, unchanged (``write_out``); without it, its lines go to ``log``.
    """
    _check_args(nodes, command, late_node, mounts)
    _require_image(client, image)
    if attempts < 1:
        raise UserError(f"--attempts {attempts}: must be at least 1")
    base = Path(log_dir or tempfile.mkdtemp(prefix="mnp-rehearsal-"))
    status = 0
    for attempt in range(1, attempts + 1):
        folder = base if attempts == 1 else base / f"attempt{attempt}"
        job = _Job(image, nodes, command, late_node, env, late_delay_s, timeout_s,
                   stop_timeout_s, seed, mounts, attempt, node_options, on_start, out)
        with _terminable():
            status = _rehearse_once(client, job, log, folder)
        cls, where, reason = ending(folder, status)
        log(f"attempt {attempt}/{attempts}: exit {status} ({cls} on node {where}): {reason}")
        if not classes.is_retryable(status):
            return status
        if attempt < attempts:
            log(f"exit {status} is the infrastructure code: running attempt {attempt + 1} on "
                "fresh nodes, as the retry strategy of `invoke jobdef` makes Batch do")
    return status


@dataclass
class _Job:
    """One attempt's inputs."""

    image: str
    nodes: int
    command: list[str]
    late_node: int | None
    env: dict[str, str]
    late_delay_s: float
    timeout_s: float | None
    stop_timeout_s: int
    seed: int | None
    mounts: Sequence[Mount]
    attempt: int
    node_options: NodeOptions | None
    on_start: OnStart | None
    out: Out | None = None


def _rehearse_once(client: docker.DockerClient, job: _Job, log: Log, log_dir: Path) -> int:
    """One attempt on fresh containers and a fresh network: the main node's status."""
    run = _Rehearsal(run_id=secrets.token_hex(4))
    shared = {**job.env, "MNP_SECRET": secrets.token_hex(32)}

    attached: dict[int, Any] = {}

    def start(index: int, main_ip: str | None) -> Any:
        node_env = {**shared, **batch_environment(index, job.nodes, run.run_id, main_ip,
                                                  job.attempt)}
        extra = job.node_options(job.attempt, index) if job.node_options else None
        hook = (lambda c: attached.setdefault(0, _attach(c))) if index == 0 else None
        container = _start_node(client, run, job.image, index, job.command, node_env,
                                job.mounts, extra, hook)
        if job.on_start:
            job.on_start(job.attempt, index, container)
        return container

    try:
        run.network = _create_network(client, run.run_id)
        log(f"rehearsal {run.run_id}: {job.nodes} node(s) of {job.image} on network "
            f"{run.network.name} (attempt {job.attempt})")
        main = start(0, None)
        main_ip = _container_ip(main, run.network.name)
        streamer = run.streamer = _stream(attached[0], log, job.out)
        _start_children(start, job.nodes, main_ip, job.late_node, job.late_delay_s, job.seed,
                        log)
        status = _wait_exit(main, job.timeout_s)
        streamer.join(timeout=5)
        log(f"main node exited with status {status}; stopping the other nodes")
        _stop_children(run, job.stop_timeout_s)
        return status
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        return _interrupt(run, signum, job.stop_timeout_s, log)
    except docker.errors.APIError as exc:
        raise UserError(f"rehearsal failed: Docker: {exc.explanation or exc}") from None
    finally:
        try:
            _save_logs(run, log_dir, log)
            log(f"node logs: {log_dir}")
        finally:
            _cleanup(client, run, log)


class Interrupted(Exception):
    """``invoke run`` was told to stop by a signal other than SIGINT (SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def _terminable() -> Iterator[None]:
    """SIGTERM raises ``Interrupted`` in the main thread while a rehearsal runs (Python's default
    would end the process without removing anything), as Ctrl-C raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(run: _Rehearsal, signum: int, stop_timeout_s: int, log: Log) -> int:
    """Ctrl-C or SIGTERM: pass the signal to the main node's entrypoint, as a person stopping
    the job would, and give it ``MAIN_STOP_S`` to stop its launcher, tell the other nodes and
    write its final line (which names the signal); then stop the rest. The main node's status
    (130 for SIGINT, 143 for SIGTERM), or 128+N if it did not end in time. A second Ctrl-C
    stops waiting."""
    name = signal.Signals(signum).name
    main = run.containers.get(0)
    status = classes.SIGNAL_BASE + signum
    if main is None:
        log(f"interrupted by {name} before the main node started: removing the rehearsal's "
            "containers and network")
        return status
    log(f"interrupted by {name}: passing it to the main node, which stops the job")
    try:
        main.kill(signal=name)
        status = _wait_exit(main, MAIN_STOP_S)
        if status == TIMED_OUT:
            log(f"the main node did not end within {MAIN_STOP_S:g}s of {name}: killed")
            status = classes.SIGNAL_BASE + signum
    except (KeyboardInterrupt, Interrupted):
        log("interrupted again: removing the rehearsal's containers and network now")
    except docker.errors.APIError:
        pass  # it had already ended
    if run.streamer is not None:
        run.streamer.join(timeout=5)  # the main node's last lines before the attempt's line
    with contextlib.suppress(KeyboardInterrupt, Interrupted, docker.errors.APIError):
        _stop_children(run, stop_timeout_s)
    return status


def ending(log_dir: Path, status: int) -> tuple[str, str, str]:
    """``(class, where, reason)`` of an attempt: the main node's last entrypoint line (``where``:
    the node, its address and the rank as that line names them), with the failing node's own
    account when another node failed and said more than that its part ended; by the code alone
    without one."""
    found = _final_line(log_dir / "node0.log")
    if found is None:
        cls = ("success" if status == 0 else classes.INFRASTRUCTURE
               if classes.is_retryable(status) else "unknown")
        return cls, "0", "no mnp-entrypoint final line in the main node's log"
    cls, node, reason = found.group("cls"), found.group("node"), found.group("reason")
    where = node + (f" {found.group('address')}" if found.group("address") else "") + (
        f", rank {found.group('rank')}" if found.group("rank") else "")
    detail = _error_line(log_dir / f"node{node.split(',')[0]}.log") if node != "0" else None
    return cls, where, reason + (f" | node {node} says: {detail}" if detail else "")


def _final_line(path: Path) -> re.Match | None:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        match = FINAL_LINE.search(line)
        if match and line.startswith("mnp-entrypoint["):
            return match
    return None


def _error_line(path: Path) -> str | None:
    """The node's own account: its final line unless that says its part succeeded (an SSH
    launcher's rank failed there, which only the main node's launcher saw), else its last
    ``error:`` line."""
    found = _final_line(path)
    if found is not None:
        return found.group(0) if found.group("cls") != "success" else None
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("mnp-entrypoint[") and "error: " in line:
            return line.split("]: ", 1)[-1]
    return None


def _require_image(client: docker.DockerClient, image: str) -> None:
    """Refuse an image the local engine does not hold (a rehearsal never pulls)."""
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise UserError(f"image {image} is not in the local engine; build it first") from None


def _create_network(client: docker.DockerClient, run_id: str) -> Any:
    """The rehearsal's private bridge network, labelled so cleanup can find it."""
    return client.networks.create(
        f"mnp-rehearsal-{run_id}",
        driver="bridge",
        internal=True,
        labels={LABEL: run_id},
    )


def _start_children(
    start: Callable[[int, str | None], Any],
    nodes: int,
    main_ip: str | None,
    late_node: int | None,
    late_delay_s: float,
    seed: int | None,
    log: Log,
) -> None:
    """Start the children with ``start`` in Batch's order, only when the main node runs."""
    if main_ip is None:
        # Batch starts children only once the main node runs; a main that already ended
        # ends the job.
        log("node 0 (main) exited before the other nodes could start")
        return
    log(f"node 0 (main) started at {main_ip}")
    for index in start_order(nodes, late_node, random.Random(seed)):
        if index == late_node:
            log(f"node {index} held back for {late_delay_s:g}s (late node)")
            time.sleep(late_delay_s)
        start(index, main_ip)
        log(f"node {index} started")


def _stop_children(run: _Rehearsal, stop_timeout_s: int) -> None:
    """Stop every node but the main, as Batch does when the main node exits."""
    for index, container in run.containers.items():
        if index != 0:
            container.stop(timeout=stop_timeout_s)
