"""The CUDA TCP stack (cuda13.2-tcp) end to end on the real engine: built from nothing with the
project's builder, every layer tested in its own container (CUDA compile, NCCL, DeepSpeed's
pre-built ops), no apt caches in any layer, size within budget, and no filesystem layer above
2 GB in `docker history` (before the PyTorch wheel split one was 5.6 GB).

CI builds it in every run: measured on the 2-core machine, a cold build takes 325 s and its layer
tests about 2 minutes, so a clean-clone CI run stays far under its 45-minute limit
(docs/workflows.md, "What runs on a pull request"). Cached layers (same content tags) are
reused, as for cpu-tcp.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from matrix.image.budget import added_steps
from matrix.image.plan import plan
from matrix.model.loader import load_matrix
from tests.conftest import CUDA_LAYER_TESTS
from tests.layer_checks import apt_cache_files

ROOT = Path(__file__).resolve().parent.parent
STACK = "cuda13.2-tcp"
LAYER_LIMIT = 2_000_000_000  # AWS Batch guidance: layers at or below about 2 GB
pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def cuda_build(cuda_tcp_build):
    """tests/conftest.py's one build of the stack per run."""
    return cuda_tcp_build


# A group of its own with the declared-image tests (tests/integration/test_declared_image.py):
# without a last run it leads (tests/conftest.py), so its worker builds the stack, and the rest of
# this file comes up later by its seconds. Four tests in the group, because xdist's loadscope
# scheduling queues a further group on a worker only while at most two of its tests are pending
# (xdist/scheduler/loadscope.py, _reschedule): a group queued behind the build waited the whole
# build and ran last (the fresh run of e96afed, 2026-11-28).
@pytest.mark.xdist_group(CUDA_LAYER_TESTS)
def test_every_layer_test_passes(cuda_tcp_layer_tests):
    """As `invoke build --test` runs them (tests/conftest.py, cuda_tcp_built): each layer's tests
    once that layer is built."""
    if isinstance(cuda_tcp_layer_tests, Exception):
        raise cuda_tcp_layer_tests
    tested = {r.layer.component: r for r in cuda_tcp_layer_tests}
    for component in ("cuda", "pytorch", "nccl", "deepspeed", "openmpi", "entrypoint", "_stack"):
        assert tested[component].passed > 0 and tested[component].ok, component


def test_no_layer_adds_apt_caches(docker_client, cuda_build):
    found = {layer.name: files for layer in cuda_build.chain(STACK)
             if (files := apt_cache_files(docker_client, layer.ref))}
    assert found == {}


def test_no_pip_cache_or_build_tree_in_any_layer(docker_client, cuda_build):
    final = cuda_build.chains[STACK][-1]
    out = docker_client.containers.run(
        final, ["sh", "-c", "find / -xdev \\( -path '*/.cache/pip' -o -name 'pip-req-build-*' "
                            "-o -path '/tmp/*' \\) 2>/dev/null | head -5"],
        remove=True, entrypoint=[]).decode().strip()
    assert out == ""


def test_image_size_within_budget(docker_client, cuda_build):
    budget = cuda_build.matrix.stack(STACK).size_budget_mb
    size = docker_client.images.get(cuda_build.chains[STACK][-1]).attrs["Size"]
    assert size <= budget * 1_000_000, f"{size / 1e6:.0f} MB > {budget} MB"


def test_efa_sibling_shares_every_layer_below_the_fabric():
    result = plan(load_matrix(ROOT / "stacks.yaml"), [STACK, "cuda13.2-efa"])
    shared = [layer.component for layer in result.chain(STACK)
              if layer.ref in result.chains["cuda13.2-efa"]]
    assert shared == ["ssh", "python", "cuda", "pytorch", "nccl", "deepspeed", "pdsh"]


def test_docker_history_has_no_layer_above_2_gb(cuda_build):
    final = cuda_build.chains[STACK][-1]
    history = subprocess.run(
        ["/usr/bin/docker", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}",
         final], capture_output=True, text=True, check=True).stdout.split()
    sizes = [int(size) for size in history]
    assert sizes and max(sizes) <= LAYER_LIMIT, sorted(sizes)[-3:]


def test_pytorch_adds_one_layer_per_step(docker_client, cuda_build):
    layer = next(x for x in cuda_build.chain(STACK) if x.component == "pytorch")
    steps = cuda_build.matrix.stack(STACK).layer("pytorch").spec["options"]["pip_steps"]
    big = [s for s in added_steps(docker_client, layer.ref, layer.parent) if s.size > 1_000_000]
    assert len(big) == len(steps) + 1  # each group, then torch
    assert sum(s.size for s in big) > 4_000_000_000  # the wheels are all there, just split


# -- issue 33: the NVIDIA driver against the image's CUDA, in the built image -----------------------
# A stand-in nvidia-smi (the formats: tests/entrypoint/test_ep_driver.py) is mounted where the
# NVIDIA container runtime puts the real one, /usr/local/nvidia/bin, first on the image's PATH.
H100 = "NVIDIA H100 80GB HBM3"
RAN = "the-command-ran"


def _driver_run(final, tmp_path, version, name=H100, compat=None, **env):
    from tests.entrypoint.test_ep_driver import smi_script

    bindir = tmp_path / f"bin-{version}"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(smi_script(version, name, gpus=1))
    (bindir / "nvidia-smi").chmod(0o755)
    argv = ["/usr/bin/docker", "run", "--rm", "--label", "mnp-test=1",
            "-v", f"{bindir}:/usr/local/nvidia/bin:ro"]
    if compat:
        lib = tmp_path / "compat"
        lib.mkdir()
        (lib / f"libcuda.so.{compat}").write_text("")
        argv += ["-v", f"{lib}:/usr/local/cuda-13.2/compat:ro"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    argv += [final, "python3", "-c", f"print({RAN!r})"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_an_old_driver_is_a_problem_and_fails_the_node_before_any_rank(cuda_build, tmp_path):
    final = cuda_build.chains[STACK][-1]
    (tmp_path / "dry").mkdir()
    dry = _driver_run(final, tmp_path / "dry", "550.54.15", MNP_DRY_RUN="1")
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert "PROBLEM (a real run stops here): node " in dry.stdout
    assert ("NVIDIA driver 550.54.15 (nvidia-smi --query-gpu=driver_version) is older than the "
            "580-series floor 580 that the image's CUDA 13.2.86") in dry.stdout
    (tmp_path / "real").mkdir()
    real = _driver_run(final, tmp_path / "real", "550.54.15")
    assert real.returncode == 2, real.stdout + real.stderr
    last = (real.stdout + real.stderr).strip().splitlines()[-1]
    assert "exit 2 (configuration on node 0): node " in last and "550.54.15" in last, last
    assert RAN not in real.stdout


def test_a_new_driver_is_neither_a_problem_nor_a_failure(cuda_build, tmp_path):
    final = cuda_build.chains[STACK][-1]
    (tmp_path / "dry").mkdir()
    dry = _driver_run(final, tmp_path / "dry", "580.82.07", MNP_DRY_RUN="1")
    assert dry.returncode == 0 and "PROBLEM" not in dry.stdout, dry.stdout + dry.stderr
    assert "note: NVIDIA driver 580.82.07" in dry.stdout and ": met" in dry.stdout
    (tmp_path / "real").mkdir()
    real = _driver_run(final, tmp_path / "real", "580.82.07")
    assert real.returncode == 0 and RAN in real.stdout, real.stdout + real.stderr


def test_forward_compatibility_in_the_image_for_a_datacenter_gpu_only(cuda_build, tmp_path):
    """The compat libraries in the image are never used past the driver branch's end of life:
    no branch NVIDIA supports on the run's day is below CUDA 13's floor (R580, R595 and R620
    meet it), so on R535 the image's compat folder stays unused and the plan names the branch's
    end. Where a branch still qualifies (a run day before June 2026), the plan uses it:
    tests/entrypoint/test_ep_driver.py, run_date BEFORE_R570_EOL."""
    final = cuda_build.chains[STACK][-1]
    (tmp_path / "dc").mkdir()
    dc = _driver_run(final, tmp_path / "dc", "535.183.01", compat="580.82.07", MNP_DRY_RUN="1")
    assert dc.returncode == 1, dc.stdout + dc.stderr
    assert "no forward compatibility: driver branch R535" in dc.stdout, dc.stdout
    assert "LD_LIBRARY_PATH=/usr/local/cuda-13.2/compat" not in dc.stdout
    (tmp_path / "rtx").mkdir()
    rtx = _driver_run(final, tmp_path / "rtx", "535.183.01", name="NVIDIA GeForce RTX 4090",
                      compat="580.82.07", MNP_DRY_RUN="1")
    assert rtx.returncode == 1, rtx.stdout + rtx.stderr
    assert "LD_LIBRARY_PATH=/usr/local/cuda-13.2/compat" not in rtx.stdout
