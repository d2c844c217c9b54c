"""A tiny Batch-MNP simulator on Docker: one container per node on a private bridge network,
each with the ``AWS_BATCH_JOB_*`` variables Batch would set. Cleans up after itself."""

import contextlib
import re
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class _Following(threading.Thread):
    """A container's output from its start, as it comes: one ``docker logs --follow`` request,
    which ends when the container stops. Asking for the whole log several times a second made
    the engine read and encode it again each time (its CPU is the suite's, on 2 cores)."""

    def __init__(self, container) -> None:
        super().__init__(daemon=True)
        self.stream = container.logs(stream=True, follow=True)
        self.chunks: list[bytes] = []
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            for chunk in self.stream:
                self.chunks.append(chunk)
        except Exception:  # noqa: BLE001, S110 - closed by close(), or the engine went away
            pass
        finally:
            self.ended.set()

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stream.close()


def wait_log(container, needle, timeout, what, dump):
    """The container's log once it holds ``needle``; an AssertionError naming ``what`` with
    ``dump()`` after ``timeout`` seconds or when the container stops first."""
    following = _Following(container)
    following.start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stopped = following.ended.is_set()  # before reading: all its output is in by then
            text = following.text()
            if needle in text:
                return text
            if stopped:
                break
            time.sleep(0.3)
    finally:
        following.close()
    raise AssertionError(f"{needle!r} not in the logs of {what} within {timeout}s:\n{dump()}")


class Cluster:
    def __init__(self, client, image, test_name, mount_entrypoint=False):
        self.client = client
        self.image = image
        slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:30]
        self.prefix = f"mnp-it-{slug}-{uuid.uuid4().hex[:8]}"
        self.mount_entrypoint = mount_entrypoint
        self.containers = []
        self._ips = {}
        self.network = client.networks.create(self.prefix, driver="bridge",
                                              labels={"mnp-test": "1"})
        self.job_id = uuid.uuid4().hex

    def node(self, index, num_nodes, command, main_ip=None, main_index=0, name=None, mounts=None,
             **env):
        """Start the container of node ``index``; children need ``main_ip``. ``mounts`` maps
        host directories to read-only paths in the container (test scripts)."""
        environment = {
            "AWS_BATCH_JOB_ID": f"{self.job_id}#{index}",
            "AWS_BATCH_JOB_NODE_INDEX": str(index),
            "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main_index),
            "AWS_BATCH_JOB_NUM_NODES": str(num_nodes),
        }
        if index != main_index:
            environment["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main_ip
        environment.update({k: str(v) for k, v in env.items()})
        volumes = {}
        if self.mount_entrypoint:
            volumes[str(REPO / "entrypoint")] = {"bind": "/opt/mnp/lib/entrypoint", "mode": "ro"}
        for host_path, container_path in (mounts or {}).items():
            volumes[str(host_path)] = {"bind": container_path, "mode": "ro"}
        container = self.client.containers.create(
            self.image, command, name=f"{self.prefix}-{name or index}",
            environment=environment, network=self.network.name, volumes=volumes,
            labels={"mnp-test": "1"}, shm_size="256m")
        self.containers.append(container)  # before start: cleanup removes it if start fails
        container.start()
        self.ip(container)
        return container

    def ip(self, container):
        """The container's address on the job network (remembered: gone once it exits)."""
        if container.id not in self._ips:
            container.reload()
            nets = container.attrs["NetworkSettings"]["Networks"]
            address = nets.get(self.network.name, {}).get("IPAddress")
            if not address:
                raise AssertionError(f"{container.name} has no address (state "
                                     f"{container.status}):\n{self.logs(container)}")
            self._ips[container.id] = address
        return self._ips[container.id]

    @staticmethod
    def logs(container):
        return container.logs(stdout=True, stderr=True).decode("utf-8", "replace")

    def wait_log(self, container, needle, timeout):
        return wait_log(container, needle, timeout, container.name,
                        lambda: self.logs(container))

    @staticmethod
    def wait_exit(container, timeout):
        """Exit code, or an AssertionError naming the container if it runs past ``timeout``."""
        try:
            result = container.wait(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - requests' ReadTimeout / ConnectionError
            raise AssertionError(f"{container.name} still running after {timeout}s "
                                 f"({exc})") from None
        return result["StatusCode"]

    def cleanup(self):
        for container in self.containers:
            with contextlib.suppress(Exception):  # already gone
                container.remove(force=True)
        with contextlib.suppress(Exception):
            self.network.remove()


