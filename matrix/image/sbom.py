"""A CycloneDX bill of materials of a built stack, read from the image itself.

Three sources, each what the image really holds rather than what the matrix meant it to:

- dpkg's status file (``/var/lib/dpkg/status``): every Debian package installed, as
  ``pkg:deb/<debian|ubuntu>/<name>@<version>?arch=<arch>``;
- every Python distribution's metadata, listed by ``importlib.metadata`` inside a container of the
  image (``pkg:pypi/<name>@<version>``), with the sha256 stacks.yaml pins for it where it pins one
  (an sdist such as DeepSpeed's is built from source in the image: its property says so);
- every component the matrix downloads and builds from source (``download: {url, sha256}`` in
  stacks.yaml), with that URL as its distribution reference and that sha256 as its hash.

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
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import docker

from matrix.errors import UserError
from matrix.image.engine import ENGINE_FAULTS
from matrix.model.entities import Matrix, Stack

# Run inside the image: installed distributions' names and versions, as JSON on stdout.
_PY_DISTRIBUTIONS = """
import json, sys
try:
    from importlib import metadata
except ImportError:
    print("[]"); sys.exit(0)
seen = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name and name.lower() not in seen:
        seen[name.lower()] = {"name": name, "version": dist.version,
                              "license": dist.metadata.get("License") or ""}
print(json.dumps(sorted(seen.values(), key=lambda d: d["name"].lower())))
"""
_SHELL = ("cat /var/lib/dpkg/status 2>/dev/null; echo '@@MNP-SBOM@@'; "
          "if command -v python3 >/dev/null; then python3 -c \"$MNP_SBOM_PY\"; else echo '[]'; fi")


@dataclass(frozen=True)
class Package:
    """One installed thing: ``kind`` is deb, pypi or source."""

    kind: str
    name: str
    version: str
    arch: str = ""
    url: str = ""
    sha256: str = ""
    built_from_source: bool = False


def read_image(client: docker.DockerClient, image: str) -> tuple[list[Package], list[Package]]:
    """(Debian packages, Python distributions) installed in ``image``."""
    container = client.containers.create(image, ["sh", "-c", _SHELL], entrypoint=[],
                                         environment={"MNP_SBOM_PY": _PY_DISTRIBUTIONS},
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
        dists = json.loads(python.strip() or "[]")
    except json.JSONDecodeError:
        raise UserError(f"reading the Python distributions of {image} failed: "
                        f"{python.strip()[:160]!r}") from None
    return _dpkg_status(dpkg), [Package("pypi", d["name"], d["version"]) for d in dists]


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
                pins[_normal(name)] = pin
    return pins


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def document(matrix: Matrix, stack: Stack, image: str, image_id: str,
             debs: list[Package], dists: list[Package], created: str = "") -> str:
    """The CycloneDX 1.6 JSON document, validated against the schema."""
    from cyclonedx.model import ExternalReference, ExternalReferenceType, HashType, Property, XsUri
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    distro = "ubuntu" if stack.base.os.startswith("ubuntu") else "debian"
    pins = pip_pins(stack)
    # The same image gives the same document, byte for byte (a second push sends nothing): its
    # serial number is derived from the image ID and its timestamp is the image's creation time.
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"mnp-stacks:sbom:{image_id}"))
    if created:
        bom.metadata.timestamp = datetime.fromisoformat(created[:19]).replace(tzinfo=timezone.utc)
    bom.metadata.component = Component(
        type=ComponentType.CONTAINER, name=image.rsplit(":", 1)[0], version=image_id,
        bom_ref=image_id, properties=[Property(name="mnp-stacks:stack", value=stack.name),
                                      Property(name="mnp-stacks:base", value=stack.base.image)])
    for deb in debs:
        qualifiers = {"arch": deb.arch} if deb.arch else None
        bom.components.add(Component(
            type=ComponentType.LIBRARY, name=deb.name, version=deb.version,
            bom_ref=f"deb:{deb.name}@{deb.version}:{deb.arch}",
            purl=PackageURL("deb", distro, deb.name, deb.version, qualifiers)))
    for dist in dists:
        pin = pins.get(_normal(dist.name), {})
        hashes = ([HashType.from_composite_str(f"sha256:{pin['sha256']}")]
                  if pin.get("sha256") and pin.get("version") == dist.version else [])
        properties = ([Property(name="mnp-stacks:built-from-source", value="sdist")]
                      if hashes and pin.get("tag") == "sdist" else [])
        bom.components.add(Component(
            type=ComponentType.LIBRARY, name=dist.name, version=dist.version,
            bom_ref=f"pypi:{_normal(dist.name)}@{dist.version}", hashes=hashes,
            properties=properties, purl=PackageURL("pypi", None, _normal(dist.name), dist.version)))
    for source in source_components(stack):
        hashes = [HashType.from_composite_str(f"sha256:{source.sha256}")] if source.sha256 else []
        bom.components.add(Component(
            type=ComponentType.LIBRARY, name=source.name, version=source.version,
            bom_ref=f"source:{source.name}@{source.version}", hashes=hashes,
            properties=[Property(name="mnp-stacks:built-from-source", value=source.url)],
            external_references=[ExternalReference(type=ExternalReferenceType.DISTRIBUTION,
                                                   url=XsUri(source.url), hashes=hashes)]))
    bom.register_dependency(bom.metadata.component, list(bom.components))
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    error = schema_error(text)
    if error:
        raise UserError(f"the bill of materials of {stack.name} does not validate against "
                        f"CycloneDX 1.6: {error[:200]}")
    return text + "\n"


# Run by schema_error in a fresh interpreter: prints the first schema error, or nothing.
VALIDATE = """
import sys
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(sys.stdin.read())
print("" if error is None else str(error))
"""


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
    except docker.errors.ImageNotFound:
        raise UserError(f"image {image} is not in the local engine; run `invoke build --stack "
                        f"{stack.name}` first") from None
    debs, dists = read_image(client, image)
    return document(matrix, stack, image, image_id, debs, dists, created)
