"""A fake Docker engine on a unix socket that speaks just enough of the Engine HTTP API to fail.

It answers the few calls the builder makes (image inspect, build, container create/inspect/
start/remove) and injects the faults an engine restart or a refusing engine produces:

* ``drop_build``: ``POST /build`` starts a chunked JSON stream, sends one step, then closes the
  connection mid-chunk (what the client sees when dockerd restarts during a build);
* ``drop_inspect``: ``GET /images/<layer>/json`` for a ``mnp-`` reference closes the connection
  without an answer (an engine going away between calls);
* ``refuse_start``: ``POST /containers/<id>/start`` answers 500 (an engine that cannot start a
  container, e.g. its runtime is broken).

Every request line is kept in ``requests`` so a test can check what the client did (e.g. that a
container it created was removed again).
"""

from __future__ import annotations

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

IMAGE_ID = "sha256:" + "e" * 64
CONTAINER_ID = "f" * 64


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    fault: str = ""
    requests: list[str]
    local_images: set[str]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:  # unix sockets have no client address to log
        return

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if not size:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        self.wfile.flush()
        self.close_connection = True
        self.connection.close()

    def _route(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")
        self._body()
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p][1:] if path.startswith("/v1.") else \
            [p for p in path.split("/") if p]
        fault = self.server.fault
        if parts == ["_ping"]:
            self._json(200, "OK")
        elif parts[:1] == ["images"] and parts[-1] == "json":
            name = "/".join(parts[1:-1])
            if fault == "drop_inspect" and name.startswith("mnp-"):
                self._drop()
            elif name in self.server.local_images:
                # as the engine's ImageInspect answers: the config's platform too (the build
                # checks each base's Architecture against its stacks' platform)
                self._json(200, {"Id": IMAGE_ID, "RepoTags": [name], "Size": 1,
                                 "Os": "linux", "Architecture": "amd64",
                                 "Config": {"Labels": {}}})
            else:
                self._json(404, {"message": f"No such image: {name}"})
        elif parts == ["build"]:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = json.dumps({"stream": "Step 1/3 : FROM base\n"}).encode() + b"\r\n"
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            if fault == "drop_build":
                self.wfile.write(b"400\r\n" + b"{\"stream\": \"Step 2")  # half a chunk, then gone
                self._drop()
            else:
                self.wfile.write(b"0\r\n\r\n")
        elif parts == ["containers", "create"]:
            self._json(201, {"Id": CONTAINER_ID, "Warnings": []})
        elif parts[:1] == ["containers"] and parts[-1] == "json":
            self._json(200, {"Id": CONTAINER_ID, "Name": "/fake", "State": {"Status": "created"},
                             "Config": {}, "HostConfig": {}})
        elif parts[:1] == ["containers"] and parts[-1] == "start":
            if fault == "refuse_start":
                self._json(500, {"message": "OCI runtime create failed: fake engine refuses"})
            else:
                self.send_response(204)
                self.end_headers()
        elif self.command == "DELETE" and parts[:1] == ["containers"]:
            self.send_response(204)
            self.end_headers()
        else:
            self._json(404, {"message": f"fake engine: no route for {self.command} {path}"})

    do_GET = do_POST = do_DELETE = do_HEAD = _route


class FakeEngine:
    """``with FakeEngine(tmp_path, "drop_build", {"debian:bookworm"}) as engine: engine.url``."""

    def __init__(self, folder: Path, fault: str, local_images: set[str]) -> None:
        self.socket = folder / "fake-docker.sock"
        self.server = _Server(str(self.socket), _Handler)
        self.server.fault = fault
        self.server.requests = []
        self.server.local_images = set(local_images)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def requests(self) -> list[str]:
        return self.server.requests

    def __enter__(self) -> FakeEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
