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

A mount never hides the image: :func:`refuse_image_folders` refuses a container path that is, or
holds, a folder the stack's image installs into (derived from its templates,
:func:`matrix.image.declared.image_folders`) or one something fills at run time
(:func:`runtime_folders`: the container runtime, the scheduler, the MPI operator, the
entrypoint). Every task that takes ``--mount`` or ``--pvc`` calls it once the stack is known.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from matrix.errors import UsageError

if TYPE_CHECKING:
    from matrix.model.entities import Matrix

# Where a refusal suggests the data go: the seed articles' FSx for Lustre mount, and folders no
# image of the project installs into (tests/publish/test_mount_folders.py keeps them so).
DATA_PATHS = ("/fsx", "/data", "/scratch")
# The OCI runtime spec's default filesystems and devices, which a container runtime puts into
# every container (a container path there is the runtime's, whatever the image holds).
OCI_DEFAULTS = ("https://github.com/opencontainers/runtime-spec/blob/main/config-linux.md "
                "sections \"Default Filesystems\" and \"Default Devices\"")
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
    if normal == "/" and what == "HOST_PATH":
        # the host's whole file system into every container: no data folder means that
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


@dataclass(frozen=True)
class RuntimeFolder:
    """A container folder something other than the image fills when the job starts: a data
    mount at, under or over it would hide what is put there (or put the data in its place)."""

    path: str
    owner: str  # who fills it
    what: str  # with what: "a folder <owner> <what>"
    source: str  # where that is said


@cache
def runtime_folders() -> tuple[RuntimeFolder, ...]:
    """The folders the container runtime, the MPI operator and the entrypoint fill at run time;
    the entrypoint's own and the operator's are read from the entrypoint's code, where they are
    declared once."""
    from entrypoint.run.worker import KEYS_DIR
    from entrypoint.schedulers.mpijob import DEFAULT_HOSTFILE
    from entrypoint.settings.config import TABLE

    state_dir = next(setting.default for setting in TABLE if setting.name == "MNP_STATE_DIR")
    runtime = "the container runtime"
    return (
        RuntimeFolder("/dev/shm", runtime, "fills with the job's shared memory, a tmpfs every "
                      "writer sizes (Batch linuxParameters.sharedMemorySize, a Kubernetes memory "
                      "emptyDir)", f"matrix/jobs/jobdef.py, matrix/jobs/k8s.py; {OCI_DEFAULTS}"),
        RuntimeFolder(posixpath.dirname(DEFAULT_HOSTFILE), "the MPI operator", "fills with the "
                      "launcher's hostfile ConfigMap", "entrypoint/schedulers/mpijob.py "
                      "DEFAULT_HOSTFILE"),
        RuntimeFolder(KEYS_DIR, "the MPI operator", "fills with its SSH Secret "
                      "(sshAuthMountPath) for the entrypoint's sshd",
                      "entrypoint/run/worker.py KEYS_DIR"),
        RuntimeFolder(state_dir, "the entrypoint", "fills with its per-job keys, hostfiles and "
                      "sshd files (MNP_STATE_DIR)", "entrypoint/settings/config.py MNP_STATE_DIR"),
        RuntimeFolder("/proc", runtime, "fills with procfs", OCI_DEFAULTS),
        RuntimeFolder("/sys", runtime, "fills with sysfs", OCI_DEFAULTS),
        RuntimeFolder("/dev", runtime, "fills with the devices (the job's GPUs and EFA "
                      "interfaces among them)", OCI_DEFAULTS),
    )


def _holds(outer: str, inner: str) -> bool:
    """Whether folder ``outer`` is ``inner`` or one of its parents."""
    return outer == inner or outer == "/" or inner.startswith(outer + "/")


def _elsewhere() -> str:
    return (f"mount the data at a folder of its own, e.g. {', '.join(DATA_PATHS[:-1])} or "
            f"{DATA_PATHS[-1]}")


def _runtime_refusal(option: str, text: str, path: str, folder: RuntimeFolder) -> UsageError:
    relation = ("is" if path == folder.path else
                f"is under {folder.path}," if path.startswith(folder.path + "/")
                else f"holds {folder.path},")
    return UsageError(f"{option} {text!r}: {path} {relation} a folder {folder.owner} "
                      f"{folder.what} ({folder.source}); {_elsewhere()}")


def _check_container(path: str, option: str, text: str) -> None:
    """A path at or under a :func:`runtime_folders` folder (needs no stack; a path over one is
    for :func:`refuse_image_folders`, which names the image's folders first)."""
    for folder in runtime_folders():
        if _holds(folder.path, path):
            raise _runtime_refusal(option, text, path, folder)


def refuse_image_folders(matrix: Matrix, stack_name: str, mounts: Iterable[Mount],
                         claims: Iterable[Claim] = ()) -> None:
    """One :class:`UsageError` line (exit 2) for the first ``--mount`` or ``--pvc`` whose
    container path is, or holds, a folder ``stack_name``'s image installs into, naming the folder
    and the layer (or base image) that puts something there; then for one at, under or over a
    :func:`runtime_folders` folder. A mount inside an image folder (``/opt/data`` beside
    ``/opt/mnp``) hides nothing of the image but its own path, and is accepted.
    The folders are read from the stack's templates once per process
    (:func:`matrix.image.declared.declared_facts`)."""
    from matrix.image.declared import declared_facts, most_telling

    given = [("--mount", _mount_text(m), m.container) for m in mounts]
    given += [("--pvc", _claim_text(c), c.container) for c in claims]
    if not given:
        return  # nothing to render
    folders = declared_facts(matrix, matrix.stack(stack_name)).folders
    for option, text, path in given:
        # the folder named: the path itself, else the entrypoint's (what the job loses first),
        # else the nearest
        hidden = sorted((folder for folder in folders if _holds(path, folder)),
                        key=lambda folder: (folder != path,
                                            not any(u.starts_the_job for u in folders[folder]),
                                            folder.count("/"), folder))
        if hidden:
            folder = hidden[0]
            uses = most_telling(folders[folder])
            more = f"; and {len(uses) - 1} more" if len(uses) > 1 else ""
            where = "is" if folder == path else f"holds {folder},"
            raise UsageError(f"{option} {text!r}: {path} {where} a folder the image of stack "
                             f"{stack_name} installs into ({uses[0].sentence()}{more}), which "
                             f"the mount would hide from the job; {_elsewhere()}")
        for runtime in runtime_folders():
            if _holds(path, runtime.path) or _holds(runtime.path, path):
                raise _runtime_refusal(option, text, path, runtime)


def _mount_text(mount: Mount) -> str:
    return f"{mount.host}:{mount.container}" + (":ro" if mount.read_only else "")


def _claim_text(claim: Claim) -> str:
    return f"{claim.claim}:{claim.container}" + (":ro" if claim.read_only else "")


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
