"""Make a stack's base image available: local, pulled, or bootstrapped from a Debian mirror.

Debian-family bases that declare ``bootstrap`` in stacks.yaml are built with ``mmdebstrap``
(minbase variant plus ca-certificates) and imported under the base's name, so the default stack
builds with no registry at all. The bootstrapped root gets the apt and dpkg settings the official
Debian image carries (:data:`DOCKER_CONFIG`), so no layer keeps apt's caches; a local
bootstrapped base made before it had them is made again. Other bases (nvidia/cuda, Habana) fail
with a line saying what failed and how to provide the image.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound

from matrix.errors import UserError
from matrix.image.engine import ENGINE_FAULTS, apt_install
from matrix.model import reference
from matrix.model.entities import RECIPE_LABEL, Base

# What the official Debian images configure for container builds, file by file: the
# debuerreotype scripts that build them, scripts/debuerreotype-minimizing-config
# (https://github.com/debuerreotype/debuerreotype/blob/master/scripts/debuerreotype-minimizing-config).
# docker-clean is what keeps .deb files and pkgcache.bin/srcpkgcache.bin out of every apt layer.
_APT_CLEAN = ('"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
              '/var/cache/apt/*.bin || true";')
# (Its usr/sbin/policy-rc.d is left out: mmdebstrap owns that path while it builds and removes it
# at the end; no layer here starts services anyway.)
DOCKER_CONFIG: dict[str, tuple[str, int]] = {
    "etc/dpkg/dpkg.cfg.d/docker-apt-speedup": ("force-unsafe-io\n", 0o644),
    "etc/apt/apt.conf.d/docker-autoremove-suggests": (
        'Apt::AutoRemove::SuggestsImportant "false";\n', 0o644),
    "etc/apt/apt.conf.d/docker-clean": (
        f"DPkg::Post-Invoke {{ {_APT_CLEAN} }};\n"
        f"APT::Update::Post-Invoke {{ {_APT_CLEAN} }};\n"
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n', 0o644),
    "etc/apt/apt.conf.d/docker-gzip-indexes": ('Acquire::GzipIndexes "true";\n', 0o644),
    "etc/apt/apt.conf.d/docker-no-languages": ('Acquire::Languages "none";\n', 0o644),
}
# With docker-clean in place, apt no longer names its cache files, so mmdebstrap's own cleanup
# leaves the pkgcache.bin/srcpkgcache.bin its install step wrote (72 MB): remove them as
# docker-clean's Post-Invoke would have.
_CLEAN_HOOK = 'rm -f "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb'
# What a local bootstrapped base must show to count as made with these settings.
_MARKER = "/etc/apt/apt.conf.d/docker-clean"
_CHECK = f"test -f {_MARKER} && test -z \"$(find /var/cache/apt -type f ! -name lock)\""


def ensure_base(client: docker.DockerClient, base: Base, log=print, pull: bool = False) -> str:
    """Return how the base was found: 'local', 'pulled' or 'bootstrapped'.

    ``pull`` asks the registry again for a base that is local already (a bootstrapped one too:
    where the registry serves it, its image replaces the local one), so the image under the name
    is the registry's current one; the plan then hashes its new digest into the tags.
    """
    if pull and not reference.parse(base.image).digest:
        repository, tag = _split(base.image)
        try:
            client.images.pull(repository, tag=tag)
            return "pulled"
        except APIError as exc:
            if not _local(client, base.image):
                pull_error = str(exc.explanation or exc).splitlines()[0][:200]
                return _not_pullable(client, base, pull_error, log)
            log(f"base {base.image}: pulling it again failed "
                f"({str(exc.explanation or exc).splitlines()[0][:200]}); using the local image")
            return "local"
    if _local(client, base.image):
        if not base.bootstrap or _has_docker_config(client, base.image):
            return "local"
        log(f"base {base.image}: local copy lacks the official image's apt settings "
            f"({_MARKER}) or ships apt caches; bootstrapping it again")
        bootstrap(client, base)
        return "bootstrapped"
    try:
        repository, tag = _split(base.image)
        client.images.pull(repository, tag=tag)
        return "pulled"
    except APIError as exc:
        pull_error = str(exc.explanation or exc).splitlines()[0][:200]
    return _not_pullable(client, base, pull_error, log)


def _not_pullable(client: docker.DockerClient, base: Base, pull_error: str, log) -> str:
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
        config = Path(tmp) / "config"
        _write_docker_config(config)
        command = ["mmdebstrap", "--variant=minbase", "--include=ca-certificates",
                   f"--components={components}", "--quiet",
                   f"--customize-hook=sync-in {config} /",
                   f"--customize-hook={_CLEAN_HOOK}",
                   spec["suite"], str(tarball), spec["mirror"]]
        returncode, output = _run_mmdebstrap(command, Path(tmp) / "mmdebstrap.log")
        if returncode:
            tail = " ".join(output.strip().splitlines()[-2:])
            raise UserError(f"bootstrapping base {base.name} with mmdebstrap failed: {tail}")
        repository, tag = _split(base.image)
        # A file path makes docker-py send the tar with a Content-Length; its stream variant
        # declares chunked encoding without chunking, which the engine rejects.
        # The recipe's hash as a label: `invoke plan` says a base was bootstrapped, by which
        # recipe; its image ID (this import's result) is what the layer tags hash.
        client.api.import_image(src=str(tarball), repository=repository, tag=tag,
                                changes=['CMD ["bash"]',
                                         f"LABEL {RECIPE_LABEL}={recipe_digest(base)}"])
    if not _local(client, base.image):
        raise UserError(f"importing the bootstrapped base as {base.image} failed")


# How long mmdebstrap gets to clean up after SIGINT (unmount proc/sys/dev in its chroot, remove
# its /tmp/mmdebstrap.* folder) before it is asked again with SIGTERM, then killed.
CLEANUP_WAIT_S = 120.0


def _run_mmdebstrap(command: list[str], log_file: Path) -> tuple[int, str]:
    """Run mmdebstrap in its own process group; (exit status, its output).

    On Ctrl-C (or any exception here) mmdebstrap's group gets SIGINT and we wait for it: its
    signal handler unmounts what it mounted and removes its temporary chroot. Killing it first
    (what ``subprocess.run`` does on KeyboardInterrupt) leaves ``/tmp/mmdebstrap.*`` behind,
    with proc, sys and dev still mounted. The terminal's own SIGINT reaches only us, because the
    child has its own group, so it is sent exactly once.
    """
    with log_file.open("w+", encoding="utf-8") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            returncode = proc.wait()
        except BaseException:
            _stop_group(proc)
            raise
        log.seek(0)
        return returncode, log.read()


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGINT to the child's group, wait; SIGTERM, wait; SIGKILL only as the last resort."""
    for sig, wait_s in ((signal.SIGINT, CLEANUP_WAIT_S), (signal.SIGTERM, 30.0),
                        (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
            return


def recipe_digest(base: Base) -> str:
    """A short hash of everything that decides a bootstrapped base's content except the mirror's
    state: rendering puts it into the first layer's Dockerfile, so content tags change with it."""
    recipe = {"bootstrap": base.bootstrap, "variant": "minbase", "include": ["ca-certificates"],
              "config": DOCKER_CONFIG, "hooks": [_CLEAN_HOOK]}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _write_docker_config(root: Path) -> None:
    for rel, (text, mode) in DOCKER_CONFIG.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(mode)


def _has_docker_config(client: docker.DockerClient, image: str) -> bool:
    """Run the check in a container of ``image``; the container is removed whatever happens
    (``containers.run(remove=True)`` leaves it behind when the engine refuses to start it)."""
    container = client.containers.create(image, ["sh", "-c", _CHECK], entrypoint=[])
    try:
        container.start()
        return container.wait().get("StatusCode") == 0
    finally:
        with contextlib.suppress(*ENGINE_FAULTS):
            container.remove(force=True)


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
