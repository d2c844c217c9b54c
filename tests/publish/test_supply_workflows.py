"""The publish gate and the weekly rebuild (issue 34): publish.yml runs only for a push to main
whose CI succeeded, on the commit CI tested; the workflows pass zizmor and the workflow schema;
Dependabot's configuration passes its schema."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
GATE = ("github.event.workflow_run.conclusion == 'success'",
        "github.event.workflow_run.event == 'push'",
        "github.event.workflow_run.head_branch == 'main'")
# Status functions that make a job run after its needs failed or were skipped.
RUNS_ANYWAY = re.compile(r"\b(always|failure|cancelled)\s*\(")


def _workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def _gated(job: str, jobs: dict, seen: frozenset = frozenset()) -> bool:
    """Whether ``job`` cannot run unless CI's run succeeded: its own `if` holds every gate
    condition, or it needs a gated job and no status function lets it run after a skip."""
    spec = jobs[job]
    condition = " ".join(str(spec.get("if", "")).split())
    if RUNS_ANYWAY.search(condition):
        return False
    if all(part in condition for part in GATE) and " || " not in condition:
        return True
    needs = spec.get("needs") or []
    needs = [needs] if isinstance(needs, str) else needs
    return any(_gated(n, jobs, seen | {job}) for n in needs if n not in seen)


def test_publish_runs_only_after_ci_passed_on_main():
    publish = _workflow("publish.yml")
    assert set(publish["on"]) == {"workflow_run"}, "any other trigger bypasses CI's result"
    trigger = publish["on"]["workflow_run"]
    assert trigger["workflows"] == [_workflow("ci.yml")["name"]]
    assert trigger["types"] == ["completed"]  # completed includes failures: the jobs' if decides
    assert trigger["branches"] == ["main"]
    jobs = publish["jobs"]
    assert [job for job in jobs if not _gated(job, jobs)] == []


def test_publish_checks_out_the_commit_ci_tested():
    for job in _workflow("publish.yml")["jobs"].values():
        for step in job["steps"]:
            if str(step.get("uses", "")).startswith("actions/checkout@"):
                assert step["with"]["ref"] == "${{ github.event.workflow_run.head_sha }}"


def test_the_gate_check_catches_an_ungated_job():
    """The check above can fail: a job without the condition, or one that runs anyway."""
    jobs = {"a": {"if": " && ".join(GATE)}, "b": {"needs": "a"},
            "c": {"needs": "a", "if": "always()"}, "d": {}}
    assert [job for job in jobs if not _gated(job, jobs)] == ["c", "d"]
    failed_too = {"a": {"if": " || ".join(GATE)}}
    assert not _gated("a", failed_too)


def test_rebuild_is_weekly_and_pulls_the_bases():
    rebuild = _workflow("rebuild.yml")
    cron = rebuild["on"]["schedule"][0]["cron"].split()
    assert cron[2:4] == ["*", "*"] and cron[4] not in ("*",)  # one weekday: weekly
    steps = " ".join(str(s.get("run", "")) for s in rebuild["jobs"]["rebuild"]["steps"])
    assert "invoke build --stack \"$STACK\" --registry \"$REGISTRY\" --pull-bases" in steps
    assert rebuild["concurrency"]["group"] == "publish-main"


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]'", pytrace=False)
    return path


# zizmor and the GitHub-workflow schema check every file of .github/workflows/, these two too:
# test_workflows.py runs `invoke check`'s own steps (one check-jsonschema process for all three
# files: each process imports rfc3987-syntax, about 3 s of CPU here).


def test_dependabot_config_passes_its_schema():
    path = str(ROOT / ".github" / "dependabot.yml")
    proc = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.dependabot",
                           path], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ecosystems = {u["package-ecosystem"] for u in yaml.safe_load(Path(path).read_text())["updates"]}
    assert ecosystems == {"github-actions", "pip"}


def test_ci_requirements_pin_every_declared_dependency_with_a_hash():
    """requirements/ci-dev.txt (for ci.yml's install step) pins what pyproject declares."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {canonicalize_name(Requirement(r).name)
                for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    text = (ROOT / "requirements" / "ci-dev.txt").read_text(encoding="utf-8")
    pins = dict(re.findall(r"^([a-z0-9-]+)==\S+ \\\n((?:    --hash=sha256:[0-9a-f]{64}.*\n?)+)",
                           text, re.MULTILINE))
    assert declared - set(pins) == set()
    assert all("--hash=sha256:" in hashes for hashes in pins.values())
    # each pin satisfies pyproject's specifier (pytest is held below 9.2 there: the pin follows)
    versions = {canonicalize_name(n): v for n, v in re.findall(r"^([A-Za-z0-9._-]+)==(\S+) \\$",
                                                              text, re.MULTILINE)}
    for raw in project["dependencies"] + project["optional-dependencies"]["dev"]:
        req = Requirement(raw)
        assert req.specifier.contains(versions[canonicalize_name(req.name)], prereleases=True), raw
