"""The GitHub workflows: every test selected by some pull-request job, audited by zizmor,
schema-valid, and wired to the project's commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from matrix.cli import suite
from matrix.model.rules import known_runners
from tests import workflow_jobs
from tests.workflow_jobs import load_workflow

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
PINNED = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+(\.\d+)*$")


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def _step(name: str) -> list[str]:
    """The command ``invoke check`` runs for its step ``name``."""
    return dict(suite.static_steps())[name]


@pytest.fixture(scope="module")
def ci_selection():
    """What each pytest run of ci.yml selects, every collected test, and the tree's modules."""
    selected, everything = workflow_jobs.ci_collections()
    return selected, everything, workflow_jobs.tree_modules()


def test_every_test_module_is_selected_by_a_pull_request_job(ci_selection):
    """Every test runs in a pull request's job but the emulated arm64 build's (marker
    `emulated`), which only the scheduled lane runs there (and `invoke check` here)."""
    selected, everything, modules = ci_selection
    assert len(modules) > 80 and len(everything) > 1500  # the tree was really read
    pull_request = {run: nodes for run, nodes in selected.items() if not run.scheduled}
    tests, files = workflow_jobs.uncovered(pull_request, everything, modules)
    emulated = workflow_jobs.emulated_only(selected)
    assert emulated and emulated <= everything
    emulated_modules = {nodeid.split("::")[0] for nodeid in emulated}
    assert files <= emulated_modules, \
        f"test modules no job of ci.yml selects: {sorted(files - emulated_modules)}"
    assert tests == emulated, (f"{len(tests - emulated)} tests no job of ci.yml selects, e.g. "
                               f"{sorted(tests - emulated)[:5]}; pull requests run "
                               f"{sorted(emulated - tests)[:5]}")


def test_each_pytest_job_selects_tests_no_other_job_does(ci_selection):
    """Removing any one pull-request job (or matrix group) leaves tests unselected: the check
    above bites, and no job is dead weight."""
    selected, everything, modules = ci_selection
    pull_request = {run: nodes for run, nodes in selected.items() if not run.scheduled}
    labels = sorted(run.label for run in pull_request)
    assert {"unit", "docker-tests", "slow[slurm]", "slow[kubeflow-elastic]",
            "slow[entrypoint-clusters]", "slow[engine-faults]", "slow[cuda-tcp]",
            "slow[rest]"} <= set(labels), labels
    for removed in pull_request:
        rest = {run: nodes for run, nodes in pull_request.items() if run != removed}
        tests, _ = workflow_jobs.uncovered(rest, everything, modules)
        assert tests - workflow_jobs.emulated_only(selected), \
            f"without {removed.label} every test is still selected"
    without_slurm = {run: nodes for run, nodes in pull_request.items() if run.variant != "slurm"}
    _, files = workflow_jobs.uncovered(without_slurm, everything, modules)
    assert {"tests/integration/test_slurm_cluster.py",
            "tests/integration/test_slurm_entrypoint.py"} <= files


def test_every_check_step_fails_its_job_when_its_check_fails():
    """Each step of ci.yml that runs a check, run with its checks failing, fails; and nothing
    lets a failed step or job pass the run (continue-on-error, an if on a check step)."""
    found = workflow_jobs.gates(load_workflow(WORKFLOWS / "ci.yml"))
    labels = {gate.label for gate in found}
    assert {"unit: step 'python -m pytest -p tests.skip_ledger -n 4 --dist loadgroup "
            "--no-loadscope-reorder -m \"not docker and not slow\"'",
            "cpu-tcp: step 'invoke test --stack cpu-tcp'",
            "rendered: step 'No rendered file differs from the commit'"} <= labels, labels
    assert len([gate for gate in found if gate.job == "slow"]) == 6
    assert len([gate for gate in found if gate.job == "layers"]) == 6  # cpu-tcp-arm64 too
    not_gating = [f"{gate.label}: {gate.why_not}" for gate in found if gate.why_not]
    assert not not_gating, not_gating


@pytest.mark.parametrize("edit, why", [
    ("unit pytest || true", "python failed and the step still passed"),
    ("slow continue-on-error", "the job has continue-on-error: True"),
    ("cpu-tcp echo invoke test", "no check runs: the step passes without calling one"),
    ("lint ruff continue-on-error", "the step has continue-on-error: True"),
    ("unit pytest piped to tee", "python failed and the step still passed"),
])
def test_each_way_to_stop_a_check_gating_is_reported(edit, why):
    ci = load_workflow(WORKFLOWS / "ci.yml")
    jobs = ci["jobs"]
    unit_step = next(step for step in jobs["unit"]["steps"] if "pytest" in step.get("run", ""))
    if edit == "unit pytest || true":
        unit_step["run"] += " || true"
    elif edit == "unit pytest piped to tee":  # bash -e without pipefail: tee's 0 wins
        unit_step["run"] += " | tee /dev/null"
    elif edit == "slow continue-on-error":
        jobs["slow"]["continue-on-error"] = True
    elif edit == "cpu-tcp echo invoke test":
        step = next(step for step in jobs["cpu-tcp"]["steps"] if "invoke test" in step.get("run", ""))
        step["run"] = "echo " + step["run"]
    else:
        step = next(step for step in jobs["lint"]["steps"] if step.get("run") == "ruff check .")
        step["continue-on-error"] = True
    not_gating = [gate for gate in workflow_jobs.gates(ci) if gate.why_not]
    assert not_gating and all(gate.why_not == why for gate in not_gating), not_gating


def test_every_pytest_run_of_every_workflow_loads_the_skip_ledger():
    """An undeclared skip (a tool missing on the runner) fails the job, as under invoke check."""
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for run in workflow_jobs.pytest_runs(load_workflow(path)):
            pairs = list(zip(run.args, run.args[1:]))
            assert ("-p", "tests.skip_ledger") in pairs, f"{path.name} {run.label}: {run.args}"


def test_the_full_fuzz_runs_on_the_schedule_only():
    ci = load_workflow(WORKFLOWS / "ci.yml")
    assert ci["on"]["schedule"] and ci["jobs"]["fuzz-full"]["env"]["MNP_FUZZ_EXAMPLES"] == "10000"
    assert "fuzz-full" not in workflow_jobs.pull_request_jobs(ci)["jobs"]
    (run,) = workflow_jobs.pytest_runs({"jobs": {"f": ci["jobs"]["fuzz-full"]}})
    assert "tests/test_malformed.py" in run.args


def test_the_emulated_arm64_build_runs_on_the_schedule_only_with_emulation():
    ci = load_workflow(WORKFLOWS / "ci.yml")
    job = ci["jobs"]["emulated-arm64"]
    assert "emulated-arm64" not in workflow_jobs.pull_request_jobs(ci)["jobs"]
    assert "permissions" not in job and ci["permissions"] == {"contents": "read"}
    for tool in ("qemu-user-static", "binfmt-support", "arch-test", "mmdebstrap"):
        assert tool in _runs(job), tool
    (run,) = workflow_jobs.pytest_runs({"jobs": {"e": job}})
    assert "tests/test_cpu_tcp_arm64.py" in run.args and "emulated" in run.args


def test_the_slow_groups_run_on_pull_requests_as_root_with_their_tools():
    ci = load_workflow(WORKFLOWS / "ci.yml")
    assert "pull_request" in ci["on"]
    slow = ci["jobs"]["slow"]
    assert "needs" not in slow and "if" not in slow  # side by side, from the first minute
    assert slow["strategy"]["fail-fast"] is False
    assert slow["timeout-minutes"] <= 45  # the budget the header states
    runs = _runs(slow)
    assert "sudo --preserve-env" in runs  # engine restart and mmdebstrap need root
    for tool in ("docker-registry", "mmdebstrap", "debian-archive-keyring", "slurm-client"):
        assert tool in runs
    assert "docker pull debian:bookworm" in runs


def test_a_workflow_reader_that_cannot_follow_a_step_says_so(tmp_path):
    workflow = {"jobs": {"odd": {"steps": [{"name": "t", "run": "make test-prep && pytest -x"}]}}}
    with pytest.raises(AssertionError, match="job odd .*step 't'.*cannot be followed"):
        workflow_jobs.pytest_runs(workflow)
    workflow = {"jobs": {"m": {"strategy": {"matrix": {"include": [{"group": "a", "p": "-x"}]}},
                               "steps": [{"env": {"A": "${{ matrix.p }}"},
                                          "run": 'python -m pytest $A "tests/x y.py"'}]}}}
    (run,) = workflow_jobs.pytest_runs(workflow)
    assert (run.label, run.args) == ("m[a]", ("-x", "tests/x y.py"))


def test_workflows_pass_the_github_workflow_schema():
    command = _step("workflow schema")
    assert sorted(Path(arg).name for arg in command if arg.endswith(".yml")) == [
        "ci.yml", "publish.yml", "rebuild.yml"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflows_pass_zizmor_and_it_catches_an_unpinned_action(tmp_path):
    command = _step("zizmor")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    ci = tmp_path / "ci.yml"
    text = (WORKFLOWS / "ci.yml").read_text(encoding="utf-8")
    ci.write_text(re.sub(r"actions/checkout@[0-9a-f]{40} # v[\d.]+", "actions/checkout@v4", text),
                  encoding="utf-8")
    broken = subprocess.run([*command[:-1], str(ci)], capture_output=True, text=True, check=False)
    assert broken.returncode != 0 and "unpinned-uses" in broken.stdout + broken.stderr


def test_every_action_is_pinned_to_a_commit_with_its_tag_beside_it():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if "uses:" in line:
                reference = line.split("uses:", 1)[1].strip()
                assert PINNED.match(reference), f"{path.name}: {line.strip()}"


def test_ci_runs_on_pull_requests_and_covers_the_checks():
    ci = load_workflow(WORKFLOWS / "ci.yml")
    assert {"pull_request", "push"} <= set(ci["on"])
    everything = "\n".join(_runs(job) for job in ci["jobs"].values())
    assert "invoke lint" in everything
    assert "zizmor --offline" in everything
    assert "check-jsonschema --builtin-schema vendor.github-workflows" in everything
    assert "invoke render --all" in everything and "git status --porcelain" in everything
    assert "invoke build --stack cpu-tcp" in everything
    assert "invoke test --stack cpu-tcp" in everything
    assert "docker-registry" in everything
    for job in ci["jobs"].values():  # every job installs the hashed pins (issue 34), then us
        assert ("pip install --require-hashes -r requirements/ci-dev.txt && "
                "pip install --no-deps -e .") in _runs(job)


def test_publish_matrix_from_invoke_and_oidc_to_ecr():
    publish = load_workflow(WORKFLOWS / "publish.yml")
    assert publish["on"]["workflow_run"]["branches"] == ["main"]  # after CI passed (issue 34)
    matrix_job, publish_job = publish["jobs"]["matrix"], publish["jobs"]["publish"]
    assert "invoke matrix" in _runs(matrix_job)
    assert matrix_job["outputs"]["matrix"] == "${{ steps.matrix.outputs.matrix }}"
    assert publish_job["needs"] == "matrix"
    assert publish_job["strategy"]["matrix"] == "${{ fromJson(needs.matrix.outputs.matrix) }}"
    assert publish_job["permissions"]["id-token"] == "write"
    (aws,) = [
        step
        for step in publish_job["steps"]
        if step.get("uses", "").startswith("aws-actions/configure-aws-credentials@")
    ]
    assert aws["with"]["role-to-assume"] == "${{ vars.AWS_ROLE_ARN }}"
    assert publish_job["env"]["REGISTRY"].startswith("${{ vars.")
    runs = _runs(publish_job)
    order = [runs.index(f"invoke {verb} --stack") for verb in ("build", "test", "push")]
    assert order == sorted(order)
    assert '--registry "$REGISTRY"' in runs
    # No AWS secrets: credentials come only from the OIDC role.
    assert "secrets." not in (WORKFLOWS / "publish.yml").read_text(encoding="utf-8")


def test_publish_runs_each_stack_natively_on_the_runner_of_its_platform():
    """publish.yml and rebuild.yml build, test and push each stack on the runner `invoke matrix`
    names, whose architecture (rule class ci-runner-platform) is the stack's platform: the arm64
    stacks on GitHub's arm64 runner, with no emulation step anywhere in the job."""
    for path, name in (("publish.yml", "publish"), ("rebuild.yml", "rebuild")):
        job = load_workflow(WORKFLOWS / path)["jobs"][name]
        assert job["runs-on"] == "${{ matrix.runner }}", path
        assert "qemu" not in _runs(job) and "binfmt" not in _runs(job), path
    proc = subprocess.run([sys.executable, "-m", "invoke", "matrix"], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, check=False,
                          env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 0, proc.stderr
    include = json.loads(proc.stdout)["include"]
    runners = known_runners()
    assert {entry["stack"]: runners[entry["runner"]] for entry in include} == \
        {entry["stack"]: entry["platform"].split("/")[1] for entry in include}
    assert {entry["stack"]: entry["runner"] for entry in include
            if entry["platform"] == "linux/arm64"} == {"cpu-tcp-arm64": "ubuntu-24.04-arm",
                                                       "cuda13.2-tcp-arm64": "ubuntu-24.04-arm",
                                                       "cuda13.2-efa-arm64": "ubuntu-24.04-arm"}


def test_pull_requests_build_the_arm64_cpu_stack_on_the_arm64_runner():
    layers = load_workflow(WORKFLOWS / "ci.yml")["jobs"]["layers"]
    assert layers["runs-on"] == "${{ matrix.runner || 'ubuntu-24.04' }}"
    include = layers["strategy"]["matrix"]["include"]
    assert {"stacks": "cpu-tcp-arm64", "runner": "ubuntu-24.04-arm"} in include
    # every job of every workflow runs on a runner whose architecture the rules know
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for name, job in load_workflow(path)["jobs"].items():
            label = job["runs-on"]
            if "${{" not in label:
                assert label in known_runners(), (path.name, name, label)
    for entry in include:
        assert entry.get("runner", "ubuntu-24.04") in known_runners(), entry
