"""Fixtures for the publish tests: a real registry server and a tiny real image chain.

The registry is Debian's ``docker-registry`` (docker/distribution) serving plain HTTP on a free
loopback port with filesystem storage in a temporary folder; the Docker engine treats
127.0.0.0/8 as an insecure registry, so it pushes there without TLS. Nothing is pulled: the image
chain is built locally on a shell-only base made from ``debian:bookworm`` (``SHELL_BASE``), which
must already be in the engine. A missing engine, registry server or base image fails these tests
(as the root ``docker_client`` fixture does) instead of skipping them: CI and ``invoke check``
provide all three.
"""

from __future__ import annotations

import http.client
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.build_project import repository_tags
from tests.conftest import held

REGISTRY_BINARY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
BASE_IMAGE = "debian:bookworm"


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalRegistry:
    """A ``docker-registry serve`` process that can be stopped and started again on the same
    port and storage (to simulate an outage)."""

    root: Path
    port: int = field(default_factory=_free_port)
    process: subprocess.Popen | None = None
    htpasswd: Path | None = None  # a bcrypt htpasswd file turns the registry's Basic auth on

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``, the registry part of image references."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The server's combined output, including one access-log line per HTTP request."""
        return self.root / "registry.log"

    def _write_config(self) -> Path:
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: info\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n"
            f"http:\n  addr: {self.host}\n  secret: {secrets.token_hex(16)}\n"
            + (f"auth:\n  htpasswd:\n    realm: mnp-test\n    path: {self.htpasswd}\n"
               if self.htpasswd else ""),
            encoding="utf-8",
        )
        return config

    def start(self) -> None:
        """Start the server and wait until ``/v2/`` answers."""
        config = self._write_config()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [REGISTRY_BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {self.log_path.read_text()[-2000:]}")
            try:
                if self.get("/v2/").status == (401 if self.htpasswd else 200):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("docker-registry did not come up within 15 s")

    def stop(self) -> None:
        """Stop the server (the storage stays)."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def get(self, path: str, headers: dict[str, str] | None = None, method: str = "GET"):
        """One HTTP request to the registry API; the response, body read."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request(method, path, headers=headers or {})
            response = conn.getresponse()
            response.body = response.read()
            return response
        finally:
            conn.close()

    def manifest_digest(self, repo: str, reference: str) -> str | None:
        """The registry's own ``Docker-Content-Digest`` for ``repo:reference`` (None if absent)."""
        accept = (
            "application/vnd.docker.distribution.manifest.v2+json, "
            "application/vnd.oci.image.manifest.v1+json"
        )
        response = self.get(f"/v2/{repo}/manifests/{reference}", {"Accept": accept}, "HEAD")
        return response.getheader("Docker-Content-Digest") if response.status == 200 else None

    def log_size(self) -> int:
        """Current length of the server log, to look only at requests after this point."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def requests_since(self, offset: int) -> list[str]:
        """The HTTP request lines (``"METHOD /v2/... HTTP/1.1"``) logged after ``offset``."""
        with self.log_path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        lines = []
        for line in text.splitlines():
            if '"' in line and " /v2/" in line:
                request = line.split('"')[1]
                if request.split(" ")[0] in {"GET", "HEAD", "PUT", "POST", "PATCH", "DELETE"}:
                    lines.append(request)
        return lines


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    """A fresh, running loopback registry; stopped after the test."""
    if not Path(REGISTRY_BINARY).exists():
        pytest.fail("docker-registry is not installed: apt-get install docker-registry "
                    "(invoke check installs it as root; the CI jobs install it)", pytrace=False)
    server = LocalRegistry(root=tmp_path / "registry")
    server.root.mkdir()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """``debian:bookworm`` from the local engine (never pulled). The Docker engine is
    ``tests/conftest.py``'s ``docker_client``, which fails the test when none answers."""
    import docker.errors

    try:
        docker_client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{BASE_IMAGE} is not in the local engine: `docker pull {BASE_IMAGE}`, or "
                    "`invoke build --stack cpu-tcp` bootstraps it (these tests never pull)",
                    pytrace=False)
    return BASE_IMAGE


@dataclass(frozen=True)
class Chain:
    """A built two-layer stack: local refs in build order, the final ref, the stack name."""

    repo: str
    layer_refs: list[str]
    final_ref: str
    stack: str
    image_id: str


def build_image(client, dockerfile: str, tag: str | None = None) -> str:
    """Build ``dockerfile`` (no context), tagged ``tag`` if given; the image ID.

    Without the engine's cache: its probe for a step lists the images on the step's parent (on
    ``FROM scratch``, every image without a parent) and then reads each, so another test deleting
    one of them in between fails the build with ``unable to find image`` (moby
    image/cache/cache.go, getLocalCachedImage; seen 2026-11-30). Every image built here is new
    content (a nonce) or built once (:func:`_base_once`), so the cache had nothing to give. The
    publish tests build through this function alone."""
    import io

    image, _ = client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True, pull=False,
        nocache=True)
    return image.id


# The base of the pushed test images: bash (also /bin/sh) with the libraries it loads, copied
# from the engine's debian:bookworm into one layer of about 4 MB (the project's templates run
# their steps with SHELL ["/bin/bash", ...]). Each test pushes to a registry of its own, so the
# engine compresses the base layer again for every push: debian:bookworm's 173 MB took dockerd
# 12 s of CPU per push (2026-11-28), the engine's largest cost in the suite.
# What the push tests claim (what is sent, retried, refused, reported) does not depend on the
# layer's size.
SHELL_BASE = "mnp-test-shell-base"


def copy_base_dockerfile(debian: str, binaries: tuple[str, ...], files: tuple[str, ...] = ()) -> str:
    """A one-layer image of ``binaries`` with the libraries they load and ``files``, copied
    from ``debian``; /bin/sh and /bin/bash are its bash."""
    return f"""\
FROM {debian} AS debian
RUN mkdir /shell && for bin in {' '.join(binaries)}; do cp --parents "$bin" /shell \\
 && for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do cp -L --parents "$lib" /shell; done; done \\
 && for file in {' '.join(files)}; do cp --parents "$file" /shell; done \\
 && mkdir /shell/bin && ln -s /usr/bin/bash /shell/bin/bash && ln -s /usr/bin/bash /shell/bin/sh
FROM scratch
COPY --from=debian /shell/ /
"""


# The SBOM push test's base: the shell base plus cat and debian:bookworm's package database
# (/var/lib/dpkg/status), which is what the SBOM reads of a Debian image (matrix/image/sbom.py
# runs ``cat /var/lib/dpkg/status`` in a container of it), in one layer of about 5 MB. Pushing
# debian:bookworm itself cost dockerd 17.6 s of CPU (2026-11-29). That the SBOM lists what a real
# image holds is test_sbom.py's cpu-tcp test.
DPKG_BASE = "mnp-test-dpkg-base"


def _base_once(client, base: str, dockerfile: str, repository: str) -> str:
    """``dockerfile`` built on ``base`` as ``repository:<hash of the base's image ID and the
    Dockerfile>``, once across processes (tests/conftest.py ``held``): the next worker, and the
    next run, find the tag and build nothing (it was built by every worker of every run before).
    A tag naming its inputs never moves under a test that uses it either."""
    import hashlib

    key = hashlib.sha256(f"{client.images.get(base).id}\n{dockerfile}".encode()).hexdigest()[:16]
    tag = f"{repository}:{key}"
    with held(repository):
        if not client.images.list(name=tag):
            build_image(client, dockerfile, tag)
    return tag


@pytest.fixture(scope="session")
def shell_base(docker_client, base_image) -> str:
    """A base image holding only bash (``SHELL_BASE``), built from ``base_image`` (cached by the
    engine after the first build)."""
    return _base_once(docker_client, base_image,
                      copy_base_dockerfile(base_image, ("/usr/bin/bash",)), SHELL_BASE)


def _chain(client, base: str) -> Iterator[Chain]:
    """Two small real images on ``base``, the second built on the first, tagged like a stack's
    layers. The repository name is unique per session, so parallel runs do not share tags; all
    its tags (local and registry-named) are removed at the end."""
    repo = f"mnp-pubtest-{secrets.token_hex(3)}/chain"
    nonce = secrets.token_hex(8)  # a fresh image per session: pushes really send data
    first = f"{repo}:layer-{nonce}-a"
    second = f"{repo}:layer-{nonce}-b"
    build_image(client, f"FROM {base}\nRUN echo {nonce} > /layer-a\n", first)
    image_id = build_image(client, f"FROM {first}\nRUN echo b > /layer-b\n", second)
    final = f"{repo}:tinystack"
    client.images.get(second).tag(repo, "tinystack")
    yield Chain(repo, [first, second], final, "tinystack", image_id)
    for tag in repository_tags(client, repo):
        client.images.remove(tag, noprune=False)


@pytest.fixture(scope="session")
def chain(docker_client, shell_base) -> Iterator[Chain]:
    """A two-layer chain on the shell-only base."""
    yield from _chain(docker_client, shell_base)


@pytest.fixture(scope="session")
def debian_chain(docker_client, base_image) -> Iterator[Chain]:
    """A two-layer chain on ``DPKG_BASE`` (built from ``base_image``), for what reads the
    Debian packages."""
    dpkg_base = _base_once(docker_client, base_image,
                           copy_base_dockerfile(base_image, ("/usr/bin/bash", "/usr/bin/cat"),
                                                ("/var/lib/dpkg/status",)), DPKG_BASE)
    yield from _chain(docker_client, dpkg_base)


@pytest.fixture
def unused_port() -> int:
    """A loopback port with no server behind it."""
    return _free_port()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """An empty test-record folder."""
    path = tmp_path / "test-results"
    path.mkdir()
    return path
