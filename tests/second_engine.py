"""A second, real Docker engine that a test or benchmark starts, stops and restarts itself.

It has its own socket, data root, exec root, containerd namespaces and bridge, and runs with
``--iptables=false --ip-masq=false``: an extra engine started with ``--bridge=none`` would delete
the first engine's ``docker0``, and its own firewall rules would disturb the first engine's.
Root only (dockerd, the bridge).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

DOCKER = "/usr/bin/docker"  # Debian's CLI; /usr/local/bin/docker may be a newer one
DATA_TMPFS_SIZE = "4g"  # a ceiling, not a reservation (data_in_memory)


def usable() -> str:
    """Why a second engine cannot start here ("" when it can)."""
    if os.geteuid() != 0:
        return "a second Docker engine needs root"
    for tool in ("dockerd", "ip"):
        if not shutil.which(tool):
            return f"a second Docker engine needs {tool}"
    return ""


class SecondEngine:
    def __init__(self, root: Path, bridge: str, cidr: str, namespace: str,
                 data_in_memory: bool = False) -> None:
        self.root, self.bridge, self.cidr, self.namespace = root, bridge, cidr, namespace
        self.data_in_memory = data_in_memory
        self.socket = root / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.cli = [DOCKER, "-H", self.url]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> SecondEngine:
        if self.data_in_memory:
            self._data_on_tmpfs()
        subprocess.run(["ip", "link", "add", "name", self.bridge, "type", "bridge"], check=False,
                       capture_output=True)
        subprocess.run(["ip", "addr", "replace", self.cidr, "dev", self.bridge], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        if self.data_in_memory:
            subprocess.run(["umount", "-l", str(self.root / "data")], check=False,
                           capture_output=True)
        subprocess.run(["ip", "link", "delete", self.bridge], check=False, capture_output=True)

    def _data_on_tmpfs(self) -> None:
        """The data root on a tmpfs of its own: where the root lies on an overlay file system
        (a container's, as on a fresh machine that runs the suite inside one), dockerd cannot
        use overlay2 there and falls back to vfs, which copies every layer whole: the restart
        tests took 300 s each that way, against 30 s. Memory is only used as it is written (a
        Debian base and a few small layers: ``data_in_memory`` is for small images only). Without
        the right to mount, a plain folder."""
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DATA_TMPFS_SIZE},mode=0711",
                        "mnp-second-engine", str(data)], check=False, capture_output=True)

    def start(self, seconds: float = 60) -> None:
        with (self.root / "dockerd.log").open("ab") as log:
            self.proc = subprocess.Popen(
                ["dockerd", "--data-root", str(self.root / "data"),
                 "--exec-root", str(self.root / "exec"), "--pidfile", str(self.root / "pid"),
                 "-H", self.url, f"--bridge={self.bridge}", "--iptables=false",
                 "--ip-masq=false", "--containerd-namespace", self.namespace,
                 "--containerd-plugins-namespace", self.namespace + "-plugins"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + seconds
        while subprocess.run([*self.cli, "info"], capture_output=True).returncode:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the second dockerd did not start; see {self.root}/dockerd.log")
            time.sleep(0.2)

    def stop(self, sig: int = signal.SIGTERM, seconds: float = 60) -> None:
        """Stop the engine as `systemctl stop docker` does (SIGTERM), killing it if it lingers."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
