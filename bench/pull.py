"""Pull benchmark: how long a clean node takes from `docker pull` to its first running container,
over a bandwidth-limited link to the registry, for images with one giant layer vs split layers.

    python bench/pull.py IMAGE [IMAGE...] [--links 1000,10000]

Each IMAGE (e.g. cuda13.2-tcp before and after the PyTorch wheel split) is pushed from this
machine's engine to a loopback ``docker-registry``. A second, clean Docker engine (its own data
root, socket and bridge, ``--iptables=false`` so it leaves the first engine's firewall rules
alone) pulls it through a loopback TCP relay that holds all its connections together to the
link's rate (a token bucket), then runs ``true`` in it. The second engine starts empty for
every pull. Run as root (dockerd, the bridge); needs ``docker-registry`` (Debian package).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.second_engine import DOCKER, SecondEngine  # noqa: E402

BRIDGE = "mnpbench0"
BRIDGE_CIDR = "172.31.250.1/24"
CHUNK = 64 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if check():
                return
        time.sleep(0.2)
    raise SystemExit(f"{what} did not come up within {seconds:.0f} s")


@contextlib.contextmanager
def registry(root: Path) -> Iterator[str]:
    """A docker-registry on a free loopback port, filesystem storage under ``root``."""
    port = free_port()
    config = root / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {root / 'registry'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
                      f"  secret: {secrets.token_hex(16)}\n", encoding="utf-8")
    with (root / "registry.log").open("ab") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: socket.create_connection(("127.0.0.1", port), 1).close() is None,
                 "docker-registry")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class Bucket:
    """A token bucket shared by every connection: the link's rate, in bytes per second."""

    def __init__(self, rate: float) -> None:
        self.rate, self.tokens, self.last = rate, 0.0, time.monotonic()
        self.lock = threading.Lock()

    def take(self, size: int) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.rate * 0.05, self.tokens + (now - self.last) * self.rate)
                self.last = now
                if self.tokens >= size:
                    self.tokens -= size
                    return
                wait = (size - self.tokens) / self.rate
            time.sleep(wait)


@contextlib.contextmanager
def relay(target: str, mbit: int, per_connection: bool = False) -> Iterator[str]:
    """A loopback TCP relay to ``target`` limited to ``mbit`` Mbit/s in total (both ways), or
    to ``mbit`` per connection (a registry or object store that caps each connection)."""
    shared = Bucket(mbit * 1_000_000 / 8)
    host, port = target.rsplit(":", 1)
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket, bucket: Bucket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(CHUNK):
                bucket.take(len(data))
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def accept() -> None:
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection((host, int(port)))
            bucket = Bucket(shared.rate) if per_connection else shared
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b, bucket), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


def run(command: list[str]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"`{' '.join(command)}` failed: {(proc.stderr or proc.stdout)[-500:]}")


def layers(image: str) -> list[int]:
    out = subprocess.run([DOCKER, "history", "--human=false", "--format", "{{.Size}}", image],
                         capture_output=True, text=True, check=True).stdout.split()
    return [int(size) for size in out if int(size) > 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="+", help="local images to compare")
    parser.add_argument("--links", default="1000,10000", help="link rates in Mbit/s")
    parser.add_argument("--per-connection", action="store_true",
                        help="limit each connection to the rate instead of all together")
    args = parser.parse_args()
    if os.geteuid() != 0 or not shutil.which("docker-registry"):
        raise SystemExit("run as root, with docker-registry installed (Debian package)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mnp-pull-bench-") as tmp, \
            registry(Path(tmp)) as reg:
        remote = {}
        for index, image in enumerate(args.images):
            remote[image] = f"{reg}/mnp-bench-pull:{index}"
            run([DOCKER, "tag", image, remote[image]])
            started = time.monotonic()
            run([DOCKER, "push", remote[image]])
            print(f"pushed {image} in {time.monotonic() - started:.0f} s", flush=True)
            run([DOCKER, "rmi", remote[image]])
        for mbit in (int(x) for x in args.links.split(",")):
            for image in args.images:
                engine_root = Path(tmp) / f"engine-{mbit}-{len(rows)}"
                engine_root.mkdir()
                with relay(reg, mbit, args.per_connection) as via, \
                        SecondEngine(engine_root, BRIDGE, BRIDGE_CIDR, "mnpbench") as engine:
                    cli = engine.cli
                    ref = remote[image].replace(reg, via)
                    started = time.monotonic()
                    run([*cli, "pull", "-q", ref])
                    pulled = time.monotonic() - started
                    run([*cli, "run", "--rm", "--network", "none", "--entrypoint", "true", ref])
                    first = time.monotonic() - started
                sizes = layers(image)
                rows.append((image, mbit, len(sizes), max(sizes) / 1e6, sum(sizes) / 1e6, pulled,
                             first))
                print(f"{image} at {mbit} Mbit/s: pulled in {pulled:.1f} s, first container "
                      f"at {first:.1f} s", flush=True)
                shutil.rmtree(engine_root, ignore_errors=True)
    print(f"\nlimit: {'per connection' if args.per_connection else 'whole link'}")
    print("\n| image | link (Mbit/s) | layers | largest (MB) | total (MB) | pull (s) | "
          "first container (s) |\n|---|---|---|---|---|---|---|")
    for image, mbit, count, largest, total, pulled, first in rows:
        print(f"| {image} | {mbit} | {count} | {largest:.0f} | {total:.0f} | {pulled:.1f} | "
              f"{first:.1f} |")


if __name__ == "__main__":
    main()
