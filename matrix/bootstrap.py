"""Make a stack's base image available: local, pulled, or bootstrapped from a Debian mirror.

Debian-family bases that declare ``bootstrap`` in stacks.yaml are built with ``mmdebstrap``
(minbase variant plus ca-certificates) and imported under the base's name, so the default stack
builds with no registry at all. Other bases (nvidia/cuda, Habana) fail with a line saying what
failed and how to provide the image.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound

from matrix.engine import apt_install
from matrix.errors import UserError
from matrix.model import Base


def ensure_base(client: docker.DockerClient, base: Base, log=print) -> str:
    """Return how the base was found: 'local', 'pulled' or 'bootstrapped'."""
    if _local(client, base.image):
        return "local"
    try:
        repository, tag = _split(base.image)
        client.images.pull(repository, tag=tag)
        return "pulled"
    except APIError as exc:
        pull_error = str(exc.explanation or exc).splitlines()[0][:200]
    if base.bootstrap:
        log(f"base {base.image}: not local and not pullable ({pull_error}); "
            f"bootstrapping {base.bootstrap['suite']} from {base.bootstrap['mirror']}")
        bootstrap(client, base)
        return "bootstrapped"
    hint = base.provide_hint or ("`docker load` it from an archive, or build this stack where "
                                 "its registry is reachable (the GitHub workflow)")
    raise UserError(f"base image {base.image} of base {base.name!r} is not local and cannot be "
                    f"pulled ({pull_error}); {hint}")


def bootstrap(client: docker.DockerClient, base: Base) -> None:
    """Build the base root filesystem with mmdebstrap and import it as ``base.image``."""
    spec = base.bootstrap or {}
    if not shutil.which("mmdebstrap"):
        apt_install("mmdebstrap")
    components = ",".join(spec.get("components", ["main"]))
    with tempfile.TemporaryDirectory(prefix="mnp-base-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        command = ["mmdebstrap", "--variant=minbase", "--include=ca-certificates",
                   f"--components={components}", "--quiet",
                   spec["suite"], str(tarball), spec["mirror"]]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode:
            tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
            raise UserError(f"bootstrapping base {base.name} with mmdebstrap failed: {tail}")
        repository, tag = _split(base.image)
        # A file path makes docker-py send the tar with a Content-Length; its stream variant
        # declares chunked encoding without chunking, which the engine rejects.
        client.api.import_image(src=str(tarball), repository=repository, tag=tag,
                                changes=['CMD ["bash"]'])
    if not _local(client, base.image):
        raise UserError(f"importing the bootstrapped base as {base.image} failed")


def _local(client: docker.DockerClient, image: str) -> bool:
    try:
        client.images.get(image)
        return True
    except ImageNotFound:
        return False


def _split(image: str) -> tuple[str, str]:
    name, _, digest = image.partition("@")
    if digest:
        return name, digest
    repository, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        return name, "latest"
    return repository, tag
