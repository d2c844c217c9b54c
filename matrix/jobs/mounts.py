"""The job's shared data: ``--mount HOST_PATH:CONTAINER_PATH[:ro]`` and ``--pvc CLAIM:PATH[:ro]``.

The seed articles read their data from a file system every node mounts at the same path (FSx for
Lustre at ``/fsx``); a generator only has to put that host path into the container at the path the
command reads. One parsed :class:`Mount` becomes, per scheduler:

- AWS Batch: a ``volumes`` entry (``host.sourcePath``) and a ``mountPoints`` entry
  (``containerProperties``), see :func:`batch_volumes`;
- Slurm with pyxis: one ``SRC:DST[:ro]`` item of ``srun --container-mounts`` (:func:`pyxis_mounts`);
- Kubernetes: a ``hostPath`` volume; a :class:`Claim` (``--pvc``) a ``persistentVolumeClaim``
  volume, such as the EKS article's ``fsx-pvc`` (:func:`k8s_volumes`);
- ``invoke run``: a Docker bind mount, so a rehearsal reads the same paths (:func:`docker_binds`).

Bad input is one :class:`UsageError` line naming the option and what was expected.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from matrix.errors import UsageError

# Paths the images or the schedulers already own in the container: a data mount there would hide
# the job's shared memory, the MPI operator's hostfile and SSH keys, or the entrypoint's state.
RESERVED = ("/dev/shm", "/etc/mpi", "/root/.ssh", "/run/mnp", "/proc", "/sys", "/dev")
# Kubernetes object names (RFC 1123 subdomain): https://kubernetes.io/docs/concepts/overview/
# working-with-objects/names/#dns-subdomain-names
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# pyxis splits --container-mounts at ',' and each item at ':' (pyxis README, "--container-mounts=
# SRC:DST[:FLAGS][,SRC:DST...]"); a path holding either cannot be given there.
_SEPARATORS = (",", ":")
MODES = ("ro", "rw")


@dataclass(frozen=True)
class Mount:
    """A host path (every node has it, e.g. an FSx for Lustre mount) seen at ``container``."""

    host: str
    container: str
    read_only: bool = False


@dataclass(frozen=True)
class Claim:
    """A Kubernetes persistent volume claim mounted at ``container``."""

    claim: str
    container: str
    read_only: bool = False


def _absolute(path: str, option: str, text: str, what: str) -> str:
    """``path`` normalised; one line when it is relative, the root, or holds odd characters."""
    example = "--mount /fsx:/fsx" if option == "--mount" else "--pvc fsx-pvc:/fsx"
    if not path.startswith("/"):
        raise UsageError(f"{option} {text!r}: {what} {path!r} must be an absolute path "
                         f"(e.g. {example})")
    if any(c in path for c in _SEPARATORS) or any(ord(c) < 32 for c in path):
        raise UsageError(f"{option} {text!r}: {what} {path!r} may not hold ',', ':' or control "
                         "characters (pyxis and Docker split mount lists at them)")
    normal = posixpath.normpath(path)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    if normal == "/":
        raise UsageError(f"{option} {text!r}: {what} may not be / (name the data folder, "
                         f"e.g. {example})")
    return normal


def _mode(parts: list[str], option: str, text: str) -> bool:
    """Whether the optional third field asks for a read-only mount."""
    if len(parts) == 2:
        return False
    if parts[2] not in MODES:
        raise UsageError(f"{option} {text!r}: the third field must be ro or rw, not {parts[2]!r}")
    return parts[2] == "ro"


def _check_container(path: str, option: str, text: str) -> None:
    for reserved in RESERVED:
        if path == reserved or path.startswith(reserved + "/"):
            raise UsageError(f"{option} {text!r}: {path} is under {reserved}, which the image or "
                             "the scheduler already uses; mount the data elsewhere (e.g. /fsx)")


def parse_mount(text: str) -> Mount:
    """``HOST_PATH:CONTAINER_PATH[:ro|rw]`` as a :class:`Mount`."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise UsageError(f"--mount {text!r}: expected HOST_PATH:CONTAINER_PATH[:ro], "
                         "e.g. --mount /fsx:/fsx or --mount /fsx/data:/data:ro")
    read_only = _mode(parts, "--mount", text)
    host = _absolute(parts[0], "--mount", text, "HOST_PATH")
    container = _absolute(parts[1], "--mount", text, "CONTAINER_PATH")
    _check_container(container, "--mount", text)
    return Mount(host, container, read_only)


def parse_claim(text: str) -> Claim:
    """``CLAIM:PATH[:ro|rw]`` as a :class:`Claim`."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise UsageError(f"--pvc {text!r}: expected CLAIM:PATH[:ro], e.g. --pvc fsx-pvc:/fsx")
    read_only = _mode(parts, "--pvc", text)
    if not _CLAIM.match(parts[0]):
        raise UsageError(f"--pvc {text!r}: {parts[0]!r} is not a Kubernetes claim name "
                         "(lower-case letters, digits, '-' and '.', at most 253)")
    container = _absolute(parts[1], "--pvc", text, "PATH")
    _check_container(container, "--pvc", text)
    return Claim(parts[0], container, read_only)


def _listed(value: Any) -> list[str]:
    """A repeatable option as a list (invoke gives a list; Python callers may give a string)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(item) for item in value]


def parse_all(mounts: Any = None, claims: Any = None) -> tuple[list[Mount], list[Claim]]:
    """Every ``--mount`` and ``--pvc``; two of them at one container path is one line."""
    given = [("--mount", text, parse_mount(text)) for text in _listed(mounts)]
    given += [("--pvc", text, parse_claim(text)) for text in _listed(claims)]
    seen: dict[str, str] = {}
    for option, text, item in given:
        if item.container in seen:
            raise UsageError(f"{option} {text!r}: {item.container} is already mounted by "
                             f"{seen[item.container]}; give each container path once")
        seen[item.container] = f"{option} {text!r}"
    return ([item for _, _, item in given if isinstance(item, Mount)],
            [item for _, _, item in given if isinstance(item, Claim)])


# --- per scheduler -------------------------------------------------------------------------------

def batch_volumes(mounts: Sequence[Mount]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Batch ``containerProperties`` ``volumes`` (``host.sourcePath``) and ``mountPoints``."""
    volumes = [{"name": f"mount-{i}", "host": {"sourcePath": m.host}}
               for i, m in enumerate(mounts)]
    points = [{"sourceVolume": f"mount-{i}", "containerPath": m.container,
               "readOnly": m.read_only} for i, m in enumerate(mounts)]
    return volumes, points


def pyxis_mounts(mounts: Sequence[Mount]) -> str:
    """The value of ``srun --container-mounts``: ``SRC:DST[:ro]`` items joined by ','."""
    return ",".join(f"{m.host}:{m.container}" + (":ro" if m.read_only else "") for m in mounts)


def docker_binds(mounts: Iterable[Mount]) -> dict[str, dict[str, str]]:
    """docker-py ``volumes=``: host path -> bind and mode, as ``docker run -v`` takes them."""
    return {m.host: {"bind": m.container, "mode": "ro" if m.read_only else "rw"} for m in mounts}


def k8s_volumes(mounts: Sequence[Mount], claims: Sequence[Claim]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pod ``volumes`` (hostPath for --mount, persistentVolumeClaim for --pvc) and the
    container's ``volumeMounts``."""
    volumes: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    for i, m in enumerate(mounts):
        volumes.append({"name": f"mount-{i}", "hostPath": {"path": m.host, "type": "Directory"}})
        points.append({"name": f"mount-{i}", "mountPath": m.container, "readOnly": m.read_only})
    for i, c in enumerate(claims):
        volumes.append({"name": f"pvc-{i}", "persistentVolumeClaim": {
            "claimName": c.claim, "readOnly": c.read_only}})
        points.append({"name": f"pvc-{i}", "mountPath": c.container, "readOnly": c.read_only})
    return volumes, points
