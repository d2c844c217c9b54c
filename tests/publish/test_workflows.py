"""The GitHub workflows: schema-valid, and wired to the project's commands."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _check_jsonschema() -> str:
    beside_python = Path(sys.executable).with_name("check-jsonschema")
    found = str(beside_python) if beside_python.exists() else shutil.which("check-jsonschema")
    if not found:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[dev]')")
    return found


def _load(name: str) -> dict:
    # PyYAML reads the `on:` key as True (YAML 1.1); GitHub reads it as "on".
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))
    return data


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_workflows_pass_the_github_workflow_schema():
    files = sorted(str(path) for path in WORKFLOWS.glob("*.yml"))
    assert [Path(f).name for f in files] == ["ci.yml", "publish.yml"]
    result = subprocess.run(
        [_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_runs_on_pull_requests_and_covers_the_checks():
    ci = _load("ci.yml")
    assert {"pull_request", "push"} <= set(ci["on"])
    runs = {name: _runs(job) for name, job in ci["jobs"].items()}
    everything = "\n".join(runs.values())
    assert "invoke lint" in everything
    assert "pytest" in everything
    assert "invoke render --all" in everything and "git status --porcelain" in everything
    assert "invoke build --stack cpu-tcp" in everything
    assert "invoke test --stack cpu-tcp" in everything
    assert "docker-registry" in everything
    for job in ci["jobs"].values():
        assert "pip install -e '.[dev]'" in _runs(job)


def test_publish_matrix_from_invoke_and_oidc_to_ecr():
    publish = _load("publish.yml")
    assert publish["on"]["push"]["branches"] == ["main"]
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
