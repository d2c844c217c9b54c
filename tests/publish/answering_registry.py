"""A loopback HTTP server that speaks just enough of the registry API for the engine to start a
push, then answers the push's first write the way a refusing or failing registry does.

Reads go through as on an empty registry: ``GET /v2/`` is 200 with the API version header
(https://distribution.github.io/distribution/spec/api/ "API Version Check"), a manifest or blob
is 404 with the ``MANIFEST_UNKNOWN`` / ``BLOB_UNKNOWN`` error body. The first write, the blob
upload's ``POST /v2/<name>/blobs/uploads/``, gets ``answer``: a status, a content type and a
body, e.g. 405 with a plain-text body (what a read-only mirror or a web server in front of the
path gives), 403 ``DENIED`` or 405 ``UNSUPPORTED`` in the registry's JSON error format ("Errors"
in the same spec, and the OCI distribution spec's error codes:
https://github.com/opencontainers/distribution-spec/blob/v1.1.0/spec.md#error-codes), 503, 429.
``writes`` counts the upload attempts that reached it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Answer:
    """What the server answers a blob upload with."""

    status: int
    body: str
    content_type: str = "application/json"

    @classmethod
    def error(cls, status: int, code: str, message: str) -> Answer:
        """The registry's JSON error format: ``{"errors": [{"code", "message", "detail"}]}``."""
        return cls(status, json.dumps({"errors": [{"code": code, "message": message,
                                                   "detail": None}]}))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: AnsweringRegistry

    def log_message(self, *args) -> None:
        return

    def _send(self, status: int, body: str, content_type: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _read(self) -> None:
        if self.server.on == "read":
            self._answer()
        elif self.path.rstrip("/") == "/v2":
            self._send(200, "{}")
        elif "/manifests/" in self.path:
            self._send(404, json.dumps({"errors": [{"code": "MANIFEST_UNKNOWN",
                                                    "message": "manifest unknown"}]}))
        else:
            self._send(404, json.dumps({"errors": [{"code": "BLOB_UNKNOWN",
                                                    "message": "blob unknown to registry"}]}))

    def _write(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.server.on == "write":
            self._answer()
        else:
            self._send(202, "")

    def _answer(self) -> None:
        with self.server.lock:
            self.server.answered += 1
        answer = self.server.answer
        if answer.status == 429:
            self.send_response(429)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body.encode())
            return
        self._send(answer.status, answer.body, answer.content_type)

    do_GET = do_HEAD = _read
    do_POST = do_PUT = do_PATCH = do_DELETE = _write


class AnsweringRegistry(ThreadingHTTPServer):
    """``with AnsweringRegistry(Answer(405, "Method not allowed", "text/plain")) as registry:
    push to registry.host``."""

    daemon_threads = True

    def __init__(self, answer: Answer, on: str = "write") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.on = on
        self.answered = 0
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> AnsweringRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
