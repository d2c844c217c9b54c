"""Make a stack's base image available: local, pulled, or bootstrapped from a Debian mirror.

Debian-family bases that declare ``bootstrap`` in stacks.yaml are built with ``mmdebstrap``
(minbase variant plus the base's ``include``, ca-certificates unless it names others) and
imported under the base's name, so the default stack builds with no registry at all. A foreign
``architecture`` (arm64 on an amd64 host) is bootstrapped under qemu-user-static (binfmt_misc)
and loaded with an image config that records it: ``docker import`` on engine 20.10 records the
host's architecture whatever ``--platform`` says (moby/moby#42813; fixed only with API v1.42,
Docker 23.0). Builds on this engine do not enforce a platform either, so
:func:`check_architecture` compares every base with its stack.

The bootstrapped root gets the apt and dpkg settings the official
Debian image carries (:data:`DOCKER_CONFIG`), so no layer keeps apt's caches; a local
bootstrapped base made before it had them, or by another recipe than stacks.yaml now gives (its
``RECIPE_LABEL``), is made again. Other bases (nvidia/cuda, Habana) fail
with a line saying what failed and how to provide the image.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform as host
import shutil
import signal
import subprocess
import tarfile
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


# A Debian architecture as the OCI image config names it: (architecture as GOARCH, variant).
# Variants from the OCI image index's platform table ("ARM 64-bit, v8 | arm64 | v8",
# https://github.com/opencontainers/image-spec/blob/main/image-index.md#platform-variants).
OCI_PLATFORM: dict[str, tuple[str, str | None]] = {"amd64": ("amd64", None),
                                                   "arm64": ("arm64", "v8")}
# The qemu-user-static binfmt_misc entry that runs a foreign Debian architecture's binaries.
QEMU_BINFMT: dict[str, str] = {"arm64": "qemu-aarch64"}
# What mmdebstrap needs to bootstrap a foreign architecture: the emulator registered with
# binfmt_misc and arch-test, which mmdebstrap's "check" step runs (mmdebstrap(1), OPERATION;
# its README.Debian recommends arch-test and suggests binfmt-support and qemu-user-static
# "For cross platform builds such as building arm64 on amd64").
FOREIGN_PACKAGES = ("qemu-user-static", "binfmt-support", "arch-test")
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")


def ensure_base(client: docker.DockerClient, base: Base, log=print, pull: bool = False,
                platform: str | None = None) -> str:
    """Return how the base was found: 'local', 'pulled' or 'bootstrapped'.

    ``pull`` asks the registry again for a base that is local already (a bootstrapped one too:
    where the registry serves it, its image replaces the local one), so the image under the name
    is the registry's current one; the plan then hashes its new digest into the tags.
    ``platform`` (``linux/arm64``) is the one pulls ask for: a single-architecture repository
    such as arm64v8/debian has no image for the host's.
    """
    if pull and not reference.parse(base.image).digest:
        repository, tag = _split(base.image)
        try:
            client.images.pull(repository, tag=tag, platform=platform)
            return "pulled"
        except APIError as exc:
            if not _local(client, base.image):
                pull_error = str(exc.explanation or exc).splitlines()[0][:200]
                return _not_pullable(client, base, pull_error, log)
            log(f"base {base.image}: pulling it again failed "
                f"({str(exc.explanation or exc).splitlines()[0][:200]}); using the local image")
            return "local"
    local = _local(client, base.image)
    if local:
        # the recipe label of a base bootstrapped here (None on any other image)
        made_by = (local.labels or {}).get(RECIPE_LABEL) if base.bootstrap else None
        if made_by and made_by != recipe_digest(base):
            # The layers' tags follow the recipe (render.py writes it into the first layer's
            # Dockerfile): a base made by another one would be built on under tags that claim
            # this one.
            log(f"base {base.image}: bootstrapped by recipe {made_by}, stacks.yaml now gives "
                f"{recipe_digest(base)}; bootstrapping it again")
            bootstrap(client, base)
            return "bootstrapped"
        if not base.bootstrap or _has_docker_config(client, base.image):
            return "local"
        log(f"base {base.image}: local copy lacks the official image's apt settings "
            f"({_MARKER}) or ships apt caches; bootstrapping it again")
        bootstrap(client, base)
        return "bootstrapped"
    try:
        repository, tag = _split(base.image)
        client.images.pull(repository, tag=tag, platform=platform)
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


def architecture(base: Base) -> str:
    """The Debian architecture a bootstrapped base is made for (amd64 unless it says)."""
    return (base.bootstrap or {}).get("architecture", "amd64")


def check_architecture(client: docker.DockerClient, image: str, platform: str,
                       what: str) -> None:
    """Refuse an image whose config records another platform than ``platform``: the engine
    builds a linux/arm64 stack on a linux/amd64 base without a word (its build API's platform
    is no guard on 20.10), and the image would fail on every instance of the stack."""
    attrs = client.images.get(image).attrs
    arch = attrs.get("Architecture") or "?"
    found = "/".join(filter(None, (attrs.get("Os") or "linux", arch, attrs.get("Variant"))))
    if arch != platform.split("/")[1]:
        raise UserError(f"{what} {image} is {found} (its image config's Architecture), not "
                        f"{platform} as the stack's platform says; remove it (docker rmi "
                        f"{image}) so that it is pulled or bootstrapped for {platform}")


def _native_architecture() -> str:
    """The host's Debian architecture (dpkg's name; x86_64 and aarch64 as uname says)."""
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(host.machine(), host.machine())


def ensure_emulation(arch: str) -> None:
    """Make ``arch``'s binaries runnable here: Debian's qemu-user-static registers its
    interpreter with binfmt_misc (with the F flag, so containers use it too) and arch-test,
    which mmdebstrap runs to check it, confirms it. Installed with apt when missing."""
    if arch == _native_architecture():
        return
    if arch not in QEMU_BINFMT:
        raise UserError(f"cannot bootstrap a base for architecture {arch!r} here: "
                        f"known foreign architectures are {', '.join(sorted(QEMU_BINFMT))}")
    entry = BINFMT_DIR / QEMU_BINFMT[arch]
    if not shutil.which("arch-test") or not entry.exists():
        apt_install(*FOREIGN_PACKAGES)
    if not entry.exists():
        # binfmt-support's service mounts binfmt_misc and imports qemu's formats; where no
        # init runs it (a container), do what it does.
        if not (BINFMT_DIR / "register").exists():
            subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)],
                           capture_output=True, check=False)
        subprocess.run(["update-binfmts", "--enable", QEMU_BINFMT[arch]], capture_output=True,
                       check=False)
    proc = subprocess.run(["arch-test", arch], capture_output=True, text=True, check=False)
    if proc.returncode or not entry.exists():
        said = " ".join((proc.stdout + proc.stderr).split())[:200]
        raise UserError(f"cannot run {arch} binaries here ({BINFMT_DIR / QEMU_BINFMT[arch]} "
                        f"missing or arch-test failed: {said}); {' '.join(FOREIGN_PACKAGES)} "
                        "must be installed and binfmt_misc writable (a privileged container)")


def bootstrap(client: docker.DockerClient, base: Base) -> None:
    """Build the base root filesystem with mmdebstrap and import it as ``base.image``."""
    spec = base.bootstrap or {}
    arch = architecture(base)
    if not shutil.which("mmdebstrap"):
        apt_install("mmdebstrap")
    ensure_emulation(arch)
    components = ",".join(spec.get("components", ["main"]))
    added = packages(base)
    include = [f"--include={','.join(added)}"] if added else []
    with tempfile.TemporaryDirectory(prefix="mnp-base-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        config = Path(tmp) / "config"
        _write_docker_config(config)
        command = ["mmdebstrap", f"--architectures={arch}", "--variant=minbase", *include,
                   f"--components={components}", "--quiet",
                   f"--customize-hook=sync-in {config} /",
                   f"--customize-hook={_CLEAN_HOOK}",
                   spec["suite"], str(tarball), spec["mirror"]]
        returncode, output = _run_mmdebstrap(command, Path(tmp) / "mmdebstrap.log")
        if returncode:
            tail = " ".join(output.strip().splitlines()[-2:])
            raise UserError(f"bootstrapping base {base.name} with mmdebstrap failed: {tail}")
        repository, tag = _split(base.image)
        # The recipe's hash as a label: `invoke plan` says a base was bootstrapped, by which
        # recipe; its image ID (this import's result) is what the layer tags hash.
        labels = {RECIPE_LABEL: recipe_digest(base)}
        if arch == "amd64":
            # A file path makes docker-py send the tar with a Content-Length; its stream
            # variant declares chunked encoding without chunking, which the engine rejects.
            client.api.import_image(src=str(tarball), repository=repository, tag=tag,
                                    changes=['CMD ["bash"]',
                                             f"LABEL {RECIPE_LABEL}={labels[RECIPE_LABEL]}"])
        else:
            load_rootfs(client, tarball, f"{repository}:{tag}", arch, labels)
    if not _local(client, base.image):
        raise UserError(f"importing the bootstrapped base as {base.image} failed")
    check_architecture(client, base.image, f"linux/{OCI_PLATFORM[arch][0]}",
                       f"bootstrapped base {base.name!r}")


# The config's dates: fixed, so the same root filesystem loads as the same image ID.
_EPOCH = "1970-01-01T00:00:00Z"


def load_rootfs(client: docker.DockerClient, rootfs: Path, name: str, arch: str,
                labels: dict[str, str]) -> str:
    """Load a root-filesystem tar as image ``name`` whose config records ``arch``.

    ``docker load`` keeps a docker-archive's config as written (moby image/tarexport/load.go
    checks only its OS and the layers' diff_ids); the image ID is the sha256 of those bytes.
    """
    digest = hashlib.sha256()
    with rootfs.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    goarch, variant = OCI_PLATFORM[arch]
    config = {"architecture": goarch, "os": "linux", "created": _EPOCH,
              **({"variant": variant} if variant else {}),
              "config": {"Cmd": ["bash"], "Labels": labels},
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest.hexdigest()}"]},
              "history": [{"created": _EPOCH, "created_by": f"mmdebstrap --architectures={arch}"}]}
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_name = hashlib.sha256(blob).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": ["layer.tar"]}]
    archive = rootfs.with_name("image.tar")
    with tarfile.open(archive, "w") as out:
        for member, data in ((config_name, blob), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        out.add(rootfs, arcname="layer.tar")
    with archive.open("rb") as f:  # a real file: docker-py sends it with a Content-Length
        for _ in client.api.load_image(f):
            pass
    return "sha256:" + config_name.removesuffix(".json")


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


# What mmdebstrap adds to minbase when a base's bootstrap names no ``include``: what every
# bootstrap included before bases could say.
DEFAULT_INCLUDE = ("ca-certificates",)


def packages(base: Base) -> list[str]:
    """The packages a base's bootstrap adds to minbase (its ``include``, else the default)."""
    return list((base.bootstrap or {}).get("include", DEFAULT_INCLUDE))


def recipe_digest(base: Base) -> str:
    """A short hash of everything that decides a bootstrapped base's content except the mirror's
    state: rendering puts it into the first layer's Dockerfile, so content tags change with it.
    ``include`` is hashed in its own key, where it always was, so a base that spells out the
    default keeps its digest and the tags of every layer on it."""
    bootstrap = {key: value for key, value in (base.bootstrap or {}).items() if key != "include"}
    recipe = {"bootstrap": bootstrap, "variant": "minbase", "include": packages(base),
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


def _local(client: docker.DockerClient, image: str) -> docker.models.images.Image | None:
    """The local image of that name, None when there is none."""
    try:
        return client.images.get(image)
    except ImageNotFound:
        return None


def _split(image: str) -> tuple[str, str]:
    name, _, digest = image.partition("@")
    if digest:
        return name, digest
    repository, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        return name, "latest"
    return repository, tag
