"""A new scheduler is one adapter module, a new launcher one unit module (issue 36).

A toy adapter dropped into a copy of the entrypoint's ``schedulers`` package, with no other file
edited, is found, checked against ``base.ADAPTER_CONTRACT``, detected from its own variable,
chosen by ``MNP_SCHEDULER`` and planned by the real entrypoint's dry run; a module that breaks
the contract stops the import naming what it lacks. A toy launcher unit dropped into
``launchers`` is a value ``MNP_LAUNCHER`` accepts and the plan runs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.toy_modules import TOY_SCHEDULER

ROOT = Path(__file__).resolve().parents[2]

TOY = TOY_SCHEDULER


TOY_UNIT = '''"""A toy launcher: prints its plan's np and runs nothing."""
from .base import Launch, Unit


class Toy(Unit):
    name = "toy"
    needs_ssh = True
    source = "tests/entrypoint/test_ep_extension.py"
    programs = ("toyrun",)

    def launch(self, request):
        return Launch(["echo", "toy", "np=%d" % request.np] + request.command)


UNIT = Toy()
'''


def copy_with(tmp_path, name, text, room="schedulers"):
    shutil.copytree(ROOT / "entrypoint", tmp_path / "entrypoint",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "entrypoint" / room / name).write_text(text, encoding="utf-8")
    return tmp_path


def run(root, env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MNP_", "AWS_BATCH_",
                                                                        "SLURM_", "PET_", "OMPI_"))}
    return subprocess.run([sys.executable, "-m", "entrypoint", "true"], cwd=root,
                          env=dict(clean, PYTHONPATH=str(root), **env), capture_output=True,
                          text=True, timeout=120, check=False)


def test_a_toy_scheduler_module_is_detected_and_planned(tmp_path):
    root = copy_with(tmp_path, "toy.py", TOY)
    proc = run(root, {"TOY_RANK": "0", "TOY_SIZE": "1", "MNP_DRY_RUN": "json",
                      "MNP_LAUNCHER": "none"})
    assert proc.returncode == 0, proc.stderr
    node = json.loads(proc.stdout)["role"]["node"]
    assert (node["scheduler"], node["detected_from"]) == ("toy", "TOY_RANK")
    forced = run(root, {"MNP_SCHEDULER": "toy", "TOY_RANK": "0", "TOY_SIZE": "1",
                        "MNP_DRY_RUN": "json", "MNP_LAUNCHER": "none"})
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["role"]["node"]["detected_from"] == "MNP_SCHEDULER=toy"


def test_without_the_module_the_toy_variables_are_nobodys(tmp_path):
    """The same variables with no toy module: single-node, and MNP_SCHEDULER=toy is refused."""
    root = copy_with(tmp_path, "unrelated.py", "X = 1\n")
    proc = run(root, {"MNP_SCHEDULER": "toy", "TOY_RANK": "0", "MNP_DRY_RUN": "1"})
    assert proc.returncode == 2 and "MNP_SCHEDULER" in proc.stderr


@pytest.mark.parametrize("drop,lacks", [("PRECEDENCE = 55\n", "PRECEDENCE must be a int"),
                                        ("def example(num_nodes, node_rank=0):",
                                         "example must be a function")])
def test_a_module_that_breaks_the_contract_stops_the_import(tmp_path, drop, lacks):
    broken = TOY.replace(drop, "def example():" if drop.startswith("def") else "")
    root = copy_with(tmp_path, "toy.py", broken)
    proc = run(root, {"MNP_DRY_RUN": "1"})
    assert proc.returncode == 2, proc.stderr
    assert lacks in proc.stderr and "ADAPTER_CONTRACT" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_toy_launcher_module_is_a_launcher_the_plan_runs(tmp_path):
    root = copy_with(tmp_path, "toy.py", TOY_UNIT, room="launchers")
    proc = run(root, {"MNP_LAUNCHER": "toy", "MNP_DRY_RUN": "json", "MNP_SLOTS_PER_NODE": "2"})
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["launcher"]["unit"] == "toy"
    assert plan["argv"] == ["echo", "toy", "np=2", "true"]
    assert "toyrun" in plan["facts"]["binaries"]  # the probe looked its program up
    listed = subprocess.run([sys.executable, "-c", "from entrypoint import launchers; "
                             "print(' '.join(launchers.NAMES))"], cwd=root, capture_output=True,
                            text=True, timeout=60, check=True, env=dict(os.environ,
                                                                        PYTHONPATH=str(root)))
    assert listed.stdout.split() == ["mpirun", "deepspeed", "torchrun",
                                     "torch.distributed.launch", "none", "toy"]


def test_without_the_module_toy_is_not_a_launcher(tmp_path):
    root = copy_with(tmp_path, "unrelated.py", "X = 1\n", room="launchers")
    proc = run(root, {"MNP_LAUNCHER": "toy", "MNP_DRY_RUN": "1"})
    assert proc.returncode == 2 and "MNP_LAUNCHER" in proc.stderr
