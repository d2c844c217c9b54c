"""GPU checks for the CUDA 13.2 stacks: they need an NVIDIA GPU and the NVIDIA container runtime,
so they are skipped (with the reason) anywhere else. A machine with a GPU runs them with
``./dev python -m pytest -m gpu tests/test_gpu.py`` after ``invoke build --stack cuda13.2-tcp``.

What they prove that no CPU-only check can: the entrypoint counts the GPUs as its slots, PyTorch
sees the device, a one-rank NCCL all-reduce runs through the entrypoint's torchrun path, and a
user's DeepSpeed script (``deepspeed.init_distributed()``, ``deepspeed.initialize`` with a model
and an optimizer, two steps; then the pre-built fused Adam) runs on the GPU through the
entrypoint's deepspeed launcher with DeepSpeed's default (CUDA) accelerator.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from matrix.image.plan import plan
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parent.parent
STACK = "cuda13.2-tcp"


def _gpu_reason() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    if not shutil.which("nvidia-smi"):
        return "no NVIDIA GPU on this machine (nvidia-smi not found)"
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    if probe.returncode or "GPU " not in probe.stdout:
        return f"nvidia-smi finds no GPU: {(probe.stderr or probe.stdout).strip()[:200]}"
    info = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"],
                          capture_output=True, text=True, check=False).stdout
    if "nvidia" not in info and not shutil.which("nvidia-container-cli"):
        return "the Docker engine has no NVIDIA container runtime"
    return None


REASON = _gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.docker,
              pytest.mark.skipif(REASON is not None, reason=f"GPU test: {REASON}")]

ALLREDUCE = """
import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
t = torch.ones(1 << 20, device="cuda") * (rank + 1)
dist.all_reduce(t)
torch.cuda.synchronize()
print("nccl allreduce", dist.get_world_size(), float(t[0]), torch.cuda.nccl.version(), flush=True)
dist.destroy_process_group()
"""

DEEPSPEED_TRAIN = r"""
import json, os, torch, deepspeed
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
deepspeed.init_distributed()  # the default accelerator's backend, as users call it
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                       config={"train_batch_size": 8})
x = torch.randn(8, 64, device=engine.device)
y = torch.randn(8, 1, device=engine.device)
losses = []
for _ in range(2):
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
from deepspeed.ops.adam import FusedAdam  # pre-built in the layer for the stack's GPUs
p = torch.nn.Parameter(torch.ones(16, device=engine.device))
fused = FusedAdam([p], lr=0.1)
p.grad = torch.ones_like(p)
fused.step()
torch.cuda.synchronize()
print("RESULT " + json.dumps({
    "accelerator": get_accelerator()._name, "backend": dist.get_backend(),
    "world": dist.get_world_size(), "device": str(next(engine.module.parameters()).device),
    "steps": engine.global_steps, "losses": losses, "fused_adam": round(float(p[0]), 4),
    "jit_built": os.path.isdir(os.path.expanduser("~/.cache/torch_extensions"))}), flush=True)
"""


@pytest.fixture(scope="module")
def image(docker_client) -> str:
    ref = plan(load_matrix(ROOT / "stacks.yaml"), [STACK]).chains[STACK][-1]
    try:
        docker_client.images.get(ref)
    except Exception:  # noqa: BLE001 - any lookup failure means: build it first
        pytest.fail(f"{ref} is not built: run `./dev invoke build --stack {STACK}` first")
    return ref


def _run(docker_client, image: str, command: list[str], env: dict[str, str] | None = None) -> str:
    import docker

    out = docker_client.containers.run(
        image, command, environment=env or {}, remove=True, shm_size="1g", stderr=True,
        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])])
    return out.decode()


def test_entrypoint_counts_the_gpus_as_slots(docker_client, image):
    gpus = len([x for x in subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                          check=True).stdout.splitlines() if x.startswith("GPU ")])
    out = _run(docker_client, image, ["python3", "-c", "print(1)"], {"MNP_DRY_RUN": "1"})
    assert f"nvidia-smi -L ({gpus} GPU" in out, out[-3000:]


def test_the_real_driver_is_read_and_compared_with_the_images_cuda(docker_client, image):
    """Issue 33 on real hardware: the entrypoint reads the host's driver (what nvidia-smi says
    here) and compares it with the image's CUDA 13.2: met on R580 or newer, else a PROBLEM."""
    host = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True).stdout.split()[0]
    # warn: the comparison is a note either way, so the dry run exits 0 and its output is read
    out = _run(docker_client, image, ["python3", "-c", "print(1)"],
               {"MNP_DRY_RUN": "1", "MNP_DRIVER_CHECK": "warn"})
    assert f"NVIDIA driver {host} (nvidia-smi --query-gpu=driver_version)" in out, out[-3000:]
    assert "CUDA 13.2" in out, out[-3000:]
    if int(host.split(".")[0]) >= 580:
        out = _run(docker_client, image, ["python3", "-c", "print(1)"], {"MNP_DRY_RUN": "1"})
        assert "PROBLEM" not in out and ": met" in out, out[-3000:]


def test_pytorch_sees_the_device(docker_client, image):
    out = _run(docker_client, image, ["python3", "-c", "import torch; "
                                       "print(torch.cuda.is_available(), torch.cuda.device_count())"],
               {"MNP_LAUNCHER": "none"})
    available, count = out.strip().splitlines()[-1].split()
    assert available == "True" and int(count) >= 1


def test_one_rank_nccl_allreduce_through_torchrun(docker_client, image):
    program = ["python3", "-c", ALLREDUCE]
    out = _run(docker_client, image, program,
               {"MNP_LAUNCHER": "torchrun", "MNP_SLOTS_PER_NODE": "1", "NCCL_DEBUG": "WARN"})
    assert "nccl allreduce 1 1.0 (2, 30, 7)" in out, out[-3000:]


def test_deepspeed_initialize_trains_on_the_gpu_through_the_deepspeed_launcher(docker_client,
                                                                             image):
    out = _run(docker_client, image, ["python3", "-c", DEEPSPEED_TRAIN],
               {"MNP_LAUNCHER": "deepspeed", "MNP_SLOTS_PER_NODE": "1", "NCCL_DEBUG": "WARN"})
    line = [x for x in out.splitlines() if "RESULT " in x]
    assert line, out[-3000:]
    result = json.loads(line[-1].split("RESULT ", 1)[1])
    assert (result["accelerator"], result["backend"], result["world"]) == ("cuda", "nccl", 1)
    assert result["device"].startswith("cuda") and result["steps"] == 2, result
    assert result["losses"][1] < result["losses"][0], result
    assert result["fused_adam"] == 0.9, result  # Adam's first step: 1 - lr
    assert result["jit_built"] is False, "an op was compiled at run time: " + out[-3000:]


DEEPSPEED_JIT = r"""
import torch
from deepspeed.ops.lamb import FusedLamb  # not pre-built: compiled with nvcc on first use
p = torch.nn.Parameter(torch.ones(16, device="cuda"))
opt = FusedLamb([p], lr=0.1)
p.grad = torch.ones_like(p)
opt.step()
torch.cuda.synchronize()
print("LAMB", bool((p < 1).all()), flush=True)
"""


def test_deepspeed_jit_compiles_a_cuda_op_on_the_gpu(docker_client, image):
    """What no CPU-only check can prove (DeepSpeed builds CPU variants when it sees no GPU):
    an op that is not pre-built compiles with the image's nvcc, ninja and headers, and runs."""
    out = _run(docker_client, image, ["python3", "-c", DEEPSPEED_JIT], {"MNP_LAUNCHER": "none"})
    assert "LAMB True" in out, out[-3000:]
