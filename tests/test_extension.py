"""Adding a launcher is one module, adding a scheduler one adapter module (issue 36): in a copy
of the project's tracked files with only that module added, the commands users call accept it
(``invoke jobdef/sbatch/explain --launcher toy``; ``invoke stacks --values scheduler`` and
``invoke explain --scheduler toy``), and the same commands in the real tree refuse it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.toy_modules import TOY_SCHEDULER, TOY_UNIT

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp-stacks@sha256:" + "a" * 64




@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """The tracked files, plus the toy launcher and the toy scheduler: one module each."""
    root = tmp_path_factory.mktemp("toyrepo")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(source.read_bytes())
    (root / "entrypoint/launchers/toy.py").write_text(TOY_UNIT, encoding="utf-8")
    (root / "entrypoint/schedulers/toy.py").write_text(TOY_SCHEDULER, encoding="utf-8")
    return root


def invoke(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True,
                          text=True, timeout=300, check=False)


PICK = ("--stack", "cpu-tcp", "--instance-type", "c6i.32xlarge", "--nodes", "2")


@pytest.mark.parametrize("task", ["jobdef", "sbatch", "explain"])
def test_a_toy_launcher_module_is_accepted_by_every_writer_and_explain(copy, task):
    image = () if task == "explain" else ("--image-uri", IMAGE)
    proc = invoke(copy, task, *PICK, "--launcher", "toy", *image, "--", "python3", "train.py")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "toy" in proc.stdout
    if task == "explain":
        assert "command: toyrun -np" in proc.stdout
    refused = invoke(ROOT, task, *PICK, "--launcher", "toy", *image, "--", "python3", "train.py")
    assert refused.returncode == 2 and "--launcher 'toy'" in refused.stderr


def test_a_toy_scheduler_module_is_listed_and_explained(copy):
    listed = invoke(copy, "stacks", "--values", "scheduler")
    assert listed.returncode == 0 and "toy" in listed.stdout.split(), listed.stderr
    assert "toy" not in invoke(ROOT, "stacks", "--values", "scheduler").stdout.split()
    explained = invoke(copy, "explain", *PICK, "--scheduler", "toy", "--", "python3", "train.py")
    assert explained.returncode == 0, explained.stderr[-2000:]
    assert "under toy" in explained.stdout
