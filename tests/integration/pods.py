"""Containers playing a scheduler's pods: one container of the image under test per pod, on a
private bridge network, with the pod's name as host name and network aliases (the DNS names a
Kubernetes headless Service gives it), the environment its controller sets, and the command in
``args:`` form only (the image's ENTRYPOINT stays: ``mnp-entrypoint``).

Only what cannot exist here is played: the controllers' reconcile loops. Containers and the
network carry the label ``mnp-test=1`` and are removed by ``cleanup``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import time
import uuid
from pathlib import Path

from tests.integration.cluster import wait_log

# Test-only: Debian's etcd 3.4 server and python-etcd, for torchrun's etcd rendezvous.
ETCD_LAYER = """\
ARG BASE
FROM ${BASE}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      etcd-server python3-etcd \\
 && rm -rf /var/lib/apt/lists/* \\
 && python3 -c 'import etcd' && etcd --version
"""


def layer_image(client, base: str, layer: str, name: str) -> str:
    """``base`` plus a test-only layer, built once per base image (reused while cached)."""
    base_id = client.images.get(base).id
    tag = f"mnp-test-{name}:{hashlib.sha256((base_id + layer).encode()).hexdigest()[:16]}"
    from docker.errors import ImageNotFound

    try:
        client.images.get(tag)
        return tag
    except ImageNotFound:
        pass
    # host network, as the project's builder: apt reaches the mirror the way the host does
    client.images.build(fileobj=io.BytesIO(layer.encode()), tag=tag, buildargs={"BASE": base},
                        network_mode="host", labels={"mnp-test": "1"}, rm=True, pull=False)
    return tag


class Pods:
    """``pod(name, args, env, aliases)`` starts one; ``wait_exit``, ``logs``, ``cleanup``."""

    def __init__(self, client, image: str, share: Path) -> None:
        self.client = client
        self.image = image
        self.share = share
        self.prefix = f"mnp-pods-{uuid.uuid4().hex[:8]}"
        self.containers: dict = {}
        self.network = client.networks.create(self.prefix, driver="bridge",
                                              labels={"mnp-test": "1"})

    def pod(self, name: str, args: list[str] | None, env: dict[str, str],
            aliases: tuple[str, ...] = (), volumes: dict | None = None, entrypoint=None):
        """A container named like the pod, reachable as ``name`` and each alias."""
        endpoint = self.client.api.create_endpoint_config(aliases=[name, *aliases])
        binds = {str(self.share): {"bind": "/share", "mode": "rw"}}
        binds.update(volumes or {})
        container = self.client.containers.create(
            self.image, args, entrypoint=entrypoint, name=f"{self.prefix}-{name}",
            hostname=name, environment=env, network=self.network.name,
            networking_config={self.network.name: endpoint}, volumes=binds,
            labels={"mnp-test": "1"}, shm_size="256m")
        self.containers[name] = container  # before start: cleanup removes it if start fails
        container.start()
        return container

    def logs(self, name: str | None = None) -> str:
        names = [name] if name else list(self.containers)
        return "\n".join(f"== {n}\n" + self.containers[n].logs().decode("utf-8", "replace")
                         for n in names)

    def wait_exit(self, name: str, timeout: float) -> int:
        try:
            return self.containers[name].wait(timeout=timeout)["StatusCode"]
        except Exception as exc:  # noqa: BLE001 - requests' ReadTimeout / ConnectionError
            raise AssertionError(f"pod {name} still running after {timeout}s ({exc})\n"
                                 f"{self.logs()}") from None

    def wait_log(self, name: str, needle: str, timeout: float) -> str:
        return wait_log(self.containers[name], needle, timeout, f"pod {name}", self.logs)

    def wait_file(self, path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} did not appear in {timeout}s\n{self.logs()}")
            time.sleep(0.3)

    def cleanup(self) -> None:
        for container in self.containers.values():
            with contextlib.suppress(Exception):  # already gone
                container.remove(force=True)
        with contextlib.suppress(Exception):
            self.network.remove()
