"""A loopback HTTP proxy in front of a real registry that accepts blob uploads and never answers.

Every request is forwarded to the registry and its answer relayed, except a blob upload's data
(``PATCH`` or ``PUT`` under ``/blobs/uploads/``): the proxy reads the whole body, then stays
silent until it is closed, the way a registry behind a wedged load balancer behaves. Requests
are handled one by one on kept-alive connections, so a push's later requests are seen too.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StallProxy

    def log_message(self, *args) -> None:
        return

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            # a bytearray: adding each chunk to bytes copied the whole body so far every time
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if not size:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self) -> None:
        body = self._body()
        if self.command in ("PATCH", "PUT") and "/blobs/uploads/" in self.path:
            self.server.stalled.append(f"{self.command} {self.path}")
            self.server.closing.wait()  # accepted the data; never answers
            self.close_connection = True
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        headers["Content-Length"] = str(len(body))
        upstream.request(self.command, self.path, body=body, headers=headers)
        response = upstream.getresponse()
        data = response.read()
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in _HOP and key.lower() != "content-length":
                self.send_header(key, value)
        length = response.getheader("Content-Length") if self.command == "HEAD" else len(data)
        self.send_header("Content-Length", str(length or 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        upstream.close()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward


class StallProxy(ThreadingHTTPServer):
    """``with StallProxy(registry.port) as proxy: push to proxy.host``."""

    daemon_threads = True

    def __init__(self, upstream_port: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream_port = upstream_port
        self.stalled: list[str] = []
        self.closing = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> StallProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()
