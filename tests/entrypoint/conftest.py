"""Shared fixtures of the entrypoint tests: ``local_node`` runs the real entrypoint as a process here."""

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from entrypoint.probe import netaddr

ROOT = Path(__file__).resolve().parents[2]
# The host's own settings of these kinds would change what the entrypoint does: left out.
HOST_PREFIXES = ("AWS_BATCH_", "MNP_", "OMPI_", "NCCL_")


class LocalNode:
    """``python -m entrypoint`` on this host with a clean environment: ``run`` waits for it,
    ``start`` leaves it running (the fixture stops what is left at teardown); ``fake_program``
    puts a stand-in launcher or tool in ``<tmp_path>/bin``."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []

    @staticmethod
    def env(**extra: str) -> dict[str, str]:
        """This process's environment without the host's Batch/MNP/MPI/NCCL settings, with the
        project on PYTHONPATH, plus ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(HOST_PREFIXES)}
        env["PYTHONPATH"] = str(ROOT)
        env.update(extra)
        return env

    def run(self, args: Sequence[str], timeout: float = 60, env=None, text: bool = True,
            **extra: str) -> subprocess.CompletedProcess:
        """Run the entrypoint with ``args`` to its end; ``env`` replaces the clean one."""
        return subprocess.run([sys.executable, "-m", "entrypoint"] + list(args),
                              env=env if env is not None else self.env(**extra),
                              capture_output=True, text=text, timeout=timeout)

    def start(self, args: Sequence[str], stdout=subprocess.PIPE, text: bool = True,
              **extra: str) -> subprocess.Popen:
        """Start the entrypoint with ``args``; its output (stdout and stderr) goes to ``stdout``."""
        proc = subprocess.Popen([sys.executable, "-m", "entrypoint"] + list(args),
                                env=self.env(**extra), stdout=stdout,
                                stderr=subprocess.STDOUT, universal_newlines=text)
        self.procs.append(proc)
        return proc

    def fake_program(self, name: str, script: str) -> Path:
        """An executable ``name`` with ``script`` in ``<tmp_path>/bin``; returns that folder."""
        bindir = self.tmp_path / "bin"
        bindir.mkdir(exist_ok=True)
        (bindir / name).write_text(script)
        (bindir / name).chmod(0o755)
        return bindir

    @staticmethod
    def address() -> str:
        """This host's address as a node would choose it; skips the test when there is none."""
        try:
            return netaddr.choose(None).address
        except netaddr.AddressError:
            pytest.skip("no usable non-loopback address on this host")

    @staticmethod
    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", 0))
            return sock.getsockname()[1]

    def stop(self) -> None:
        """SIGTERM first (a SIGKILLed entrypoint leaves its launcher behind), then SIGKILL."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


@pytest.fixture
def local_node(tmp_path):
    """A ``LocalNode``: the real entrypoint as processes on this host, stopped after the test."""
    node = LocalNode(tmp_path)
    yield node
    node.stop()
