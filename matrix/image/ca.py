"""Trust an extra CA during builds without it ever entering an image.

Builds behind a TLS-intercepting proxy (corporate networks, this project's CI) need the proxy's
CA for pip and curl. Copying it into the build context would leave it in a layer, and a build
argument holding it would show in ``docker history``. Instead the bundle is served on loopback for
the duration of the build, and a RUN that downloads fetches it into /tmp, uses it and deletes it
before its layer is committed (``images/_macros.j2``: ``ca_begin``/``ca_end``). Builds run with
host networking, so 127.0.0.1 inside the build step is this machine.
"""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from matrix.errors import UserError
from matrix.model.settings import CA_ENV_VARS, default_ca_bundle


def resolve(ca_bundle: str | None) -> Path | None:
    """``--ca-bundle`` if given, else the default; checked to exist and look like PEM."""
    path = Path(ca_bundle) if ca_bundle else default_ca_bundle()
    if path is None:
        return None
    origin = "--ca-bundle" if ca_bundle else next(v for v in CA_ENV_VARS if os.environ.get(v))
    try:
        head = path.read_bytes()[:65536]
    except OSError as exc:
        raise UserError(f"{origin}: cannot read CA bundle {path}: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in head:
        raise UserError(f"{origin}: {path} is not a PEM CA bundle (no BEGIN CERTIFICATE)")
    return path


@contextmanager
def serve(bundle: Path | None) -> Iterator[str]:
    """Serve ``bundle`` at a loopback URL while the block runs; yields '' when there is none."""
    if bundle is None:
        yield ""
        return
    payload = bundle.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path != "/ca.pem":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-pem-file")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:  # quiet: the build log says enough
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/ca.pem"
    finally:
        server.shutdown()
        server.server_close()
