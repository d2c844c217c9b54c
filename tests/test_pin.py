"""`invoke pin`: pins resolved against a real PEP 691 index served on loopback, downloads hashed."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from matrix.errors import UserError
from matrix.model import pin
from matrix.model.loader import load_matrix
from matrix.model.settings import CA_ENV_VARS

ROOT = Path(__file__).resolve().parent.parent
WHEEL_310 = b"fake wheel for cp310"
WHEEL_311 = b"fake wheel for cp311"
SDIST = b"fake sdist"
ARCHIVE = b"an archive on some other host"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Server:
    """A PEP 691 simple index for project `demo` (1.0: two wheels and an sdist) plus raw files."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.files: dict[str, bytes] = {
            "/files/demo-1.0-cp310-cp310-manylinux2014_x86_64.whl": WHEEL_310,
            "/files/demo-1.0-cp311-cp311-manylinux2014_x86_64.whl": WHEEL_311,
            "/files/demo-1.0.tar.gz": SDIST,
            "/archive/thing.tar.gz": ARCHIVE,
        }
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path == "/simple/demo/":
                    body = json.dumps(server.index()).encode()
                    kind = pin.SIMPLE_JSON
                elif self.path in server.files:
                    body, kind = server.files[self.path], "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def index(self) -> dict:
        return {"meta": {"api-version": "1.0"}, "name": "demo", "files": [
            {"filename": path.rsplit("/", 1)[1], "url": self.url + path,
             "hashes": {"sha256": sha(data)}, "requires-python": ">=3.10"}
            for path, data in self.files.items() if path.startswith("/files/")]}


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the test's own CA bundle)."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make the loopback index's certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def running(tls) -> Iterator[Server]:
    started = Server(*tls)
    yield started
    started.httpd.shutdown()


@pytest.fixture
def server(running, tls, monkeypatch) -> Server:
    """The loopback index, trusted the way pin trusts a proxy CA: through the environment."""
    for variable in CA_ENV_VARS:
        monkeypatch.setenv(variable, str(tls[0]))
    return running


def stacks_text(server: Server, pin_line: str, download: str = "", python: str = "3.10.12") -> str:
    return f"""\
repository: test-stacks
bases:
  ubuntu:
    image: ubuntu:22.04
    os: ubuntu22.04
    provides: {{python: "{python}"}}
components:
  demo:
    description: demo
    versions:
      "1.0":
        source: pip
        pip:
          {pin_line}
  deepspeed-habana:
    description: a download
    versions:
      "2.0":
        source: download
{download or f'        download: {{url: "{server.url}/archive/thing.tar.gz", sha256: {sha(ARCHIVE)}}}'}
stacks:
  small:
    description: small
    base: ubuntu
    instances: [c5n.18xlarge]
    fabric: tcp
    layers:
      - demo: "1.0"
      - deepspeed-habana: "2.0"
"""


def write_stacks(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "stacks.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def index(server: Server) -> pin.Index:
    return pin.Index(server.url + "/simple")


def test_write_resolves_the_wheel_for_the_stacks_python(server, tmp_path):
    path = write_stacks(tmp_path, stacks_text(
        server, 'demo: {version: "1.0", sha256: ' + "ab" * 32 + "}  # keep me", python="3.11.2"))
    report = pin.write(path, index(server))
    assert len(report.written) == 1 and not report.failed
    line = next(x for x in path.read_text().splitlines() if x.strip().startswith("demo: {"))
    assert line == ("          demo: {version: \"1.0\", sha256: " + sha(WHEEL_311)
                    + ', requires_python: ">=3.10", tag: cp311-cp311-manylinux2014_x86_64}  # keep me')
    assert pin.check(load_matrix(path), index(server)).failed == []
    assert pin.write(path, index(server)).written == []  # idempotent


def test_write_keeps_the_file_a_recorded_sha256_names(server, tmp_path):
    path = write_stacks(tmp_path, stacks_text(
        server, 'demo: {version: "1.0", sha256: ' + sha(SDIST) + "}"))
    pin.write(path, index(server))
    assert f"sha256: {sha(SDIST)}" in path.read_text() and "tag: sdist" in path.read_text()


def test_check_names_a_sha256_the_release_does_not_have(server, tmp_path):
    path = write_stacks(tmp_path, stacks_text(
        server, 'demo: {version: "1.0", sha256: ' + "cd" * 32
        + ', requires_python: ">=3.10", tag: sdist}'))
    report = pin.check(load_matrix(path), index(server))
    assert len(report.failed) == 1
    assert report.failed[0].startswith(f"{path}:14: ") and "is not a file of this release" in \
        report.failed[0]


def test_check_finds_stale_requires_python(server, tmp_path):
    path = write_stacks(tmp_path, stacks_text(
        server, 'demo: {version: "1.0", sha256: ' + sha(WHEEL_310)
        + ', requires_python: ">=3.6", tag: cp310-cp310-manylinux2014_x86_64}'))
    (failure,) = pin.check(load_matrix(path), index(server)).failed
    assert "requires_python '>=3.6' (index: '>=3.10')" in failure and "invoke pin" in failure


def test_check_hashes_downloads_and_reports_what_it_cannot_reach(server, tmp_path):
    good = 'demo: {version: "1.0", sha256: ' + sha(WHEEL_310) \
        + ', requires_python: ">=3.10", tag: cp310-cp310-manylinux2014_x86_64}'
    path = write_stacks(tmp_path, stacks_text(server, good))
    report = pin.check(load_matrix(path), index(server))
    assert report.failed == [] and report.unchecked == [] and len(report.ok) == 2

    wrong = f'        download: {{url: "{server.url}/archive/thing.tar.gz", sha256: {"ef" * 32}}}'
    report = pin.check(load_matrix(write_stacks(tmp_path, stacks_text(server, good, wrong))),
                       index(server))
    assert len(report.failed) == 1 and f"has sha256 {sha(ARCHIVE)}" in report.failed[0]

    dead = f'        download: {{url: "https://127.0.0.1:1/x.tar.gz", sha256: {"ef" * 32}}}'
    report = pin.check(load_matrix(write_stacks(tmp_path, stacks_text(server, good, dead))),
                       index(server))
    assert report.failed == [] and len(report.unchecked) == 1
    assert "127.0.0.1:1" in report.unchecked[0] and "unreachable" in report.unchecked[0]


def test_check_prints_the_sha256_of_an_archive_not_pinned_yet(server, tmp_path):
    good = 'demo: {version: "1.0", sha256: ' + sha(WHEEL_310) \
        + ', requires_python: ">=3.10", tag: cp310-cp310-manylinux2014_x86_64}'
    archive = f'        options: {{archive_url: "{server.url}/archive/thing.tar.gz"}}'
    report = pin.check(load_matrix(write_stacks(tmp_path, stacks_text(server, good, archive))),
                       index(server))
    (line,) = report.computed
    assert f"sha256 {sha(ARCHIVE)}" in line and "add download:" in line


def test_run_fails_with_one_line_and_leaves_the_file(server, tmp_path, capsys):
    text = stacks_text(server, 'demo: {version: "9.9", sha256: ' + "ab" * 32 + "}")
    path = write_stacks(tmp_path, text)
    with pytest.raises(UserError) as info:
        pin.run(str(path), check_only=False, index_url=server.url + "/simple")
    assert "\n" not in str(info.value) and "no such release" in str(info.value)
    assert path.read_text() == text


def test_project_pins_match_pypi():
    """The real stacks.yaml against PyPI (skipped where PyPI cannot be reached)."""
    report = pin.check(load_matrix(ROOT / "stacks.yaml"), pin.Index())
    pip_unchecked = [u for u in report.unchecked if "==" in u]
    if pip_unchecked and not any("==" in ok for ok in report.ok):
        pytest.skip(f"PyPI unreachable: {pip_unchecked[0]}")
    assert report.failed == []
    assert pip_unchecked == []
