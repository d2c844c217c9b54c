"""Mounts never hide the image (issue 42, point 3).

A ``--mount``/``--pvc`` container path that is, or holds, a folder the stack's image installs
into was accepted by jobdef, sbatch and k8s; the job then died on every node (``No module named
entrypoint``, or Docker's ``stat /usr/local/bin/mnp-entrypoint: no such file``). The folders are
derived from the stack's templates (``matrix.image.declared``): each case below goes through the
task a user runs, as a subprocess, with a pinned ``--image-uri`` and no engine, and must be one
line with exit 2 naming the folder, the layer that puts something there and a data path to use
instead. Data folders (``/fsx``, ``/data``, ``/scratch``) are accepted by every task.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrix.errors import UsageError
from matrix.jobs.mounts import DATA_PATHS, parse_all, refuse_image_folders
from tests.helpers import one_line, project_matrix

ROOT = Path(__file__).resolve().parents[2]
MATRIX = project_matrix()
STACK = "cpu-tcp"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu-tcp@sha256:" + "e" * 64
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "AWS_CONFIG_FILE": "/nonexistent",
             "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}
PAIR = ["--stack", STACK, "--nodes", "2", "--instance-type", "c5n.18xlarge", "--image-uri", IMAGE]
# (the task's words before the mount, the option, how a container path becomes its value)
TASKS = {
    "jobdef --mount": (["jobdef", *PAIR], "--mount", "/fsx:{}"),
    "sbatch --mount": (["sbatch", *PAIR], "--mount", "/fsx:{}"),
    "k8s --mount": (["k8s", "--kind", "pytorchjob", *PAIR], "--mount", "/fsx:{}"),
    "k8s --pvc": (["k8s", "--kind", "pytorchjob", *PAIR], "--pvc", "fsx-pvc:{}"),
    "run --mount": (["run", "--stack", STACK, "--nodes", "2"], "--mount", "/fsx:{}"),
}
SUGGESTION = "; mount the data at a folder of its own, e.g. /fsx, /data or /scratch"
# Each folder of the issue, the folder the refusal names and the component that puts something
# there (its version is read from stacks.yaml); / holds every one of them.
IMAGE_FOLDERS = [
    ("/opt", "holds /opt/mnp/lib,", "entrypoint"),
    ("/opt/mnp", "holds /opt/mnp/lib,", "entrypoint"),
    ("/usr", "holds /usr/local/bin,", "entrypoint"),
    ("/usr/local/bin", "is", "entrypoint"),
    ("/etc", "holds /etc/ssh,", "ssh"),
    ("/", "holds /opt/mnp/lib,", "entrypoint"),
]
# Folders filled at run time (the hand list these replace), with who fills them.
RUNTIME_FOLDERS = [
    ("/dev/shm", "is a folder the container runtime fills with the job's shared memory"),
    ("/root/.ssh", "is a folder the MPI operator fills with its SSH Secret"),
    ("/root", "holds /root/.ssh, a folder the MPI operator fills with its SSH Secret"),
]


def invoke(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE")}
    env.update(NO_ENGINE)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def with_mounts(task: str, *paths: str, host: str = "/fsx") -> list[str]:
    words, option, value = TASKS[task]
    given = [part for path in paths
             for part in (option, value.format(path).replace("/fsx:", f"{host}:", 1))]
    return [*words, *given, "--", "python3", "train.py"]


def version(component: str) -> str:
    layer = MATRIX.stack(STACK).layer(component)
    assert layer is not None, component
    return layer.version


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize(("path", "relation", "owner"), IMAGE_FOLDERS)
def test_a_mount_over_an_image_folder_is_one_line_naming_its_owner(task, path, relation, owner):
    _, option, value = TASKS[task]
    line = one_line(invoke(*with_mounts(task, path)), 2)
    assert line.startswith(
        f"error: {option} '{value.format(path)}': {path} {relation} a folder the image of stack "
        f"{STACK} installs into ({owner} {version(owner)} "), line
    assert line.endswith(f", which the mount would hide from the job{SUGGESTION}"), line


@pytest.mark.parametrize("task", ["jobdef --mount", "k8s --pvc", "run --mount"])
@pytest.mark.parametrize(("path", "words"), RUNTIME_FOLDERS)
def test_a_mount_over_a_folder_filled_at_run_time_is_one_line(task, path, words):
    _, option, value = TASKS[task]
    line = one_line(invoke(*with_mounts(task, path)), 2)
    assert line.startswith(f"error: {option} '{value.format(path)}': {path} {words}"), line
    assert line.endswith(SUGGESTION), line


@pytest.mark.parametrize("task", [task for task in TASKS if not task.startswith("run")])
def test_every_writer_accepts_the_data_folders(task):
    proc = invoke(*with_mounts(task, *DATA_PATHS))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    if task.startswith("jobdef"):
        node = json.loads(text)["nodeProperties"]["nodeRangeProperties"][0]["container"]
        mounted = [point["containerPath"] for point in node["mountPoints"]]
    elif task.startswith("sbatch"):
        mounted = [item.split(":")[1] for line in text.splitlines()
                   if "--container-mounts=" in line
                   for item in line.split("--container-mounts=")[1].split()[0].split(",")]
    else:
        manifest = yaml.safe_load(text)
        pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        mounted = [p["mountPath"] for p in pod["containers"][0]["volumeMounts"]]
    assert set(DATA_PATHS) <= set(mounted), mounted


def test_invoke_run_accepts_the_data_folders(tmp_path):
    """The rehearsal gets past every mount check to the engine (none answers here): the data
    folders are bound as given (tests/publish/test_mounts.py binds one on real containers)."""
    line = one_line(invoke(*with_mounts("run --mount", *DATA_PATHS, host=str(tmp_path))), 1)
    assert "--mount" not in line and "Docker engine" in line, line


def test_the_folders_come_from_each_stacks_templates():
    """Derived, not listed: Open MPI built from source goes where its options.prefix says
    (/opt/openmpi in cuda10.1-tcp); the Debian package of cpu-tcp leaves /opt/openmpi free. The
    data folders stay free in every stack of stacks.yaml."""
    mounts, _ = parse_all(["/fsx:/opt/openmpi"])
    with pytest.raises(UsageError, match=r"^--mount '/fsx:/opt/openmpi': /opt/openmpi holds "
                                         r"/opt/openmpi/bin, a folder the image of stack "
                                         r"cuda10.1-tcp installs into \(openmpi 4\.0\.5 "):
        refuse_image_folders(MATRIX, "cuda10.1-tcp", mounts)
    refuse_image_folders(MATRIX, STACK, mounts)
    data, claims = parse_all([f"/fsx:{path}" for path in DATA_PATHS], ["fsx-pvc:/shared"])
    for name in MATRIX.stacks:
        refuse_image_folders(MATRIX, name, data, claims)
        for path in ("/opt/mnp", "/usr/local/bin"):  # every image starts the job from there
            with pytest.raises(UsageError, match=r"\(entrypoint "):
                refuse_image_folders(MATRIX, name, parse_all([f"/fsx:{path}"])[0])
