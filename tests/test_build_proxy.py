"""http_proxy/https_proxy/no_proxy set for invoke reach the builds, through a real loopback
proxy, and never reach the image (its history or configuration)."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import uuid

import pytest

from matrix.image import proxy
from tests.build_project import project_files, run_build

pytestmark = pytest.mark.docker
project_fixture = pytest.fixture(name="project")(project_files)

# apt reads http_proxy; the shell proves https_proxy and no_proxy arrive too (pip and curl read
# them). apt's failure is expected: the proxy answers 404, the test only needs it to be asked.
PROXY_TEMPLATE = """{% import "_macros.j2" as m %}
FROM {{ parent }}
{{ m.preamble(component, version) }}
RUN apt-get -o Acquire::Retries=0 update > /tmp/apt.log 2>&1 || true; \\
    test -n "$https_proxy" && test "$HTTPS_PROXY" = "$https_proxy" && test -n "$no_proxy" \\
 && echo proxied > /proxied && rm -rf /var/lib/apt/lists/* /tmp/apt.log
"""


class _Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[str] = []


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Proxy

    def _refuse(self) -> None:
        self.server.seen.append(f"{self.command} {self.path}")
        self.send_error(404 if self.command == "GET" else 403)

    do_GET = do_HEAD = do_CONNECT = _refuse  # noqa: N815 - http.server's naming

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def loopback_proxy():
    server = _Proxy()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_build_args_take_either_spelling():
    args = proxy.build_args({"HTTPS_PROXY": "http://p:3128", "no_proxy": "localhost"})
    assert args == {"HTTPS_PROXY": "http://p:3128", "https_proxy": "http://p:3128",
                    "NO_PROXY": "localhost", "no_proxy": "localhost"}
    assert proxy.build_args({}) == {}


def test_proxy_reaches_the_build_and_not_the_image(docker_client, project, loopback_proxy,
                                                   monkeypatch):
    (project["images"] / "withca" / "Dockerfile.j2").write_text(PROXY_TEMPLATE)
    marker = f"mnp{uuid.uuid4().hex[:12]}"
    url = f"http://{marker}@127.0.0.1:{loopback_proxy.server_address[1]}"
    monkeypatch.setenv("http_proxy", url)
    monkeypatch.setenv("https_proxy", url)
    monkeypatch.setenv("no_proxy", f"{marker}.invalid")
    result, statuses = run_build(docker_client, project, ["ca"])
    assert [s for _, s in statuses] == ["built", "built"]
    assert any(line.startswith("GET http://deb.debian.org/debian/dists/bookworm/")
               for line in loopback_proxy.seen), loopback_proxy.seen
    final = result.chains["ca"][-1]
    run = docker_client.containers.run(final, ["cat", "/proxied"], remove=True)
    assert run.decode().strip() == "proxied"
    history = subprocess.run(["/usr/bin/docker", "history", "--no-trunc", final],
                             capture_output=True, text=True, check=True).stdout
    inspect = json.dumps([docker_client.images.get(ref).attrs for ref in result.chains["ca"]])
    address = f"127.0.0.1:{loopback_proxy.server_address[1]}"
    for text in (history, inspect):
        assert marker not in text and address not in text
