"""Find a Docker engine, or start one where we may.

DOCKER_HOST or the default socket is tried first. When nothing answers and we are root on
Debian or Ubuntu, Debian's ``docker.io`` is installed if missing and ``dockerd`` is started in the
background (the quick start and CI use this); anywhere else that is one clear error.
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import time
from pathlib import Path

import docker
import requests
import urllib3
from docker.errors import DockerException

from matrix.errors import UserError

DOCKERD_LOG = Path("/var/log/mnp-dockerd.log")

# What a call through docker-py raises when the engine fails rather than answers: its own errors
# (APIError for a refusal), requests' connection errors (refused, reset, timed out),
# urllib3's ProtocolError ("Connection broken: IncompleteRead") from a stream that stops
# mid-chunk, http.client's errors under both, and the OSError of a socket that went away.
ENGINE_FAULTS: tuple[type[BaseException], ...] = (
    DockerException, requests.exceptions.RequestException, urllib3.exceptions.HTTPError,
    http.client.HTTPException, ConnectionError)


def where(client: docker.DockerClient) -> str:
    """The engine's address as a user would write it (``unix:///var/run/docker.sock``)."""
    adapter = getattr(client.api, "_custom_adapter", None)
    path = getattr(adapter, "socket_path", None)
    return f"unix://{path}" if path else str(client.api.base_url)


def fault(client: docker.DockerClient, exc: BaseException, doing: str, after: str = "") -> UserError:
    """One line for an engine that failed while ``doing`` something (no traceback)."""
    return UserError(f"Docker engine at {where(client)} failed while {doing}: {_short(exc)}"
                     f"{'; ' + after if after else ''}; run the command again once the engine "
                     "answers")


class EngineGone(ConnectionError):
    """The engine stopped or restarted under a running build (the build's error was its doing)."""


def identity(client: docker.DockerClient) -> tuple[int, int] | None:
    """What changes when a local engine restarts: dockerd creates its unix socket anew (inode and
    change time). None for an engine behind TCP or a socket this process cannot see."""
    path = getattr(getattr(client.api, "_custom_adapter", None), "socket_path", None)
    try:
        info = os.stat(path) if path else None
    except OSError:
        return None
    return (info.st_ino, info.st_ctime_ns) if info else None


def went_away(client: docker.DockerClient, before: tuple[int, int] | None,
              seconds: float = 3.0) -> bool:
    """Whether the engine stopped answering or came back as a new process within ``seconds``
    (a stopping dockerd kills build containers first and goes away just after)."""
    probe = docker.APIClient(base_url=where(client), version=client.api.api_version, timeout=2)
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                probe.ping()
            except ENGINE_FAULTS:
                return True
            if before is not None and identity(client) not in (None, before):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.25)
    finally:
        probe.close()


def connect(timeout: int = 600) -> docker.DockerClient:
    """A client for a running engine (raises :class:`UserError` when there is none)."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except DockerException as exc:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise UserError(f"no Docker engine answers at {where} ({_short(exc)}); start one, set "
                        "DOCKER_HOST, or run `invoke engine` as root on Debian/Ubuntu") from None


def ensure(start: bool = True, wait_s: float = 60) -> docker.DockerClient:
    """Connect, starting a local engine first when none answers and we are allowed to."""
    try:
        return connect()
    except UserError:
        if not start or "DOCKER_HOST" in os.environ:
            raise
    if os.geteuid() != 0 or not _debian_family():
        raise UserError("no Docker engine answers and this is not root on Debian/Ubuntu, so none "
                        "can be started here: start dockerd yourself or set DOCKER_HOST")
    if not shutil.which("dockerd"):
        print("installing docker.io (Debian package) ...", flush=True)
        apt_install("docker.io")
    print(f"starting dockerd (log: {DOCKERD_LOG}) ...", flush=True)
    with DOCKERD_LOG.open("ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            return connect()
        except UserError:
            time.sleep(0.5)
    raise UserError(f"dockerd did not answer within {wait_s:.0f} s; see {DOCKERD_LOG}")


# What the full test suite needs from the distribution: command -> Debian packages. scontrol:
# the Slurm host list tests compare the entrypoint's expansion with the real one; cc: the
# preflight tests build a plugin whose dependency is missing; ssh-keygen and ssh: the
# entrypoint's SSH trust tests; htpasswd: the loopback registry with authentication on. Without
# them those tests would skip on a new machine.
SYSTEM_TOOLS = {"dockerd": ("docker.io",), "mmdebstrap": ("mmdebstrap",),
                "docker-registry": ("docker-registry",), "scontrol": ("slurm-client",),
                "cc": ("gcc", "libc6-dev"), "ssh-keygen": ("openssh-client",),
                "ssh": ("openssh-client",), "ip": ("iproute2",),
                "htpasswd": ("apache2-utils",)}


def ensure_system_tools() -> None:
    """Install the Debian packages the suite uses when missing (root on Debian/Ubuntu only)."""
    missing = sorted({pkg for tool, pkgs in SYSTEM_TOOLS.items() if not shutil.which(tool)
                      for pkg in pkgs})
    if not missing:
        return
    if os.geteuid() != 0 or not _debian_family():
        raise UserError(f"missing tools: {', '.join(missing)} (Debian packages); install them "
                        "or run as root on Debian/Ubuntu so they are installed for you")
    print(f"installing {', '.join(missing)} (Debian packages) ...", flush=True)
    apt_install(*missing)


def _debian_family() -> bool:
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        return False
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    family = f"{fields.get('ID', '')} {fields.get('ID_LIKE', '')}".replace('"', "")
    return any(name in family.split() for name in ("debian", "ubuntu"))


def apt_install(*packages: str) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise UserError(f"`{' '.join(command)}` failed: {' '.join(tail)}")


def _short(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)  # docker APIError: the engine's own words
    text = str(explanation or exc).strip()
    text = text.splitlines()[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {text[:160]}"
