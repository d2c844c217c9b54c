"""``invoke sbom`` and the SBOM ``invoke push`` leaves beside the image (matrix/image/sbom.py,
matrix/deploy/publish.py): CycloneDX 1.6 read from the image itself, validated with
cyclonedx-python-lib, pushed to the loopback registry as ``sha256-<digest>.sbom`` and pulled
back from it."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from matrix.deploy import publish
from matrix.image import sbom
from matrix.image.testrecord import record_pass
from matrix.model.loader import load_matrix
from matrix.model.settings import ROOT

pytestmark = pytest.mark.docker


def _valid(text: str) -> dict:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    return json.loads(text)


def _by_name(document: dict) -> dict[str, dict]:
    return {c["name"].lower(): c for c in document["components"]}


def test_source_built_components_carry_url_and_sha256():
    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack("cuda10.1-tcp")  # Open MPI 4.0.5 and Horovod built from source
    doc = _valid(sbom.document(matrix, stack, "mnp-stacks:cuda10.1-tcp", "sha256:" + "0" * 64,
                               [], []))
    openmpi = _by_name(doc)["openmpi"]
    spec = next(layer.spec for layer in stack.layers if layer.component == "openmpi")
    assert openmpi["version"] == "4.0.5"
    assert openmpi["hashes"] == [{"alg": "SHA-256", "content": spec["download"]["sha256"]}]
    assert openmpi["externalReferences"][0]["url"] == spec["download"]["url"]
    assert openmpi["externalReferences"][0]["type"] == "distribution"


def test_push_leaves_the_sbom_beside_the_image(docker_client, debian_chain, registry,
                                              state_dir):
    chain = debian_chain
    record_pass(chain.image_id, chain.stack, state_dir)
    result = publish.push_stack(docker_client, chain.layer_refs, chain.final_ref, chain.stack,
                                registry.host, "0123abc", state_dir=state_dir, log=lambda _: None)
    matrix = load_matrix(ROOT / "stacks.yaml")
    text = sbom.of_image(docker_client, matrix, matrix.stack("cpu-tcp"), chain.final_ref)
    ref = publish.push_sbom(docker_client, result, text, log=lambda _: None)
    digest = result.image_digest_uri.split("@")[1]
    assert ref == f"{registry.host}/{chain.repo}:sha256-{digest.split(':')[1]}.sbom"

    docker_client.images.remove(ref)  # from the registry, not the local copy
    repository, tag = ref.rsplit(":", 1)
    pulled = docker_client.images.pull(repository, tag=tag)
    container = docker_client.containers.create(pulled.id, ["none"],
                                                labels={"mnp-test": "1"})
    try:
        stream, _ = container.get_archive(f"/{publish.SBOM_FILE}")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(publish.SBOM_FILE)
            assert member is not None
            back = member.read().decode()
    finally:
        container.remove(force=True)
        docker_client.images.remove(ref)
    assert back == text
    doc = _valid(back)
    assert doc["metadata"]["component"]["version"] == chain.image_id
    debs = {c["name"] for c in doc["components"] if c["purl"].startswith("pkg:deb/debian/")}
    assert {"bash", "dpkg", "libc6"} <= debs
    assert pulled.labels["io.github.mnp-stacks.sbom.subject"] == result.image_digest_uri


def test_cpu_tcp_sbom_lists_what_the_image_holds(cpu_tcp_build, tmp_path):
    """`invoke sbom --stack cpu-tcp --output F` on the built stack."""
    import subprocess
    import sys

    out = tmp_path / "cpu-tcp.cdx.json"
    proc = subprocess.run([sys.executable, "-m", "invoke", "sbom", "--stack", "cpu-tcp",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    doc = _valid(out.read_text())
    components = _by_name(doc)
    # cpu-tcp's PyTorch is Debian's python3-torch 1.13.1, whose metadata says 1.13.0a0+gitunknown:
    # the document says what the image holds.
    assert components["torch"]["version"].startswith("1.13")
    assert components["python3-torch"]["purl"].startswith("pkg:deb/debian/python3-torch@1.13.1")
    assert components["mpi4py"]["version"] == "3.1.4"
    deepspeed = components["deepspeed"]
    assert deepspeed["version"] == "0.14.4"
    pin = load_matrix(ROOT / "stacks.yaml").stack("cpu-tcp").layers
    sha = next(layer.spec["pip"]["deepspeed"]["sha256"] for layer in pin
               if layer.component == "deepspeed")
    assert deepspeed["hashes"] == [{"alg": "SHA-256", "content": sha}]
    assert {"name": "mnp-stacks:built-from-source", "value": "sdist"} in deepspeed["properties"]
    assert components["openmpi-bin"]["purl"].startswith("pkg:deb/debian/openmpi-bin@4.1.4")
