"""An MPIJob worker as ``invoke k8s`` writes it serves SSH and runs nothing itself.

The generated workers get the job's command as ``args`` and the ``MNP_*`` settings, like every
other pod (matrix/jobs/k8s.py says why); the MPI operator adds ``K_MPI_JOB_ROLE=worker``
(kubeflow/mpi-operator pkg/controller/mpi_job_controller.go, the worker's env). The entrypoint
must then serve SSH for the launcher's ``mpirun`` and never run the command: a worker that ran
it would start a second copy of the training outside MPI on every node.

Here the worker's container is read from the manifest ``invoke k8s --kind mpijob`` writes, its
``args`` and ``env`` turned into what the container gets (the kubelet turns ``$$`` into ``$``),
and the entrypoint is run on them twice: its dry run (``MNP_DRY_RUN=json``), whose plan must say
worker and sshd, and its real start-up, with only the SSH server itself replaced (port 22 and a
host sshd are not the test's to take; the container test of the generated workers runs the real
one): the command, a program that leaves a file when it runs, must not have run, and the
entrypoint must have gone to serve SSH once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu@sha256:" + "c" * 64
OPERATOR_ENV = {"K_MPI_JOB_ROLE": "worker"}  # what the MPI operator adds to a worker pod
# The entrypoint with its SSH server replaced by a recorder (sys.argv[1]: the record file).
DRIVER = """
import json, sys
from entrypoint.run import main, worker

def serve(runner):
    with open(sys.argv[1], "a") as handle:
        handle.write(json.dumps({"mode": runner.cfg.mode, "command": runner.command}) + "\\n")
    return 0

worker.serve = serve
sys.exit(main.main(sys.argv[2:]))
"""


def kubelet(word: str) -> str:
    """What the container gets for an ``args``/``env`` value with no ``$(NAME)``: ``$$`` is ``$``."""
    return word.replace("$$", "$")


@pytest.fixture
def worker(tmp_path) -> dict:
    """The MPIJob's worker container from ``invoke k8s``, whose command leaves a marker."""
    marker = tmp_path / "the-command-ran"
    command = ["python3", "-c", f"open({str(marker)!r}, 'w').write('$HOME')"]
    target = tmp_path / "mpijob.yaml"
    proc = subprocess.run([sys.executable, "-m", "invoke", "k8s", "--kind", "mpijob", "--stack",
                           "cpu-tcp", "--nodes", "2", "--instance-type", "c5n.18xlarge",
                           "--image-uri", IMAGE, "--output", str(target), "--", *command],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(target.read_text(encoding="utf-8"))
    (container,) = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    args = [kubelet(word) for word in container["args"]]
    env = {item["name"]: kubelet(item["value"]) for item in container["env"]}
    assert args == command  # the command reaches the container word for word
    assert env["MNP_LAUNCHER"] == "mpirun"
    return {"args": args, "env": {**env, **OPERATOR_ENV}, "marker": marker}


def run_entrypoint(worker: dict, tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    record = tmp_path / "served.jsonl"
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    # The health gate measures this machine (a bare container's /dev/shm is 64 MiB, below
    # c5n.18xlarge's row), not the worker: the container test of the generated workers runs
    # it on the image; here it is off so the role's own decision is what is seen.
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT),
           "MNP_STATE_DIR": str(tmp_path / "state"), **worker["env"], "MNP_HEALTH": "off",
           **extra}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(record), *worker["args"]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    return proc, record


def test_the_dry_run_plans_a_worker_that_serves_ssh(worker, tmp_path):
    proc, record = run_entrypoint(worker, tmp_path, MNP_DRY_RUN="json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)
    assert plan["role"]["mode"] == "worker"
    assert "sshd: the launcher reaches this pod over SSH" in plan["role"]["lines"]
    assert plan["children"] == "none: the launcher reaches this pod over SSH"
    assert plan["problems"] == []
    # issue 43: the plan says what the worker really does (sshd), not the command it ignores
    assert plan["argv"] is None
    assert plan["launcher"]["serves"] == "sshd for the launcher; the container command is ignored"
    assert not record.exists() and not worker["marker"].exists()
    text, _ = run_entrypoint(worker, tmp_path, MNP_DRY_RUN="1")
    assert "command: none on this node (sshd for the launcher; the container command is " \
           "ignored)" in text.stdout.splitlines(), text.stdout
    assert "launcher: none on this node (the MPIJob launcher's mpirun reaches it over SSH)" in \
        text.stdout.splitlines(), text.stdout


def test_the_worker_serves_ssh_and_never_runs_the_command(worker, tmp_path):
    proc, record = run_entrypoint(worker, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not worker["marker"].exists(), "the MPIJob worker ran the job's command itself"
    served = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert served == [{"mode": "worker", "command": worker["args"]}], proc.stderr[-3000:]
