"""``invoke build --registry`` tells a registry's answers apart (matrix/image/registry.py), against
Debian's docker-registry on loopback: with Basic auth on and no credentials the build stops with
one line naming the registry and what to log in with, before anything is built; a registry that
answers 429 is asked again with backoff and then reported; one that came back is used."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import docker
import pytest

from matrix.errors import UserError
from matrix.image.registry import Retry
from tests.build_project import project_files, run_build
from tests.publish.conftest import LocalRegistry, build_image
from tests.publish.stall_proxy import StallProxy, _Handler

pytestmark = pytest.mark.docker
project_fixture = pytest.fixture(name="project")(project_files)
FAST = Retry(attempts=3, first_s=0.01)


@pytest.fixture
def auth_registry(tmp_path: Path):
    """A loopback registry that wants Basic auth (bcrypt htpasswd, as its docs require)."""
    if not shutil.which("htpasswd"):
        pytest.fail("htpasswd is not installed: apt-get install apache2-utils (invoke check "
                    "installs it as root)", pytrace=False)
    root = tmp_path / "auth-registry"
    root.mkdir()
    htpasswd = root / "htpasswd"
    line = subprocess.run(["htpasswd", "-Bbn", "mnp", "not-given-to-the-engine"],
                          capture_output=True, text=True, check=True).stdout
    htpasswd.write_text(line, encoding="utf-8")
    server = LocalRegistry(root=root, htpasswd=htpasswd)
    server.start()
    yield server
    server.stop()


def _built(docker_client, project) -> list[str]:
    return [tag for image in docker_client.images.list(name=project["repo"]) for tag in image.tags]


def test_registry_without_credentials_is_one_line_and_builds_nothing(docker_client, project,
                                                                     auth_registry):
    with pytest.raises(UserError) as info:
        run_build(docker_client, project, ["one"], registry=auth_registry.host, retry=FAST)
    message = str(info.value)
    assert message.startswith(f"registry {auth_registry.host} refused reading the manifest of ")
    assert "authentication failed" in message
    assert f"log in with `docker login {auth_registry.host}`" in message
    assert "\n" not in message
    assert _built(docker_client, project) == []
    assert not (project["state"] / "logs").exists()


class _Busy429(_Handler):
    """Answers 429 Too Many Requests to the first ``server.busy`` manifest requests."""

    def _forward(self) -> None:
        if "/manifests/" in self.path and self.server.busy > 0:
            self.server.busy -= 1
            self.server.refused.append(f"{self.command} {self.path}")
            body = b'{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}'
            self.send_response(429)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body if self.command != "HEAD" else b"")
            return
        super()._forward()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward


def _busy_proxy(registry: LocalRegistry, busy: int) -> StallProxy:
    proxy = StallProxy(registry.port)
    proxy.RequestHandlerClass = _Busy429
    proxy.busy, proxy.refused = busy, []
    return proxy


def test_429_is_retried_then_reported(docker_client, project, registry):
    with _busy_proxy(registry, busy=100) as proxy, pytest.raises(UserError) as info:
        run_build(docker_client, project, ["one"], registry=proxy.host, retry=FAST)
    message = str(info.value)
    assert message.startswith(f"registry {proxy.host} failed reading the manifest of ")
    assert "3 times (last: toomanyrequests: slow down)" in message
    # The engine asks HEAD, then GET, per attempt: three attempts.
    assert [r.split(" ")[0] for r in proxy.refused] == ["HEAD", "GET"] * 3
    assert _built(docker_client, project) == []


def test_429_then_an_answer_goes_on(docker_client, project, registry):
    with _busy_proxy(registry, busy=4) as proxy:  # two attempts of HEAD and GET
        _, statuses = run_build(docker_client, project, ["one"], registry=proxy.host, retry=FAST)
    assert len(proxy.refused) == 4
    assert [s for _, s in statuses] == ["built"] * 4  # 404 from the registry: absent, built
    assert project["log"].count("retrying in") == 2


def test_registry_that_does_not_answer_is_retried_then_reported(docker_client, project,
                                                                 unused_port):
    host = f"127.0.0.1:{unused_port}"
    with pytest.raises(UserError, match=rf"^registry {host} failed reading the manifest of .* "
                                        r"3 times \(last: .*connection refused"):
        run_build(docker_client, project, ["one"], registry=host, retry=FAST)
    assert _built(docker_client, project) == []


def _push_as(client, image_ref: str, remote: str) -> None:
    repository, tag = remote.rsplit(":", 1)
    client.images.get(image_ref).tag(repository, tag)
    for event in client.images.push(repository, tag=tag, stream=True, decode=True):
        assert "error" not in event, event
    # Only the local copy of the registry's name is cleaned up here: once (2026-11-27, a full
    # run) it was already gone, cause not found; the test's claims are about the registry.
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(remote)


def test_registry_layer_is_used_only_on_its_recorded_parent(docker_client, project, registry,
                                                            shell_base):
    """A layer pushed from a build on this base is pulled; one whose recorded parent (its
    io.github.mnp-stacks.parent label) is another image is built here instead. The project's
    base is the shell-only one (tests/publish/conftest.py): the push sends the base layer too."""
    from matrix.image.build import remote_ref
    from tests.build_project import remove_repository

    stacks = project["stacks"]
    stacks.write_text(stacks.read_text().replace("image: debian:bookworm", f"image: {shell_base}"))
    result, _ = run_build(docker_client, project, ["one"])
    alpha = result.chain("one")[0]
    _push_as(docker_client, alpha.ref, remote_ref(alpha, registry.host))
    remove_repository(docker_client, project["repo"])
    _, statuses = run_build(docker_client, project, ["one"], registry=registry.host, retry=FAST)
    assert statuses[0] == ("alpha 1.0", "pulled")

    # Same content tag in the registry, but built on another parent: not used.
    stranger = f"{project['repo']}-stranger:x"
    build_image(docker_client, f"FROM {shell_base}\nLABEL io.github.mnp-stacks.parent=sha256:0000\n",
                stranger)
    _push_as(docker_client, stranger, remote_ref(alpha, registry.host))
    docker_client.images.remove(stranger)
    remove_repository(docker_client, project["repo"])
    _, statuses = run_build(docker_client, project, ["one"], registry=registry.host, retry=FAST)
    assert statuses[0] == ("alpha 1.0", "built")
    assert f"was built on parent sha256:0000, not on this engine's {shell_base}" in project["log"]
