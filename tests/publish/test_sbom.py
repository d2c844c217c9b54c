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


@pytest.mark.parametrize(("stack", "platform"), [("cpu-tcp-arm64", "linux/arm64"),
                                                  ("cpu-mpi", "linux/amd64")])
def test_the_sbom_says_the_platform_of_its_image(stack, platform):
    """One SBOM per platform image: each stack is one platform's, and its SBOM says which."""
    matrix = load_matrix(ROOT / "stacks.yaml")
    doc = _valid(sbom.document(matrix, matrix.stack(stack), f"mnp-stacks:{stack}",
                               "sha256:" + "0" * 64, [], []))
    properties = {p["name"]: p["value"] for p in doc["metadata"]["component"]["properties"]}
    assert properties["mnp-stacks:stack"] == stack
    assert properties["mnp-stacks:platform"] == platform


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


def _purls(document: dict) -> list[str]:
    """Every purl of the document, each parsed by packageurl-python (as scanners parse them) and
    written back unchanged: a purl it would rewrite is not in its canonical form."""
    from packageurl import PackageURL

    purls = [c["purl"] for c in document["components"] if "purl" in c]
    for purl in purls:
        assert PackageURL.from_string(purl).to_string() == purl, purl
    return purls


def _in_image(client, image: str, script: str) -> str:
    return client.containers.run(image, ["sh", "-c", script], entrypoint=[], remove=True,
                                 network_disabled=True, labels={"mnp-test": "1"}).decode()


def test_cpu_tcp_sbom_lists_what_the_image_holds(docker_client, cpu_tcp_build, tmp_path):
    """`invoke sbom --stack cpu-tcp --output F` on the built stack, held against the image's own
    dpkg database (dpkg-query, dpkg -S) and Python metadata (importlib.metadata), and against
    the entrypoint files the build copied in (issue 44)."""
    import hashlib
    import subprocess
    import sys

    from matrix.image.render import context_files

    result, _ = cpu_tcp_build
    image = result.chains["cpu-tcp"][-1]
    out = tmp_path / "cpu-tcp.cdx.json"
    proc = subprocess.run([sys.executable, "-m", "invoke", "sbom", "--stack", "cpu-tcp",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    doc = _valid(out.read_text())
    purls = _purls(doc)
    assert len(purls) == len(set(purls))  # one entry per installed thing
    # The document says which platform's image it describes (one per platform image).
    properties = {p["name"]: p["value"] for p in doc["metadata"]["component"]["properties"]}
    assert properties["mnp-stacks:platform"] == "linux/amd64"
    debs = {c["name"]: c for c in doc["components"] if c.get("purl", "").startswith("pkg:deb/")}
    pypi = {c["name"]: c for c in doc["components"] if c.get("purl", "").startswith("pkg:pypi/")}

    installed = _in_image(docker_client, image, "dpkg-query -W -f '${db:Status-Status} "
                                                "${Package}\\n'").split("\n")
    assert set(debs) == {line.split()[1] for line in installed if line.startswith("installed ")}

    # Every Python distribution a Debian package installed stays under that package's entry.
    owned = [line.split(": ", 1) for line in _in_image(
        docker_client, image, "dpkg -S '*.egg-info' '*.dist-info' 2>/dev/null").splitlines()]
    assert len(owned) >= 20  # Debian's numpy, torch, urllib3, ... (24 in the count)
    for package, path in owned:
        folder = path.rsplit("/", 1)[1]
        name = folder.split("-", 1)[0]
        assert sbom._pep503(name) not in {sbom._pep503(n) for n in pypi}, (package, path)
        provided = [p["value"] for p in debs[package].get("properties", [])
                    if p["name"] == "mnp-stacks:python-distribution"]
        assert any(value.endswith(f"({path})") for value in provided), (package, provided)
    assert "torch" not in pypi and "urllib3" not in pypi and "mpmath" not in pypi
    assert debs["python3-torch"]["purl"].startswith("pkg:deb/debian/python3-torch@1.13.1")
    assert {"name": "mnp-stacks:python-distribution", "value": "torch 1.13.0a0+gitunknown "
            "(/usr/lib/python3/dist-packages/torch-1.13.0a0+gitunknown.egg-info)"} in \
        debs["python3-torch"]["properties"]

    # The PyPI entries are the image's other distributions, at the versions installed.
    script = ("import json; from importlib import metadata; print(json.dumps(sorted("
              "[d.metadata['Name'], d.version] for d in metadata.distributions())))")
    versions = json.loads(_in_image(docker_client, image, f'python3 -c "{script}"'))
    for name, component in pypi.items():
        assert [name, component["version"]] in versions, name
        assert component["purl"] == f"pkg:pypi/{sbom.purl_pypi_name(name)}@{component['version']}"
    assert set(pypi) == {"deepspeed", "hjson", "ninja", "nvidia-ml-py"}
    deepspeed = pypi["deepspeed"]
    assert deepspeed["version"] == "0.14.4"
    pin = load_matrix(ROOT / "stacks.yaml").stack("cpu-tcp").layers
    sha = next(layer.spec["pip"]["deepspeed"]["sha256"] for layer in pin
               if layer.component == "deepspeed")
    assert deepspeed["hashes"] == [{"alg": "SHA-256", "content": sha}]
    assert {"name": "mnp-stacks:built-from-source", "value": "sdist"} in deepspeed["properties"]
    assert debs["openmpi-bin"]["purl"].startswith("pkg:deb/debian/openmpi-bin@4.1.4")

    # The entrypoint the stack builds itself: the files of its build context, as the image holds them.
    (entrypoint,) = [c for c in doc["components"] if c["name"] == "mnp-entrypoint"]
    copied = sorted((f.path[len("entrypoint/"):], hashlib.sha256(f.source.read_bytes()).hexdigest())
                    for f in context_files("entrypoint") if f.path.startswith("entrypoint/"))
    tree = hashlib.sha256("".join(f"{rel}\0{sha}\n" for rel, sha in copied).encode()).hexdigest()
    properties = {p["name"]: p["value"] for p in entrypoint["properties"]}
    assert properties["mnp-stacks:tree-sha256"].startswith(f"{tree} ({len(copied)} files of ")
    launcher = hashlib.sha256((ROOT / "images/entrypoint/mnp-entrypoint").read_bytes())
    assert properties["mnp-stacks:launcher-sha256"] == launcher.hexdigest()
    assert entrypoint["type"] == "application" and entrypoint["version"] == "0.1.0"


def test_pypi_purl_names_follow_the_purl_specification():
    """types/pypi-definition.json: lower case, ``_`` as ``-``; dots stay (PEP 503 would make
    zope.interface zope-interface: a name the purl specification does not write)."""
    matrix = load_matrix(ROOT / "stacks.yaml")
    dists = [sbom.Package("pypi", "zope.interface", "6.0"),
             sbom.Package("pypi", "Typing_Extensions", "4.7.1"),
             sbom.Package("pypi", "ruamel.yaml.clib", "0.2.8")]
    doc = _valid(sbom.document(matrix, matrix.stack("cpu-tcp"), "mnp-stacks:cpu-tcp",
                               "sha256:" + "0" * 64, [], dists))
    assert sorted(_purls(doc)) == ["pkg:pypi/ruamel.yaml.clib@0.2.8",
                                   "pkg:pypi/typing-extensions@4.7.1",
                                   "pkg:pypi/zope.interface@6.0"]


def test_a_distribution_debian_installed_is_listed_once_under_its_package():
    matrix = load_matrix(ROOT / "stacks.yaml")
    debs = [sbom.Package("deb", "python3-urllib3", "1.26.12-1+deb12u4", "all")]
    path = "/usr/lib/python3/dist-packages/urllib3-1.26.12.egg-info"
    dists = [sbom.Package("pypi", "urllib3", "1.26.12", path=path, owner="python3-urllib3"),
             # its owner is not installed (a stale file list): it stays a PyPI entry
             sbom.Package("pypi", "hjson", "3.1.0", owner="python3-hjson"),
             # the same distribution on two sys.path folders: one entry
             sbom.Package("pypi", "ninja", "1.11.1.1", path="/a/ninja-1.11.1.1.dist-info"),
             sbom.Package("pypi", "ninja", "1.11.1.1", path="/b/ninja-1.11.1.1.dist-info")]
    doc = _valid(sbom.document(matrix, matrix.stack("cpu-tcp"), "mnp-stacks:cpu-tcp",
                               "sha256:" + "0" * 64, debs, dists))
    assert sorted(_purls(doc)) == ["pkg:deb/debian/python3-urllib3@1.26.12-1%2Bdeb12u4?arch=all",
                                   "pkg:pypi/hjson@3.1.0", "pkg:pypi/ninja@1.11.1.1"]
    (deb,) = [c for c in doc["components"] if c["name"] == "python3-urllib3"]
    assert deb["properties"] == [{"name": "mnp-stacks:python-distribution",
                                  "value": f"urllib3 1.26.12 ({path})"}]


def test_sbom_output_to_a_folder_is_refused_before_anything_is_read(tmp_path):
    """As the job writers do (matrix/cli/output.py): exit 2, one line, no engine asked (none
    answers here) and nothing written."""
    import os
    import subprocess
    import sys

    from tests.helpers import one_line

    proc = subprocess.run([sys.executable, "-m", "invoke", "sbom", "--stack", "cpu-tcp",
                           "--output", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"},
                          timeout=120, check=False)
    line = one_line(proc, 2)
    assert f"--output {tmp_path}: a folder; give a file name, e.g. --output " \
           f"{tmp_path / 'cpu-tcp.cdx.json'}" in line
    assert list(tmp_path.iterdir()) == []
