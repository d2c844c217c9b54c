"""The stacks file and the writers agree (issue 42, point 4).

A stacks file could declare a CPU stack on a GPU instance type: `invoke stacks` called it valid
and every writer refused the pair. The refusal is now a rule in matrix/model/rules.yaml, so
`invoke stacks` says INVALID with the rule and its source, and a writer refuses the pair with
the same rule (spec.check_pair runs the stack's rules for it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from matrix.model.instances import INSTANCE_TYPES
from matrix.model.rules import check_matrix, load_rules
from tests.helpers import one_line, project_matrix, stacks_with

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu-tcp@sha256:" + "f" * 64
RULES = {rule.id: rule for rule in load_rules()}
GPU_RULE, GAUDI_RULE = "gpu-instance-needs-cuda-stack", "gaudi-instance-needs-synapseai-stack"


def invoke(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_cpu_stack_on_a_gpu_type_is_invalid_with_the_rule_and_its_source(tmp_path):
    stacks = stacks_with(tmp_path, {"cpu-tcp": "c5n.18xlarge, p4d.24xlarge",
                                    "cpu-mpi": "c5n.18xlarge, dl1.24xlarge"})
    proc = invoke("stacks", "--stacks", str(stacks), "--json")
    line = one_line(proc, 1)
    assert line == f"error: 2 stack(s) in {stacks} break compatibility rules"
    rows = {row["name"]: row for row in json.loads(proc.stdout)["stacks"]}
    assert [name for name, row in rows.items() if not row["valid"]] == ["cpu-tcp", "cpu-mpi"]
    for stack, rule, found in (("cpu-tcp", GPU_RULE, "instance p4d.24xlarge (gpus 8) needs cuda"),
                               ("cpu-mpi", GAUDI_RULE,
                                "instance dl1.24xlarge (hpus 8) needs synapseai")):
        assert rows[stack]["violations"] == [
            f"{found} (found none) [rule {rule}; source: {RULES[rule].source}]"]
    assert "https://" in RULES[GPU_RULE].source and "https://" in RULES[GAUDI_RULE].source
    table = invoke("stacks", "--stacks", str(stacks))
    assert table.returncode == 1
    assert "cpu-tcp (default): INVALID: instance p4d.24xlarge (gpus 8) needs cuda" in table.stdout
    # the writer refuses the same pair by the same rule
    refusal = one_line(invoke("jobdef", "--stacks", str(stacks), "--stack", "cpu-tcp", "--nodes",
                              "2", "--instance-type", "p4d.24xlarge", "--image-uri", IMAGE, "--",
                              "python3", "train.py"), 1)
    assert f"instance p4d.24xlarge (gpus 8) needs cuda, it is missing [rule {GPU_RULE}]" in refusal


def test_every_stack_of_the_project_keeps_its_targets():
    """No stack of stacks.yaml breaks the new rules: each GPU target has a CUDA stack, each
    Gaudi target a SynapseAI one."""
    matrix = project_matrix()
    assert {name: [str(v) for v in found] for name, found in check_matrix(matrix).items()
            if found} == {}
    for accelerators, software in (("gpus", "cuda"), ("hpus", "synapseai")):
        targets = [name for name, stack in matrix.stacks.items()
                   if any(getattr(INSTANCE_TYPES[i], accelerators) for i in stack.instances)]
        assert targets and all(software in matrix.stack(name).versions() for name in targets)
