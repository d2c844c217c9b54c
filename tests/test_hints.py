"""Error hints that pointed the wrong way (issue 25), each through the command a user runs: a
folder given to `sbatch --output` suggested `DIR/jobdef.json`; a refusal of `k8s` and `sbatch`
spoke of AWS Batch; a typo in a stacks file's instances named a table file that does not exist
and offered no "did you mean"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from matrix.jobs import writers
from tests.helpers import one_line, writer_commands

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu-tcp@sha256:" + "a" * 64
TASKS = writer_commands()
FILES = [(w.task, w.file_name) for w in writers.all_writers()]
SCHEDULERS = [(w.task, w.scheduler_name) for w in writers.all_writers()]


def invoke(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def generate(task: str, *args: str) -> subprocess.CompletedProcess:
    return invoke(*TASKS[task], "--nodes", "2", "--image-uri", IMAGE, *args,
                  "--", "python3", "train.py")


@pytest.mark.parametrize(("task", "name"), FILES)
def test_a_folder_as_output_is_answered_with_the_tasks_own_file_name(tmp_path, task, name):
    line = one_line(generate(task, "--instance-type", "c5n.18xlarge", "--output", str(tmp_path)), 2)
    assert f"--output {tmp_path}: a folder; give a file name, e.g. --output {tmp_path / name}" \
        in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("task", "name"), FILES)
def test_output_without_a_value_is_answered_with_the_tasks_own_file_name(task, name):
    line = one_line(invoke(*TASKS[task], "--output"), 2)
    assert line == f"error: --output needs a value, e.g. invoke {task} --output {name}"


@pytest.mark.parametrize(("task", "scheduler"), SCHEDULERS)
def test_a_refusal_names_the_scheduler_the_task_writes_for(task, scheduler):
    """A CPU stack on a GPU instance: the GPUs would be asked for and left idle. Every writer
    refuses it with the stacks file's rule (invoke stacks says the same), which names each
    scheduler's way of asking, never AWS Batch's words alone."""
    line = one_line(generate(task, "--stack", "cpu-tcp", "--instance-type", "p4d.24xlarge"), 1)
    assert (f"stack cpu-tcp cannot run on p4d.24xlarge under {scheduler}: instance p4d.24xlarge "
            "(gpus 8) needs cuda, it is missing [rule gpu-instance-needs-cuda-stack]") in line
    if scheduler != "AWS Batch":
        assert "Batch" not in line


def test_a_stacks_file_instance_typo_names_the_table_and_the_nearest_type(tmp_path):
    text = (ROOT / "stacks.yaml").read_text(encoding="utf-8")
    typo = text.replace("instances: [c5n.18xlarge, c6i.32xlarge, m5.24xlarge]",
                        "instances: [c5n.18xlarg, c6i.32xlarge, m5.24xlarge]")
    assert typo != text
    stacks = tmp_path / "stacks.yaml"
    stacks.write_text(typo, encoding="utf-8")
    line = one_line(invoke("stacks", "--stacks", str(stacks)), 1)
    table = "matrix/model/instances.yaml"
    assert (ROOT / table).is_file()
    assert (f"instance type 'c5n.18xlarg' is not in the instance table {table}; did you mean "
            "c5n.18xlarge? (known: ") in line
