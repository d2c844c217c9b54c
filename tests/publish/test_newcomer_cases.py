"""What a new user ran into, each through the command they typed: options the Kubernetes writer
lacked, value mistakes that exited 1 instead of 2, a --help that described --attempts wrongly,
and `invoke run` suggesting a command its image does not have."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrix.jobs.explain import IMAGE_URI
from tests.helpers import one_line

ROOT = Path(__file__).resolve().parents[2]
JOB = ["--nodes", "2", "--instance-type", "c5n.18xlarge"]
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT,
                          env={**os.environ, **NO_ENGINE}, capture_output=True, text=True,
                          timeout=120, check=False)


def test_k8s_takes_launcher_name_and_namespace():
    proc = invoke("k8s", "--kind", "pytorchjob", *JOB, "--image-uri", IMAGE_URI, "--launcher",
                  "none", "--name", "bert-large", "--namespace", "training", "--",
                  "python3", "train.py")
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(proc.stdout)
    assert manifest["metadata"]["name"] == "bert-large"
    assert manifest["metadata"]["namespace"] == "training"
    (container,) = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"]
    assert {"name": "MNP_LAUNCHER", "value": "none"} in container["env"]


@pytest.mark.parametrize("args,words", [
    (["jobdef", *JOB, "--image-uri", "repo/x:latest"], "--image-uri 'repo/x:latest' has no digest"),
    (["jobdef", *JOB, "--image-uri", IMAGE_URI, "--secret-arn",
      "arn:aws:secretsmanager:us-east-1:123456789012:secret:mnp"],
     "--secret-arn needs --execution-role-arn"),
    (["k8s", "--kind", "pytorchjob", *JOB, "--image-uri", IMAGE_URI, "--name", "Bad_Name"],
     "--name 'Bad_Name': expected a DNS label"),
    (["run", "--nodes", "2", "--late-node", "5"], "--late-node 5: a node index from 0 to 1"),
    (["k8s", "--kind", "mpijob", *JOB, "--image-uri", IMAGE_URI, "--attempts", "2"],
     "--attempts 2: a mpijob cannot retry by exit code"),
    # what every node's entrypoint would refuse at start, said by the option that sets it
    (["k8s", "--kind", "pytorchjob", *JOB, "--image-uri", IMAGE_URI, "--launcher-args='"],
     "--launcher-args \"'\": cannot be split like a shell: No closing quotation"),
    (["sbatch", *JOB, "--launcher-args='"],
     "--launcher-args \"'\": cannot be split like a shell: No closing quotation"),
], ids=["image-uri-digest", "secret-without-role", "k8s-name", "late-node", "mpijob-attempts",
        "k8s-launcher-args-unsplittable", "sbatch-launcher-args-unsplittable"])
def test_a_value_found_wrong_after_parsing_is_usage_exit_2(args, words):
    line = one_line(invoke(*args, "--", "python3", "train.py"), 2)
    assert words in line, line


def test_k8s_help_says_what_attempts_does_for_each_kind():
    text = " ".join(invoke("--help", "k8s").stdout.split())
    assert "backoffLimit (N-1) x pods + 1" in text
    assert "a trainjob or mpijob takes only 1" in text


def test_run_suggests_a_command_every_image_has():
    """Its suggestion must run in the image: a program of Debian's Essential set."""
    from matrix.cli.deploy import RUN_EXAMPLE

    line = one_line(invoke("run", "--nodes", "3"), 2)
    assert line.endswith(f"invoke run --stack cpu-tcp --nodes 3 -- {RUN_EXAMPLE}"), line
    assert "/opt/mnp/examples" not in line
