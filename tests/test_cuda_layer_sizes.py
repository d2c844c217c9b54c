"""cuda13.2-tcp's filesystem layers, as `docker history` shows them: none above 2 GB (before the
PyTorch wheel split, one was 5.6 GB), and the PyTorch image adds one layer per pip step.

Builds the stack like tests/test_cuda_tcp.py (cached layers are reused)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from matrix.image import build, ca
from matrix.image.budget import added_steps
from matrix.image.plan import plan
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parent.parent
STACK = "cuda13.2-tcp"
LIMIT = 2_000_000_000
pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def cuda_build(docker_client):
    result = plan(load_matrix(ROOT / "stacks.yaml"), [STACK])
    build.build(docker_client, result, [STACK], ca_bundle=ca.resolve(None),
                console=Console(highlight=False, width=160))
    return result


def test_docker_history_has_no_layer_above_2_gb(cuda_build):
    final = cuda_build.chains[STACK][-1]
    history = subprocess.run(
        ["/usr/bin/docker", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}",
         final], capture_output=True, text=True, check=True).stdout.split()
    sizes = [int(size) for size in history]
    assert sizes and max(sizes) <= LIMIT, sorted(sizes)[-3:]


def test_pytorch_adds_one_layer_per_step(docker_client, cuda_build):
    layer = next(x for x in cuda_build.chain(STACK) if x.component == "pytorch")
    steps = cuda_build.matrix.stack(STACK).layer("pytorch").spec["options"]["pip_steps"]
    big = [s for s in added_steps(docker_client, layer.ref, layer.parent) if s.size > 1_000_000]
    assert len(big) == len(steps) + 1  # each group, then torch
    assert sum(s.size for s in big) > 4_000_000_000  # the wheels are all there, just split
