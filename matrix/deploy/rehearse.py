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
"""

from __future__ import annotations

import random
import secrets
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import docker
import docker.errors
import requests.exceptions

from matrix.deploy.mounts import Mount, docker_binds
from matrix.errors import UserError

Log = Callable[[str], None]
LABEL = "mnp.rehearsal"
INTERRUPTED = 130  # shell convention for SIGINT
TIMED_OUT = 124  # as timeout(1)


@dataclass
class _Rehearsal:
    """The Docker objects one rehearsal created, so they can all be removed."""

    run_id: str
    network: Any = None
    containers: dict[int, Any] = field(default_factory=dict)


def batch_environment(index: int, nodes: int, run_id: str, main_ip: str | None) -> dict[str, str]:
    """The AWS Batch MNP variables for node ``index`` (main-node address on children only)."""
    env = {
        "AWS_BATCH_JOB_ID": f"rehearsal-{run_id}#{index}",
        "AWS_BATCH_JOB_ATTEMPT": "1",
        "AWS_BATCH_JOB_NODE_INDEX": str(index),
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_NUM_NODES": str(nodes),
    }
    if index != 0 and main_ip:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main_ip
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
) -> Any:
    """Create and start node ``index`` on the rehearsal network; remembered for cleanup."""
    container = client.containers.create(
        image,
        command=list(command),
        name=f"mnp-{run.run_id}-node{index}",
        hostname=f"node{index}",
        environment=dict(env),
        labels={LABEL: run.run_id, f"{LABEL}.node": str(index)},
        network=run.network.name,
        init=False,
        volumes=docker_binds(mounts),
    )
    run.containers[index] = container
    container.start()
    return container


def _stream(container: Any, log: Log) -> threading.Thread:
    """Forward the container's output to ``log`` line by line, in a background thread."""

    def pump() -> None:
        buffer = b""
        try:
            for chunk in container.logs(stream=True, follow=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    log(line.decode(errors="replace"))
        except (docker.errors.APIError, OSError, ValueError):
            return  # container removed under us: the final log is saved from the folder anyway
        if buffer:
            log(buffer.decode(errors="replace"))

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
    for container in list(run.containers.values()) + client.containers.list(
        all=True, filters={"label": f"{LABEL}={run.run_id}"}
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
) -> int:
    """Run ``command`` on ``nodes`` containers of ``image`` as Batch would; the main's status.

    ``env`` is added to every node (the ``MNP_*`` settings, say). ``late_node`` starts that child
    ``late_delay_s`` seconds after the others. Node logs go to ``log_dir`` (a new temporary
    folder by default; its path is logged). ``timeout_s`` bounds the main node's run (status 124
    when exceeded). ``seed`` fixes the children's start order. Ctrl-C stops everything and
    returns 130. ``mounts`` are bound on every node. Containers and the network are always removed.
    """
    _check_args(nodes, command, late_node, mounts)
    _require_image(client, image)
    run = _Rehearsal(run_id=secrets.token_hex(4))
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix=f"mnp-rehearsal-{run.run_id}-"))
    shared = {**env, "MNP_SECRET": secrets.token_hex(32)}

    def start(index: int, main_ip: str | None) -> Any:
        node_env = {**shared, **batch_environment(index, nodes, run.run_id, main_ip)}
        return _start_node(client, run, image, index, command, node_env, mounts)

    try:
        run.network = _create_network(client, run.run_id)
        log(f"rehearsal {run.run_id}: {nodes} node(s) of {image} on network {run.network.name}")
        main = start(0, None)
        main_ip = _container_ip(main, run.network.name)
        streamer = _stream(main, log)
        _start_children(start, nodes, main_ip, late_node, late_delay_s, seed, log)
        status = _wait_exit(main, timeout_s)
        streamer.join(timeout=5)
        log(f"main node exited with status {status}; stopping the other nodes")
        _stop_children(run, stop_timeout_s)
        return status
    except KeyboardInterrupt:
        log("interrupted: removing the rehearsal's containers and network")
        return INTERRUPTED
    except docker.errors.APIError as exc:
        raise UserError(f"rehearsal failed: Docker: {exc.explanation or exc}") from None
    finally:
        try:
            _save_logs(run, log_dir, log)
            log(f"node logs: {log_dir}")
        finally:
            _cleanup(client, run, log)


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
