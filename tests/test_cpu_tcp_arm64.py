"""The arm64 CPU stack built from nothing here under emulation (issue 45): its base bootstrapped
for arm64 with mmdebstrap under qemu-user-static and loaded with a config that says arm64, the
stack built and its layer tests run through `invoke build --test` (the user's path), the image's
config saying arm64, its binaries running as aarch64, and the entrypoint's dry run planning a
Batch main node on a Graviton EFA type.

Every RUN step runs under qemu: these tests are marked ``emulated``. `invoke check` runs them
with the rest of the suite (warm, the build is cached and they take seconds); on GitHub they run
in ci.yml's scheduled lane only (job emulated-arm64), beyond a pull request's budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from matrix.image.plan import plan
from matrix.model.instances import INSTANCE_TYPES
from matrix.model.loader import load_matrix
from tests.conftest import held

ROOT = Path(__file__).resolve().parent.parent
STACK = "cpu-tcp-arm64"
INSTANCE = "c7gn.16xlarge"
pytestmark = [pytest.mark.docker]
# A Batch main node of three (the variables AWS Batch sets on every node of a multi-node job).
BATCH_MAIN = {"AWS_BATCH_JOB_ID": "a1b2c3#0", "AWS_BATCH_JOB_NODE_INDEX": "0",
              "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "3"}


@pytest.fixture(scope="module")
def arm64_build(docker_client) -> str:
    """`invoke build --stack cpu-tcp-arm64 --test` from the project root: bootstraps the arm64
    base when it is missing, builds, runs every layer's tests; the final image's reference."""
    with held(f"build-{STACK}"):
        proc = subprocess.run([sys.executable, "-m", "invoke", "build", "--stack", STACK,
                               "--test"], cwd=ROOT, capture_output=True, text=True,
                              timeout=3600, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = plan(load_matrix(ROOT / "stacks.yaml"), [STACK])
    return result.chains[STACK][-1]


@pytest.mark.slow
@pytest.mark.emulated
def test_the_base_and_the_image_say_arm64(docker_client, arm64_build):
    base = load_matrix(ROOT / "stacks.yaml").stack(STACK).base
    for image in (base.image, arm64_build):
        attrs = docker_client.images.get(image).attrs
        assert (attrs["Os"], attrs["Architecture"], attrs.get("Variant")) == \
            ("linux", "arm64", "v8"), image


@pytest.mark.slow
@pytest.mark.emulated
def test_its_binaries_run_as_aarch64(docker_client, arm64_build):
    out = docker_client.containers.run(arm64_build, ["uname", "-m"], remove=True, entrypoint=[])
    assert out.decode().strip() == "aarch64"


@pytest.mark.slow
@pytest.mark.emulated
def test_lean_as_stacks_yaml_says_no_pip_and_no_ca_certificates(docker_client, arm64_build):
    """The base's `include: []` and the python layer's `options: {pip: false}` reach the image
    (dpkg's own record: each package's Status, or no line for one never installed, for which
    dpkg-query exits 1)."""
    query = "dpkg-query -W -f '${Package} ${Status}\\n' python3 ca-certificates python3-pip; true"
    out = docker_client.containers.run(arm64_build, ["sh", "-c", query], remove=True,
                                       entrypoint=[], stderr=False)
    installed = {line.split()[0] for line in out.decode().splitlines()
                 if line.endswith("install ok installed")}
    assert installed == {"python3"}, out.decode()


@pytest.mark.slow
@pytest.mark.emulated
def test_the_entrypoint_plans_a_batch_main_node_on_a_graviton_type(docker_client, arm64_build):
    # /dev/shm as the job definition sizes it for the type (the row's shm_mib): the health
    # gate checks it against the row; Docker's default 64 MiB would fail it.
    shm = INSTANCE_TYPES[INSTANCE].shm_mib
    argv = ["/usr/bin/docker", "run", "--rm", "--label", "mnp-test=1", f"--shm-size={shm}m",
            "-e", "MNP_DRY_RUN=1", "-e", f"MNP_INSTANCE_TYPE={INSTANCE}"]
    for key, value in BATCH_MAIN.items():
        argv += ["-e", f"{key}={value}"]
    proc = subprocess.run([*argv, arm64_build, "python3", "-c", "print(1)"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PROBLEM" not in proc.stdout, proc.stdout
    assert "role: main, node 0 of 3, main node index 0" in proc.stdout, proc.stdout
    assert "scheduler: batch (detected from AWS_BATCH_JOB_NODE_INDEX)" in proc.stdout
    assert f"MNP_INSTANCE_TYPE={INSTANCE}" in proc.stdout
    assert "command: /usr/bin/mpirun --allow-run-as-root -np 3 " in proc.stdout


@pytest.mark.slow
@pytest.mark.emulated
def test_its_sbom_says_arm64_and_lists_arm64_packages(arm64_build, tmp_path):
    """`invoke sbom` of the arm64 image: the document names its platform, and every Debian
    package's purl carries the architecture dpkg recorded (arm64, or all), none amd64."""
    out = tmp_path / "sbom.json"
    proc = subprocess.run([sys.executable, "-m", "invoke", "sbom", "--stack", STACK, "--output",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    properties = {p["name"]: p["value"] for p in doc["metadata"]["component"]["properties"]}
    assert properties["mnp-stacks:platform"] == "linux/arm64/v8"
    archs = {c["purl"].split("?arch=")[1].split("&")[0] for c in doc["components"]
             if c.get("purl", "").startswith("pkg:deb/")}
    assert archs == {"arm64", "all"}, archs
