"""``--mount HOST_PATH:CONTAINER_PATH[:ro]``: one option, the same data paths under every scheduler.

The job definition's ``volumes``/``mountPoints`` are checked against botocore's Batch model; the
rehearsal (`invoke run --mount`) binds the same folder into real containers of the cpu-tcp image,
where the job's command reads a file from it on every node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import botocore.session
import pytest
import yaml
from botocore.validate import validate_parameters

from matrix.errors import UsageError, UserError
from matrix.jobs.jobdef import validate_job_definition
from matrix.jobs.mounts import (
    Claim,
    Mount,
    batch_volumes,
    docker_binds,
    parse_all,
    parse_claim,
    parse_mount,
    pyxis_mounts,
)
from tests.helpers import written

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu-tcp@sha256:" + "d" * 64
PAIR = ("--stack", "cpu-tcp", "--nodes", "2", "--instance-type", "c5n.18xlarge", "--image-uri",
        IMAGE)
MOUNTS = ("--mount", "/fsx:/fsx", "--mount", "/fsx/ds:/data:ro")
REGISTER = botocore.session.get_session().get_service_model("batch").operation_model(
    "RegisterJobDefinition").input_shape


@pytest.mark.parametrize(("text", "mount"), [
    ("/fsx:/fsx", Mount("/fsx", "/fsx")),
    ("/fsx/data:/data:ro", Mount("/fsx/data", "/data", read_only=True)),
    ("/fsx:/fsx:rw", Mount("/fsx", "/fsx")),
    ("/a/./b/:/data//x/", Mount("/a/b", "/data/x")),  # normalised, as the kernel sees them
])
def test_good_mounts(text, mount):
    assert parse_mount(text) == mount


@pytest.mark.parametrize(("text", "words"), [
    ("/fsx", "expected HOST_PATH:CONTAINER_PATH[:ro]"),
    ("/a:/b:ro:x", "expected HOST_PATH:CONTAINER_PATH[:ro]"),
    (":/fsx", "expected HOST_PATH:CONTAINER_PATH[:ro]"),
    ("fsx:/fsx", "HOST_PATH 'fsx' must be an absolute path"),
    ("/fsx:data", "CONTAINER_PATH 'data' must be an absolute path"),
    ("/fsx:/fsx:readonly", "the third field must be ro or rw, not 'readonly'"),
    ("/:/fsx", "HOST_PATH may not be /"),
    ("/a,b:/x", "may not hold ',', ':'"),
    ("/fsx:/dev/shm", "/dev/shm is a folder the container runtime fills with the job's shared "
                      "memory"),
    ("/keys:/root/.ssh/x", "is under /root/.ssh, a folder the MPI operator fills"),
    ("/h:/etc/mpi", "/etc/mpi is a folder the MPI operator fills with the launcher's hostfile"),
])
def test_bad_mounts_are_one_line(text, words):
    with pytest.raises(UsageError) as failure:
        parse_mount(text)
    message = str(failure.value)
    assert message.startswith(f"--mount {text!r}: ") and words in message
    assert "\n" not in message


def test_claims_and_duplicates():
    assert parse_claim("fsx-pvc:/fsx") == Claim("fsx-pvc", "/fsx")
    assert parse_claim("fsx.claim-1:/data:ro") == Claim("fsx.claim-1", "/data", read_only=True)
    for text, words in (("FSX:/fsx", "not a Kubernetes claim name"),
                        ("fsx-pvc", "expected CLAIM:PATH"), ("fsx-pvc:rel", "absolute path")):
        with pytest.raises(UsageError, match=words):
            parse_claim(text)
    with pytest.raises(UsageError, match=r"--mount '/b:/x/': /x is already mounted by "
                                         r"--mount '/a:/x'"):
        parse_all(["/a:/x", "/b:/x/"])


def test_one_mount_reads_the_same_under_every_scheduler():
    mounts, claims = parse_all(["/fsx:/fsx", "/fsx/ds:/data:ro"], ["fsx-pvc:/shared"])
    volumes, points = batch_volumes(mounts)
    assert volumes == [{"name": "mount-0", "host": {"sourcePath": "/fsx"}},
                       {"name": "mount-1", "host": {"sourcePath": "/fsx/ds"}}]
    assert points == [{"sourceVolume": "mount-0", "containerPath": "/fsx", "readOnly": False},
                      {"sourceVolume": "mount-1", "containerPath": "/data", "readOnly": True}]
    assert pyxis_mounts(mounts) == "/fsx:/fsx,/fsx/ds:/data:ro"
    assert docker_binds(mounts) == {"/fsx": {"bind": "/fsx", "mode": "rw"},
                                    "/fsx/ds": {"bind": "/data", "mode": "ro"}}
    # what the tasks write for the same --mount words
    script = written("sbatch", *PAIR, *MOUNTS, command=["true"])
    assert "--container-mounts=/fsx:/fsx,/fsx/ds:/data:ro" in script
    manifest = written("k8s", "--kind", "mpijob", *PAIR, *MOUNTS, "--pvc", "fsx-pvc:/shared",
                       command=["true"])
    pod = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {"name": "mount-1", "hostPath": {"path": "/fsx/ds", "type": "Directory"}} in pod["volumes"]
    assert {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "fsx-pvc",
                                                       "readOnly": False}} in pod["volumes"]
    mounted = {p["mountPath"]: p.get("readOnly") for p in pod["containers"][0]["volumeMounts"]}
    assert mounted == {"/dev/shm": None, "/fsx": False, "/data": True, "/shared": False}


def test_job_definition_mounts_validate_against_the_batch_model():
    definition = written("jobdef", *PAIR, *MOUNTS, command=["python3", "/fsx/train.py"])
    validate_parameters(definition, REGISTER)  # botocore's own check, raises on a mismatch
    container = definition["nodeProperties"]["nodeRangeProperties"][0]["container"]
    assert container["volumes"][1] == {"name": "mount-1", "host": {"sourcePath": "/fsx/ds"}}
    assert container["mountPoints"][1] == {"sourceVolume": "mount-1", "containerPath": "/data",
                                           "readOnly": True}
    # the model catches a malformed volume: the check is not a formality
    container["mountPoints"][0]["readOnly"] = "yes"
    with pytest.raises(UserError, match="mountPoints"):
        validate_job_definition(definition)


def test_invoke_jobdef_takes_mount(tmp_path):
    target = tmp_path / "job.json"
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "jobdef", "--stack", "cpu-tcp", "--nodes", "2",
         "--instance-type", "c5n.18xlarge", "--image-uri", IMAGE, "--mount", "/fsx:/fsx",
         "--mount", "/fsx/ds:/data:ro", "--output", str(target), "--", "python3", "t.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 0, proc.stderr
    definition = json.loads(target.read_text())
    validate_parameters(definition, REGISTER)
    container = definition["nodeProperties"]["nodeRangeProperties"][0]["container"]
    assert [p["containerPath"] for p in container["mountPoints"]] == ["/fsx", "/data"]
    bad = subprocess.run(
        [sys.executable, "-m", "invoke", "jobdef", "--stack", "cpu-tcp", "--nodes", "2",
         "--instance-type", "c5n.18xlarge", "--image-uri", IMAGE, "--mount", "fsx:/fsx",
         "--", "true"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --mount 'fsx:/fsx': HOST_PATH 'fsx' must be an absolute path "
        "(e.g. --mount /fsx:/fsx)"]


def test_the_k8s_yaml_keeps_the_mounts(tmp_path):
    target = tmp_path / "job.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "k8s", "--kind", "trainjob", "--stack", "cpu-tcp",
         "--nodes", "2", "--instance-type", "c5n.18xlarge", "--image-uri", IMAGE,
         "--mount", "/fsx:/fsx:ro", "--pvc", "fsx-pvc:/shared", "--output", str(target),
         "--", "python3", "t.py"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False, env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 0, proc.stderr
    patch = yaml.safe_load(target.read_text())["spec"]["runtimePatches"][0]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
        "spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "mount-0", "pvc-0"]
    assert pod["containers"][0]["volumeMounts"][1] == {"name": "mount-0", "mountPath": "/fsx",
                                                       "readOnly": True}


# --- the rehearsal reads the same data paths -----------------------------------------------------

READER = ("import errno, socket\n"
          "data = open('/data/input.txt').read().strip()\n"
          "try:\n    open('/data/written', 'w')\n    mode = 'rw'\n"
          "except OSError as exc:\n    mode = 'ro' if exc.errno == errno.EROFS else str(exc)\n"
          "print('read', data, 'on', socket.gethostname(), mode, flush=True)\n")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.docker
@pytest.mark.slow
def test_invoke_run_binds_the_mount_on_every_node(cpu_tcp_image, tmp_path):
    data = tmp_path / "dataset"
    data.mkdir()
    token = os.urandom(6).hex()
    (data / "input.txt").write_text(token + "\n")
    command = ["python3", "-c", READER]
    proc = run_cli("--stack", "cpu-tcp", "--nodes", "2", "--mount", f"{data}:/data:ro", "--",
                   *command)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:])
    # each rank's line as it printed it (with MNP_TAG_OUTPUT=1 mpirun would prefix [1,0]<stdout>:)
    reads = set(re.findall(rf"read {token} on (node\d+) ro$", proc.stdout, re.MULTILINE))
    assert reads == {"node0", "node1"}, proc.stdout[-3000:]
    assert not (data / "written").exists()
    # without the mount the same command has nothing to read: the job fails
    proc = run_cli("--stack", "cpu-tcp", "--nodes", "2", "--", *command)
    assert proc.returncode != 0 and "input.txt" in proc.stdout + proc.stderr


def test_invoke_run_refuses_a_missing_host_folder_and_a_bad_mount(tmp_path):
    missing = tmp_path / "nope"
    proc = run_cli("--stack", "cpu-tcp", "--nodes", "2", "--mount", f"{missing}:/data", "--",
                   "true")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: --mount {missing}:/data: no folder {missing} on this machine (a rehearsal "
        "binds the host folder the job reads)"]
    proc = run_cli("--stack", "cpu-tcp", "--mount", "data:/data", "--", "true")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --mount 'data:/data': HOST_PATH 'data' must be an absolute path "
        "(e.g. --mount /fsx:/fsx)"]
