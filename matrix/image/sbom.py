"""A CycloneDX bill of materials of a built stack, read from the image itself.

One entry per installed thing, each what the image really holds rather than what the matrix
meant it to:

- dpkg's status file (``/var/lib/dpkg/status``): every Debian package installed, as
  ``pkg:deb/<debian|ubuntu>/<name>@<version>?arch=<arch>``;
- every Python distribution's metadata folder on the image's ``sys.path`` (``*.dist-info``,
  ``*.egg-info``), read inside a container of the image. One whose folder a Debian package owns
  (listed in ``/var/lib/dpkg/info/<package>.list``: ``python3-urllib3``, Debian's
  ``python3-torch``) is that package's: it stays under the ``pkg:deb`` entry, named there in a
  ``mnp-stacks:python-distribution`` property, and is never listed again as ``pkg:pypi``. A
  scanner matching it to PyPI would report advisories Debian's revision already fixed, and
  versions such as Debian torch's ``1.13.0a0+gitunknown`` are no PyPI release at all. Every other
  distribution is ``pkg:pypi/<name>@<version>``, its name as the purl specification's pypi type
  writes it (lower case, ``_`` as ``-``, dots kept: PURL_PYPI), with the sha256 stacks.yaml pins
  for it where it pins one (an sdist such as DeepSpeed's is built from source in the image: its
  property says so);
- what the stack builds itself: every component the matrix downloads and builds from source
  (``download: {url, sha256}`` in stacks.yaml), with that URL as its distribution reference and
  that sha256 as its hash, and the project's entrypoint (the last layer of every stack), with
  the digest of the files the image holds.

The document is built and validated with cyclonedx-python-lib (https://github.com/CycloneDX/
cyclonedx-python-lib), CycloneDX 1.6 (https://cyclonedx.org/docs/1.6/json/); a document that does
not validate is an error, never written. It is validated in a Python process of its own, where
jsonschema checks every format the CycloneDX schema uses (``iri-reference`` included, which the
matrix's own checks leave out: ``matrix.model.schema.jsonschema_library``). Nothing is installed
into the image: the container runs the image's own ``python3`` (or only ``cat`` where it has
none), with no network.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

import docker

from matrix.errors import UserError
from matrix.image.engine import ENGINE_FAULTS
from matrix.model.entities import Matrix, Stack

# The pypi purl type's name rule: "Replace underscore _ with dash -", case-insensitive so lower
# case, and nothing about dots (they stay: zope.interface is pkg:pypi/zope.interface).
PURL_PYPI = ("https://github.com/package-url/purl-spec/blob/v1.0.1/types/pypi-definition.json "
             "(name_definition: normalization_rules, note)")
# Where images/entrypoint/Dockerfile.j2 puts the entrypoint.
ENTRYPOINT_LIB = "/opt/mnp/lib/entrypoint"
ENTRYPOINT_BIN = "/usr/local/bin/mnp-entrypoint"

# Run inside the image by its own python3 (3.6 and later: no importlib.metadata needed), as JSON
# on stdout: every distribution's metadata folder on sys.path with its name, version and the
# Debian package whose file list names that folder; and the digest of the entrypoint's files.
_PY_CONTENTS = r"""
import glob, hashlib, json, os, sys
from email.parser import HeaderParser

owners = {}
for listing in glob.glob("/var/lib/dpkg/info/*.list"):
    package = os.path.basename(listing)[:-len(".list")].split(":")[0]
    try:
        with open(listing, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                path = line.rstrip("\n")
                if path.endswith((".dist-info", ".egg-info")):
                    owners[path] = package
    except OSError:
        pass

def metadata(path):
    if path.endswith(".dist-info"):
        path = os.path.join(path, "METADATA")
    elif os.path.isdir(path):
        path = os.path.join(path, "PKG-INFO")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return HeaderParser().parse(handle)
    except OSError:
        return None

dists, seen = [], set()
for folder in sys.path:
    if not folder or not os.path.isabs(folder) or not os.path.isdir(folder):
        continue
    for entry in sorted(os.listdir(folder)):
        if not entry.endswith((".dist-info", ".egg-info")):
            continue
        path = os.path.join(folder, entry)
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        found = metadata(path)
        if found is None or not found.get("Name"):
            continue
        dists.append({"name": found["Name"], "version": found.get("Version") or "",
                      "path": path, "owner": owners.get(path) or owners.get(real) or ""})

def tree_sha256(root):
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        found += [os.path.relpath(os.path.join(folder, name), root) for name in files
                  if not name.endswith(".pyc")]
    digest = hashlib.sha256()
    for rel in sorted(found):
        with open(os.path.join(root, rel), "rb") as handle:
            content = hashlib.sha256(handle.read()).hexdigest()
        digest.update(("%s\0%s\n" % (rel, content)).encode())
    return digest.hexdigest(), len(found)

entrypoint = None
lib, launcher = os.environ["MNP_SBOM_EP_LIB"], os.environ["MNP_SBOM_EP_BIN"]
if os.path.isdir(lib) and os.path.isfile(launcher):
    tree, files = tree_sha256(lib)
    with open(launcher, "rb") as handle:
        entrypoint = {"tree_sha256": tree, "files": files,
                      "launcher_sha256": hashlib.sha256(handle.read()).hexdigest()}
print(json.dumps({"dists": dists, "entrypoint": entrypoint}))
"""
_SHELL = ("cat /var/lib/dpkg/status 2>/dev/null; echo '@@MNP-SBOM@@'; "
          "if command -v python3 >/dev/null; then python3 -c \"$MNP_SBOM_PY\"; "
          "else echo '{\"dists\": [], \"entrypoint\": null}'; fi")


@dataclass(frozen=True)
class Package:
    """One installed thing: ``kind`` is deb, pypi or source. A Python distribution's ``path`` is
    its metadata folder and ``owner`` the Debian package that installed it ("" for pip's)."""

    kind: str
    name: str
    version: str
    arch: str = ""
    url: str = ""
    sha256: str = ""
    built_from_source: bool = False
    path: str = ""
    owner: str = ""


@dataclass(frozen=True)
class EntrypointFiles:
    """The entrypoint as the image holds it: ``tree_sha256``, the sha256 of one line
    ``<relative path>\\0<sha256 of the file>\\n`` per file of ``ENTRYPOINT_LIB`` in sorted order
    (``__pycache__`` and ``*.pyc`` left out, as the build context leaves them out), ``files`` the
    number of them, and the sha256 of ``ENTRYPOINT_BIN``."""

    tree_sha256: str
    files: int
    launcher_sha256: str


@dataclass
class ImageContents:
    """What :func:`read_image` found: Debian packages, Python distributions, the entrypoint."""

    debs: list[Package] = field(default_factory=list)
    dists: list[Package] = field(default_factory=list)
    entrypoint: EntrypointFiles | None = None


def read_image(client: docker.DockerClient, image: str) -> ImageContents:
    """The Debian packages, Python distributions and entrypoint installed in ``image``."""
    container = client.containers.create(image, ["sh", "-c", _SHELL], entrypoint=[],
                                         environment={"MNP_SBOM_PY": _PY_CONTENTS,
                                                      "MNP_SBOM_EP_LIB": ENTRYPOINT_LIB,
                                                      "MNP_SBOM_EP_BIN": ENTRYPOINT_BIN},
                                         network_disabled=True, user="0",
                                         labels={"io.github.mnp-stacks.sbom": "1"})
    try:
        container.start()
        status = container.wait().get("StatusCode")
        output = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
    finally:
        with contextlib.suppress(*ENGINE_FAULTS):
            container.remove(force=True)
    dpkg, sep, python = output.partition("@@MNP-SBOM@@")
    if status != 0 or not sep:
        raise UserError(f"reading the packages of {image} failed (exit {status}): "
                        f"{output.strip().splitlines()[-1:] or 'no output'}")
    try:
        found = json.loads(python.strip() or "{}")
        dists = [Package("pypi", d["name"], d["version"], path=d["path"], owner=d["owner"])
                 for d in found.get("dists", [])]
        ep = found.get("entrypoint")
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise UserError(f"reading the Python distributions of {image} failed: "
                        f"{python.strip()[:160]!r}") from None
    return ImageContents(_dpkg_status(dpkg), dists, EntrypointFiles(**ep) if ep else None)


def _dpkg_status(text: str) -> list[Package]:
    """Installed packages of a dpkg status file (stanzas whose Status ends in ``installed``)."""
    packages = []
    for stanza in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            packages.append(Package("deb", fields["Package"], fields.get("Version", ""),
                                    fields.get("Architecture", "")))
    return sorted(packages, key=lambda p: p.name)


def source_components(stack: Stack) -> list[Package]:
    """What the stack's layers download and build from source, with URL and sha256."""
    found = []
    for layer in stack.layers:
        download = layer.spec.get("download")
        if isinstance(download, dict) and download.get("url"):
            found.append(Package("source", layer.component, layer.version, url=download["url"],
                                 sha256=download.get("sha256", ""), built_from_source=True))
    return found


def pip_pins(stack: Stack) -> dict[str, dict[str, str]]:
    """Pinned pip packages by normalised name: version, sha256, wheel tag (``sdist``)."""
    pins = {}
    for layer in stack.layers:
        for name, pin in (layer.spec.get("pip") or {}).items():
            if isinstance(pin, dict):
                pins[_pep503(name)] = pin
    return pins


def _pep503(name: str) -> str:
    """The name pip compares (https://peps.python.org/pep-0503/#normalized-names): to match a
    distribution with its pin in stacks.yaml, never as a purl name (PURL_PYPI)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def purl_pypi_name(name: str) -> str:
    """A distribution's name as the purl specification's pypi type writes it (PURL_PYPI)."""
    return name.lower().replace("_", "-")


def split_by_owner(debs: list[Package], dists: list[Package]) -> tuple[dict[str, list[Package]],
                                                                       list[Package]]:
    """(the distributions each installed Debian package owns, by package name; the rest, once
    per name and version): a distribution whose owner is not installed stays a PyPI one."""
    installed = {deb.name for deb in debs}
    owned: dict[str, list[Package]] = {}
    rest: dict[tuple[str, str], Package] = {}
    for dist in dists:
        if dist.owner and dist.owner in installed:
            owned.setdefault(dist.owner, []).append(dist)
        else:
            rest.setdefault((purl_pypi_name(dist.name), dist.version), dist)
    return owned, list(rest.values())


def document(matrix: Matrix, stack: Stack, image: str, image_id: str,
             debs: list[Package], dists: list[Package], created: str = "",
             entrypoint: EntrypointFiles | None = None, platform: str = "") -> str:
    """The CycloneDX 1.6 JSON document, validated against the schema. ``platform`` is what the
    image's config records (``linux/arm64/v8``): one document per platform image, each saying
    which (CycloneDX 1.6 has no platform field, hence a property)."""
    from cyclonedx.model import (
        ExternalReference,
        ExternalReferenceType,
        HashAlgorithm,
        HashType,
        Property,
        XsUri,
    )
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    distro = "ubuntu" if stack.base.os.startswith("ubuntu") else "debian"
    pins = pip_pins(stack)
    owned, pypi = split_by_owner(debs, dists)
    # The same image gives the same document, byte for byte (a second push sends nothing): its
    # serial number is derived from the image ID and its timestamp is the image's creation time.
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"mnp-stacks:sbom:{image_id}"))
    if created:
        bom.metadata.timestamp = datetime.fromisoformat(created[:19]).replace(tzinfo=timezone.utc)
    bom.metadata.component = Component(
        type=ComponentType.CONTAINER, name=image.rsplit(":", 1)[0], version=image_id,
        bom_ref=image_id, properties=[Property(name="mnp-stacks:stack", value=stack.name),
                                      Property(name="mnp-stacks:base", value=stack.base.image),
                                      # one SBOM per platform image: what the image's
                                      # config records, else the stack's declared platform
                                      Property(name="mnp-stacks:platform",
                                               value=platform or stack.platform)])
    for deb in debs:
        qualifiers = {"arch": deb.arch} if deb.arch else None
        provides = [Property(name="mnp-stacks:python-distribution",
                             value=f"{dist.name} {dist.version} ({dist.path})")
                    for dist in owned.get(deb.name, [])]
        bom.components.add(Component(
            type=ComponentType.LIBRARY, name=deb.name, version=deb.version,
            bom_ref=f"deb:{deb.name}@{deb.version}:{deb.arch}", properties=provides,
            purl=PackageURL("deb", distro, deb.name, deb.version, qualifiers)))
    for dist in pypi:
        pin = pins.get(_pep503(dist.name), {})
        hashes = ([HashType(alg=HashAlgorithm.SHA_256, content=pin["sha256"])]
                  if pin.get("sha256") and pin.get("version") == dist.version else [])
        properties = ([Property(name="mnp-stacks:built-from-source", value="sdist")]
                      if hashes and pin.get("tag") == "sdist" else [])
        name = purl_pypi_name(dist.name)
        bom.components.add(Component(
            type=ComponentType.LIBRARY, name=dist.name, version=dist.version,
            bom_ref=f"pypi:{name}@{dist.version}", hashes=hashes, properties=properties,
            purl=PackageURL("pypi", None, name, dist.version)))
    for source in source_components(stack):
        hashes = ([HashType(alg=HashAlgorithm.SHA_256, content=source.sha256)]
                  if source.sha256 else [])
        bom.components.add(Component(
            type=ComponentType.LIBRARY, name=source.name, version=source.version,
            bom_ref=f"source:{source.name}@{source.version}", hashes=hashes,
            properties=[Property(name="mnp-stacks:built-from-source", value=source.url)],
            external_references=[ExternalReference(type=ExternalReferenceType.DISTRIBUTION,
                                                   url=XsUri(source.url), hashes=hashes)]))
    layer = next((layer for layer in stack.layers if layer.component == "entrypoint"), None)
    if layer is not None and entrypoint is not None:
        bom.components.add(Component(
            type=ComponentType.APPLICATION, name="mnp-entrypoint", version=layer.version,
            bom_ref=f"project:entrypoint@{layer.version}",
            description="the project's entrypoint (entrypoint/, images/entrypoint/Dockerfile.j2)",
            properties=[
                Property(name="mnp-stacks:built-from-source", value="project: entrypoint/"),
                Property(name="mnp-stacks:installed-at", value=f"{ENTRYPOINT_LIB} {ENTRYPOINT_BIN}"),
                Property(name="mnp-stacks:tree-sha256",
                         value=f"{entrypoint.tree_sha256} ({entrypoint.files} files of "
                               f"{ENTRYPOINT_LIB}: relative path and sha256 of each, sorted)"),
                Property(name="mnp-stacks:launcher-sha256", value=entrypoint.launcher_sha256)],
            external_references=([ExternalReference(type=ExternalReferenceType.VCS,
                                                    url=XsUri(matrix.source))]
                                 if matrix.source else [])))
    bom.register_dependency(bom.metadata.component, list(bom.components))
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    error = schema_error(text)
    if error:
        raise UserError(f"the bill of materials of {stack.name} does not validate against "
                        f"CycloneDX 1.6: {error[:200]}")
    return text + "\n"


# Run by schema_error in a fresh interpreter: prints the first schema error, or nothing.
#
# jsonschema's iri and iri-reference checks call one function of rfc3987_syntax,
# is_valid_syntax(term, value), which parses with one Earley parser of the package's grammar
# (jsonschema/_format.py; rfc3987_syntax/syntax_helpers.py, `syntax_parser`). Importing the
# package builds that parser and 37 more for functions jsonschema never calls: 2 to 3 s of CPU,
# most of each validation (and of `invoke sbom`). So the script first provides the module with
# that one function over that one parser, from the installed package's own grammar file and the
# same Lark options; without the grammar file (another release) it imports the package as is.
IRI_PARSER = """
import sys
from importlib.util import find_spec
from pathlib import Path

spec = find_spec("rfc3987_syntax")
grammar = Path(spec.origin).with_name("syntax_rfc3987.lark") if spec and spec.origin else None
if grammar is not None and grammar.is_file():
    import types
    from lark import Lark, exceptions

    parser = Lark(grammar.read_text(encoding="utf-8"), parser="earley",
                  start=["iri", "iri_reference", "absolute_iri"])

    def is_valid_syntax(term, value):
        try:
            parser.parse(value, start=term)
            return True
        except exceptions.LarkError:
            return False

    module = types.ModuleType("rfc3987_syntax")
    module.is_valid_syntax = is_valid_syntax
    sys.modules["rfc3987_syntax"] = module
"""
# The validation itself: the first schema error, or nothing.
CHECK = """
import sys
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(sys.stdin.read())
print("" if error is None else str(error))
"""
VALIDATE = IRI_PARSER + CHECK


def schema_error(text: str) -> str:
    """The first place ``text`` breaks the CycloneDX 1.6 JSON schema, or "" when it holds.

    A process of its own, so that jsonschema has every format checker there whatever this
    process imported first (see the module's docstring)."""
    proc = subprocess.run([sys.executable, "-c", VALIDATE], input=text, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise UserError("could not validate the bill of materials: "
                        f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return proc.stdout.strip()


def of_image(client: docker.DockerClient, matrix: Matrix, stack: Stack, image: str) -> str:
    """The validated CycloneDX JSON of ``image`` (the built stack ``stack``)."""
    try:
        found = client.images.get(image)
        image_id, created = found.id, found.attrs.get("Created", "")
        platform = image_platform(found.attrs)
    except docker.errors.ImageNotFound:
        raise UserError(f"image {image} is not in the local engine; run `invoke build --stack "
                        f"{stack.name}` first") from None
    found = read_image(client, image)
    return document(matrix, stack, image, image_id, found.debs, found.dists, created,
                    found.entrypoint, platform)


def image_platform(attrs: dict) -> str:
    """``os/architecture[/variant]`` as the image config records them (the OCI image-spec's
    config fields; image-index.md "platform" writes them the same way)."""
    parts = [attrs.get("Os", ""), attrs.get("Architecture", ""), attrs.get("Variant", "")]
    return "/".join(part for part in parts if part)
