"""Issue 24: the job writers wire each scheduler's retry to the entrypoint's failure classes.

Batch: ``retryStrategy.evaluateOnExit`` is checked with botocore's own model, then evaluated the
way Batch documents it (each rule's globs must all match; the first matching rule decides; no
match means RETRY), against the codes the entrypoint really exits with. PyTorchJob: the
``ExitCode`` policy with the training-operator's rule (``IsRetryableExitCode``: code >= 128), and
the manifests checked strictly against the vendored CRDs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import botocore.session
import pytest
import yaml
from botocore.validate import validate_parameters

from entrypoint.core import errors
from matrix.errors import UserError
from matrix.jobs import crds
from matrix.jobs.jobdef import HOST_FAILURE_REASON, retry_strategy
from matrix.jobs.k8s import KINDS
from matrix.jobs.spec import DEFAULT_ATTEMPTS
from tests.helpers import one_line, project_matrix, written, written_for_pair

ROOT = Path(__file__).resolve().parents[2]
MATRIX = project_matrix()
PAIRS = [(name, instance) for name, stack in MATRIX.stacks.items() for instance in stack.instances]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/x@sha256:" + "c" * 64
REGISTER = botocore.session.get_session().get_service_model("batch").operation_model(
    "RegisterJobDefinition").input_shape
HOST_GONE = "Host EC2 (instance i-0123456789abcdef0) terminated."
ESSENTIAL = "Essential container in task exited"
COMMAND = ["python3", "t.py"]


def batch_action(strategy: dict, exit_code: int | None, status_reason: str = ESSENTIAL,
                 reason: str = "") -> str:
    """What Batch does after an attempt: the first rule whose globs all match decides; none
    matching means RETRY (API_EvaluateOnExit.html). ``EXIT`` once the attempts are spent is
    Batch's own count, not modelled here."""
    for rule in strategy.get("evaluateOnExit", []):
        code = "" if exit_code is None else str(exit_code)
        if all(fnmatchcase(value, rule[key]) for key, value in (
                ("onExitCode", code), ("onStatusReason", status_reason), ("onReason", reason))
               if key in rule):
            return rule["action"]
    return "RETRY"


@pytest.mark.parametrize(("stack", "instance_type"), PAIRS, ids=[f"{s}@{i}" for s, i in PAIRS])
def test_every_declared_pair_gets_a_valid_retry_strategy(stack, instance_type):
    definition = written_for_pair("jobdef", "--stack", stack, "--nodes", "2", "--instance-type",
                                  instance_type, "--image-uri", IMAGE, command=COMMAND)
    validate_parameters(definition, REGISTER)
    strategy = definition["retryStrategy"]
    assert strategy["attempts"] == DEFAULT_ATTEMPTS
    assert batch_action(strategy, errors.INFRASTRUCTURE_EXIT) == "RETRY"
    assert batch_action(strategy, None, HOST_GONE) == "RETRY"
    for code in (1, 3, errors.CONFIGURATION_EXIT, 127, 137, errors.signal_exit(15), 255):
        assert batch_action(strategy, code) == "EXIT", code
    assert batch_action(strategy, 2000) == "EXIT"  # the glob is the whole code


def test_without_the_last_rule_batch_would_retry_a_bug():
    strategy = retry_strategy(3)
    assert batch_action(strategy, 3) == "EXIT"
    strategy["evaluateOnExit"].pop()  # the catch-all EXIT
    assert batch_action(strategy, 3) == "RETRY"  # the test can tell


def test_the_retry_rules_use_the_entrypoints_code_and_batchs_host_reason():
    rules = retry_strategy(4)["evaluateOnExit"]
    assert rules[0] == {"onExitCode": str(errors.INFRASTRUCTURE_EXIT), "action": "RETRY"}
    assert rules[1] == {"onStatusReason": HOST_FAILURE_REASON, "action": "RETRY"}
    assert retry_strategy(1) == {"attempts": 1}
    with pytest.raises(UserError, match="--attempts 11: Batch runs a job 1 to 10 times"):
        retry_strategy(11)


NO_AWS = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "AWS_CONFIG_FILE": "/nonexistent",
          "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}
PAIR = ["--stack", "cpu-tcp", "--nodes", "2", "--instance-type", "c5n.18xlarge", "--image-uri",
        IMAGE]


def task(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", name, *args, "--", "python3", "t.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **NO_AWS}, check=False)


def test_jobdef_attempts_option(tmp_path):
    target = tmp_path / "jd.json"
    proc = task("jobdef", *PAIR, "--attempts", "4", "--output", str(target))
    assert proc.returncode == 0, proc.stderr
    definition = json.loads(target.read_text())
    validate_parameters(definition, REGISTER)
    assert definition["retryStrategy"]["attempts"] == 4
    for given in ("0", "11"):
        assert f"--attempts {given}: expected a whole number from 1 to 10" in one_line(
            task("jobdef", *PAIR, "--attempts", given), 2)


# -- Kubernetes ------------------------------------------------------------------------------------

def operator_runs(manifest: dict, code: int) -> int:
    """How many times the training-operator runs a PyTorchJob whose every pod fails with
    ``code`` on every run, played from its source (kubeflow/training-operator at commit
    7c7aa9911c73efdab8a33281c58af51c69861678):

    - pkg/core/pod.go SetRestartPolicy: the pod's restartPolicy is the replica's, ``ExitCode``
      becoming ``Never``;
    - pod restartPolicy ``OnFailure``: the kubelet restarts the container in place, RestartCount
      + 1, and the pod stays Running;
    - pkg/controller.v1/common/pod.go ReconcilePods: a Failed pod of an ``ExitCode`` replica with
      a code >= 128 (pkg/util/train/train_util.go IsRetryableExitCode) is deleted and recreated
      (its containers start at RestartCount 0); any other Failed pod fails the job;
    - pkg/core/job.go PastBackoffLimit: the job fails once the RestartCount summed over its
      Running pods is >= backoffLimit (> 0 when backoffLimit is 0).

    Stops at 100 runs: a policy the operator never bounds."""
    spec = manifest["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    limit = spec["runPolicy"]["backoffLimit"]
    policies = {r["restartPolicy"] for r in replicas.values()}
    (policy,) = policies
    pods = sum(r["replicas"] for r in replicas.values())
    restarts = 0
    for run in range(1, 101):
        # every pod of this run fails with ``code``
        if policy == "OnFailure":
            restarts += pods
            past = restarts > 0 if limit == 0 else restarts >= limit
            if past:
                return run
        elif policy == "ExitCode" and code >= 128:
            continue  # recreated: RestartCount starts again at 0, never counted
        else:
            return run  # Never, or ExitCode with 1-127: the job fails
    return 100


@pytest.mark.parametrize(("stack", "instance_type"), PAIRS, ids=[f"{s}@{i}" for s, i in PAIRS])
def test_every_pytorchjob_runs_at_most_its_attempts(stack, instance_type):
    """Issue 32: with ExitCode the operator recreated a pod that ended 137 or 139 without end."""
    for elastic in ((), ("--elastic", "1:4")):
        for attempts in (1, 3):
            try:
                manifest = written_for_pair(
                    "k8s", "--kind", "pytorchjob", "--stack", stack, "--nodes", "2",
                    "--instance-type", instance_type, "--image-uri", IMAGE, "--attempts",
                    str(attempts), *elastic, command=COMMAND)
            except UserError as refusal:
                # a stack without PyTorch: only torchrun joins an elastic job's rendezvous
                assert elastic and "only --launcher torchrun joins it" in str(refusal), refusal
                continue
            assert crds.errors(manifest) == []  # strictly, against the vendored CRD
            for code in (errors.INFRASTRUCTURE_EXIT, 137, 139, errors.CONFIGURATION_EXIT, 3):
                assert operator_runs(manifest, code) == attempts, (attempts, code)


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"pytorchjob"}))
def test_kinds_without_an_exit_code_policy_do_not_retry_and_refuse_attempts(tmp_path, kind):
    manifest = written("k8s", "--kind", kind, *PAIR, command=COMMAND)
    assert crds.errors(manifest) == []
    if kind == "mpijob":
        assert manifest["spec"]["runPolicy"]["backoffLimit"] == 0
        launcher = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]
        assert launcher["restartPolicy"] == "Never"
    line = one_line(task("k8s", "--kind", kind, *PAIR, "--attempts", "3"), 2)
    assert f"--attempts 3: a {kind} cannot retry by exit code" in line
    proc = task("k8s", "--kind", kind, *PAIR, "--attempts", "1", "--output",
                str(tmp_path / "m.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert crds.errors(yaml.safe_load((tmp_path / "m.yaml").read_text())) == []


def test_k8s_attempts_option_sets_backoff_limit(tmp_path):
    target = tmp_path / "pj.yaml"
    proc = task("k8s", "--kind", "pytorchjob", *PAIR, "--attempts", "5", "--output", str(target))
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(target.read_text())
    assert crds.errors(manifest) == []
    # OnFailure: (5 - 1) restarts of each of the job's pods, then the fifth failure ends it
    pods = sum(r["replicas"] for r in manifest["spec"]["pytorchReplicaSpecs"].values())
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 4 * pods + 1
    assert operator_runs(manifest, 137) == 5
    once = tmp_path / "pj1.yaml"
    proc = task("k8s", "--kind", "pytorchjob", *PAIR, "--attempts", "1", "--output", str(once))
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(once.read_text())
    assert {r["restartPolicy"] for r in manifest["spec"]["pytorchReplicaSpecs"].values()} == \
        {"Never"}
    assert operator_runs(manifest, 137) == 1
