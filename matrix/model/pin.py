"""Pins from the package index: ``invoke pin`` writes them, ``invoke pin --check`` verifies them.

Like docker-library's ``versions.sh``, the index is the source of truth, not a hand-typed hash:

* every pip pin (``name: {version, sha256}``) names one file of that release on the index; ``pin``
  keeps the file a recorded sha256 names (or picks the wheel that installs on the Python of every
  stack using it, else the sdist) and writes its sha256, its ``Requires-Python`` and its wheel
  ``tag`` into ``stacks.yaml``; ``--check`` verifies that the sha256 is a file of that release and
  that the recorded ``requires_python``/``tag`` are that file's;
* every ``download`` is verified where its URL can be reached: files on PyPI's file host by the
  index's own hash, anything else by fetching it and hashing what arrives. A version with no
  download pin yet but an ``options.archive_url`` gets that archive's sha256 printed, so it can be
  pinned from a machine that reaches it (the publish workflow runs ``--check``).

The index is read through its PEP 691 JSON API (``Accept: application/vnd.pypi.simple.v1+json``),
which gives each file's name, sha256, ``requires-python`` and yanked state. What cannot be reached
is reported as not checked, never as passed.
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from matrix.errors import UserError
from matrix.model.entities import Matrix
from matrix.model.loader import load_matrix
from matrix.model.rules import wheel_fits
from matrix.model.settings import default_ca_bundle

PYPI_SIMPLE = "https://pypi.org/simple"
PYPI_FILES_HOST = "files.pythonhosted.org"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 20
_PIN_LINE = re.compile(r"^(?P<indent>\s*)(?P<name>[A-Za-z0-9._-]+):\s*\{.*\}\s*(?P<comment>#.*)?$")


@dataclass(frozen=True)
class IndexFile:
    """One file of a release on the index."""

    filename: str
    url: str
    sha256: str
    requires_python: str
    yanked: bool

    @property
    def tag(self) -> str:
        """The wheel's compatibility tag (``cp310-cp310-manylinux1_x86_64``) or ``sdist``."""
        if not self.filename.endswith(".whl"):
            return "sdist"
        return "-".join(self.filename[:-4].split("-")[-3:])


@dataclass
class Report:
    """What a pin run did: lines for the user, and whether anything failed."""

    ok: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)

    def lines(self) -> Iterator[str]:
        for label, items in (("wrote", self.written), ("FAILED", self.failed),
                             ("not checked", self.unchecked), ("computed", self.computed)):
            for item in items:
                yield f"{label}: {item}"
        yield (f"{len(self.ok)} verified, {len(self.written)} written, {len(self.failed)} failed, "
               f"{len(self.unchecked)} not checked, {len(self.computed)} computed")


class Unreachable(Exception):
    """A host could not be reached (or answered with an error): the item is not checked."""


Fetch = Callable[[str, dict[str, str]], bytes]
Hasher = Callable[[str], str]


def _context() -> ssl.SSLContext:
    bundle = default_ca_bundle()
    return ssl.create_default_context(cafile=str(bundle) if bundle else None)


def http_fetch(url: str, headers: dict[str, str]) -> bytes:
    """GET ``url`` (TLS checked against the CA bundle the environment names)."""
    request = urllib.request.Request(url, headers={"User-Agent": "mnp-stacks-pin", **headers})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=_context()) as answer:
            return answer.read()
    except urllib.error.HTTPError as exc:
        raise Unreachable(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"{urlparse(url).netloc} unreachable ({reason})") from None


def stream_sha256(url: str) -> str:
    """The sha256 of what ``url`` serves, hashed as it streams (installers run to hundreds of MB)."""
    request = urllib.request.Request(url, headers={"User-Agent": "mnp-stacks-pin"})
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=_context()) as answer:
            for chunk in iter(lambda: answer.read(1 << 20), b""):
                digest.update(chunk)
    except urllib.error.HTTPError as exc:
        raise Unreachable(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"{urlparse(url).netloc} unreachable ({reason})") from None
    return digest.hexdigest()


class Index:
    """A PEP 691 simple index, read once per project."""

    def __init__(self, base_url: str = PYPI_SIMPLE, fetch: Fetch = http_fetch) -> None:
        self.base_url = base_url.rstrip("/")
        self.fetch = fetch
        self._projects: dict[str, list[IndexFile]] = {}

    def files(self, project: str) -> list[IndexFile]:
        name = canonicalize_name(project)
        if name not in self._projects:
            raw = self.fetch(f"{self.base_url}/{name}/", {"Accept": SIMPLE_JSON})
            try:
                data = json.loads(raw)
            except ValueError:
                raise Unreachable(f"{self.base_url}/{name}/: not a PEP 691 JSON answer") from None
            self._projects[name] = [
                IndexFile(filename=f["filename"], url=f["url"],
                          sha256=(f.get("hashes") or {}).get("sha256", ""),
                          requires_python=f.get("requires-python") or "",
                          yanked=bool(f.get("yanked")))
                for f in data.get("files", [])
            ]
        return self._projects[name]

    def release(self, project: str, version: str) -> list[IndexFile]:
        """The files of ``project`` ``version`` (matched as PEP 440 versions)."""
        wanted = Version(version)
        return [f for f in self.files(project) if _file_version(f.filename) == wanted]


def _file_version(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def choose(files: list[IndexFile], pythons: set[str], arch: str = "amd64") -> IndexFile | None:
    """The file to pin: a wheel for Linux on ``arch`` (x86_64 for amd64, aarch64 for arm64)
    that installs on every one of ``pythons`` (an older manylinux tag first, so older pips take
    it), else the sdist."""
    usable = [f for f in files if not f.yanked and f.sha256]
    wheels = sorted((f for f in usable if f.tag != "sdist"
                     and pythons and all(wheel_fits(f.tag, py, arch) for py in pythons)),
                    key=lambda f: (_manylinux_rank(f.tag), f.filename))
    if wheels:
        return wheels[0]
    return next((f for f in usable if f.tag == "sdist"), None)


def _manylinux_rank(tag: str) -> int:
    for rank, marker in enumerate(("any", "manylinux1", "manylinux2010", "manylinux2014")):
        if marker in tag:
            return rank
    return 9


# --- walking the matrix ---------------------------------------------------------------------

@dataclass(frozen=True)
class PipPin:
    component: str
    version: str
    name: str
    pin: dict[str, Any]
    pythons: frozenset[str]
    # The architecture of the stacks that install it (amd64 unless only arm64 stacks do).
    arch: str = "amd64"

    @property
    def label(self) -> str:
        return f"{self.component} {self.version}: {self.name}=={self.pin['version']}"

    @property
    def path(self) -> tuple[str, ...]:
        return ("components", self.component, "versions", self.version, "pip", self.name)


def pip_pins(matrix: Matrix) -> list[PipPin]:
    """Every pip pin, with the Pythons and architectures of the stacks that install it."""
    pythons: dict[tuple[str, str], set[str]] = {}
    arches: dict[tuple[str, str], set[str]] = {}
    for stack in matrix.stacks.values():
        python = stack.versions().get("python")
        for layer in stack.layers:
            arches.setdefault((layer.component, layer.version), set()).add(stack.arch)
            if python:
                pythons.setdefault((layer.component, layer.version), set()).add(python)
    components = matrix.located.data["components"]
    return [PipPin(component, version, name, pin,
                   frozenset(pythons.get((component, version), set())),
                   "arm64" if arches.get((component, version)) == {"arm64"} else "amd64")
            for component, spec in components.items()
            for version, vspec in spec["versions"].items()
            for name, pin in (vspec.get("pip") or {}).items()]


def _resolve(pin: PipPin, index: Index) -> tuple[IndexFile | None, str]:
    """The index file a pin names (by sha256) or should name, and a problem if there is one."""
    files = index.release(pin.name, pin.pin["version"])
    if not files:
        return None, f"{pin.label}: no such release on {index.base_url}"
    by_hash = next((f for f in files if f.sha256 == pin.pin.get("sha256")), None)
    if by_hash:
        return by_hash, ""
    chosen = choose(files, set(pin.pythons), pin.arch)
    problem = f"{pin.label}: sha256 {pin.pin.get('sha256')} is not a file of this release"
    return chosen, problem


def _resolved(matrix: Matrix, index: Index, report: Report) -> Iterator[tuple[PipPin, Any, str]]:
    """Each pip pin with what the index has for it; pins the index cannot answer for go to
    ``report.unchecked`` instead."""
    for pin in pip_pins(matrix):
        try:
            found, problem = _resolve(pin, index)
        except Unreachable as exc:
            report.unchecked.append(f"{pin.label}: {exc}")
            continue
        yield pin, found, problem


def check(matrix: Matrix, index: Index, hasher: Hasher = stream_sha256) -> Report:
    """Verify every pin against the index and every download where it can be fetched."""
    report = Report()
    for pin, found, problem in _resolved(matrix, index, report):
        where = matrix.located.where(pin.path)
        if problem or found is None:
            report.failed.append(f"{where}: {problem}")
            continue
        wrong = [f"{key} {pin.pin.get(key)!r} (index: {value!r})"
                 for key, value in (("requires_python", found.requires_python), ("tag", found.tag))
                 if (pin.pin.get(key) or "") != value]
        if wrong:
            report.failed.append(f"{where}: {pin.label}: {'; '.join(wrong)}; run `invoke pin`")
        elif found.yanked:
            report.failed.append(f"{where}: {pin.label}: {found.filename} is yanked on the index")
        else:
            report.ok.append(pin.label)
    _check_downloads(matrix, index, hasher, report)
    return report


def _check_downloads(matrix: Matrix, index: Index, hasher: Hasher, report: Report) -> None:
    dead_hosts: dict[str, str] = {}
    for component, spec in matrix.located.data["components"].items():
        for version, vspec in spec["versions"].items():
            label = f"{component} {version}"
            download = vspec.get("download")
            archive = (vspec.get("options") or {}).get("archive_url") if not download else None
            if not download and not archive:
                continue
            url = download["url"] if download else archive
            host = urlparse(url).netloc
            if host in dead_hosts:
                report.unchecked.append(f"{label}: {url}: {dead_hosts[host]}")
                continue
            try:
                actual = _download_sha256(url, index, hasher)
            except Unreachable as exc:
                dead_hosts.setdefault(host, str(exc))
                report.unchecked.append(f"{label}: {url}: {exc}")
                continue
            where = matrix.located.where(("components", component, "versions", version))
            if not download:
                report.computed.append(f"{where}: {label} has no download pin yet; {url} has "
                                       f"sha256 {actual} (add download: {{url: {url}, "
                                       f"sha256: {actual}}})")
            elif actual != download["sha256"]:
                report.failed.append(f"{where}: {label}: {url} has sha256 {actual}, "
                                     f"stacks.yaml says {download['sha256']}")
            else:
                report.ok.append(f"{label}: {url}")


def _download_sha256(url: str, index: Index, hasher: Hasher) -> str:
    """The sha256 of ``url``: from the index's record for files on PyPI's file host (no
    download needed), else by fetching the file."""
    if urlparse(url).netloc == PYPI_FILES_HOST:
        filename = url.rsplit("/", 1)[-1]
        project = _project_of(filename)
        if project:
            match = next((f for f in index.files(project) if f.filename == filename), None)
            if match:
                return match.sha256
    return hasher(url)


def _project_of(filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[0])
        return str(parse_sdist_filename(filename)[0])
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


# --- writing ------------------------------------------------------------------------------------

def _format_pin(name: str, version: str, chosen: IndexFile) -> str:
    rp = f", requires_python: {json.dumps(chosen.requires_python)}" if chosen.requires_python else ""
    return (f"{name}: {{version: {json.dumps(version)}, sha256: {chosen.sha256}{rp}, "
            f"tag: {chosen.tag}}}")


def write(path: Path, index: Index) -> Report:
    """Resolve every pip pin on the index and write sha256, requires_python and tag into ``path``.

    Each pin is a one-line flow mapping in the file; that line is replaced, nothing else moves.
    The file is written once, after every pin resolved; any failure leaves it untouched.
    """
    matrix = load_matrix(path)
    located = matrix.located  # the loader's parse, with every node's line: no second read
    lines = located_text(path).split("\n")
    report = Report()
    for pin, found, problem in _resolved(matrix, index, report):
        if found is None:
            report.failed.append(f"{located.where(pin.path)}: {problem or pin.label}: "
                                 "no file installs on its stacks' Python")
            continue
        number = located.lines.get(pin.path)
        match = _PIN_LINE.match(lines[number - 1]) if number else None
        if not match or match.group("name") != pin.name:
            report.failed.append(f"{located.where(pin.path)}: {pin.label}: not a one-line "
                                 "`name: {version: ..., sha256: ...}` entry; cannot rewrite it")
            continue
        comment = f"  {match.group('comment')}" if match.group("comment") else ""
        new = match.group("indent") + _format_pin(pin.name, pin.pin["version"], found) + comment
        if new != lines[number - 1]:
            lines[number - 1] = new
            report.written.append(f"{pin.label} -> {found.filename}")
        else:
            report.ok.append(pin.label)
    if report.failed:
        raise UserError(f"{path}: not written: " + " | ".join(report.failed))
    if report.written:
        temporary = path.with_name(path.name + ".pin-tmp")
        temporary.write_text("\n".join(lines), encoding="utf-8")
        try:
            load_matrix(temporary)  # what we write must still load (schema and references)
        except UserError:
            temporary.unlink()
            raise
        temporary.replace(path)
    return report


def located_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None


def run(stacks_file: str, check_only: bool, index_url: str = PYPI_SIMPLE) -> Report:
    """``invoke pin [--check]``: print what was done; a failure is a :class:`UserError`."""
    index = Index(index_url)
    path = Path(stacks_file)
    report = check(load_matrix(path), index) if check_only else write(path, index)
    for line in report.lines():
        print(line)
    if report.failed:
        raise UserError(f"{len(report.failed)} pin(s) in {path} do not match the index or the "
                        f"downloads: {report.failed[0]}")
    return report
