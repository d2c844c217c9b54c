"""Layer test: CUDA from NVIDIA's apt repository (toolkit + cuDNN) or from NVIDIA's PyPI wheels
(nvcc, headers, runtime): nvcc is the pinned release and really compiles CUDA code for the stack
family's GPU architectures."""

import re
from pathlib import Path

import pytest

from matrix.model.cuda_arch import family_archs
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parents[2]
KERNEL = r"""
#include <cstdio>
#include <cuda_runtime.h>
__global__ void add(const float *a, float *b) { b[threadIdx.x] += a[threadIdx.x]; }
int main() {
  float *a, *b;
  if (cudaMalloc(&a, 64) != cudaSuccess || cudaMalloc(&b, 64) != cudaSuccess) return 1;
  add<<<1, 16>>>(a, b);
  std::printf("%d\n", CUDART_VERSION);
  return 0;
}
"""


def _pip(layer):
    return layer["spec"]["source"] == "pip"


def _archs(layer):
    matrix = load_matrix(ROOT / "stacks.yaml")
    return family_archs(matrix, matrix.stack(layer["stack"]))


def test_nvcc_reports_the_pinned_release(host, layer):
    out = host.check_output("nvcc --version")
    cuda = layer["spec"]["provides"]["cuda"]
    if _pip(layer):
        assert f"release {'.'.join(cuda.split('.')[:2])}," in out
    else:
        assert f"V{cuda}" in out


def test_tiny_cuda_program_compiles_for_the_family_archs(host, layer):
    """Compiling against the installed headers works, and the binary holds SASS for every GPU
    architecture the stack family targets (cuobjdump from the image)."""
    archs = _archs(layer)
    if not archs:
        pytest.skip("no GPU instance in this stack family")
    flags = " ".join(f"-gencode=arch=compute_{a.replace('.', '')},code=sm_{a.replace('.', '')}"
                     for a in archs)
    host.run(f"mkdir -p /tmp/cudatest && cat > /tmp/cudatest/k.cu <<'CU'\n{KERNEL}\nCU")
    out = host.run(f"cd /tmp/cudatest && nvcc {flags} -o k k.cu")
    assert out.rc == 0, out.stderr[-2000:]
    elf = host.check_output("cuobjdump --list-elf /tmp/cudatest/k")
    found = sorted(set(re.findall(r"sm_(\d+)", elf)), key=int)
    assert found == [a.replace(".", "") for a in archs]


def test_cudart_resolves_through_the_linker_cache(host):
    assert "libcudart.so" in host.check_output("ldconfig -p")


def test_cuda_home_layout(host, layer):
    if not _pip(layer):
        pytest.skip("apt CUDA: /usr/local/cuda is NVIDIA's own tree")
    for path in ("bin/nvcc", "include/cuda_runtime.h", "lib64/libcudart.so"):
        assert host.file(f"/usr/local/cuda/{path}").exists, path
    assert host.check_output("echo $CUDA_HOME") == "/usr/local/cuda"


def test_pinned_wheels_installed(host, layer):
    if not _pip(layer):
        pytest.skip("apt CUDA: packages are checked below")
    out = host.check_output("python3 -m pip list --format=freeze 2>/dev/null")
    installed = dict(line.split("==", 1) for line in out.splitlines() if "==" in line)
    for name, pin in layer["spec"]["pip"].items():
        assert installed.get(name) == pin["version"], name


def test_cudnn_header_matches(host, layer):
    if _pip(layer):
        pytest.skip("wheel CUDA: cuDNN comes with PyTorch's nvidia-cudnn wheel")
    header = host.file("/usr/include/cudnn.h").content_string
    parts = [re.search(rf"#define CUDNN_{k} (\d+)", header).group(1)
             for k in ("MAJOR", "MINOR", "PATCHLEVEL")]
    assert ".".join(parts) == ".".join(layer["spec"]["provides"]["cudnn"].split(".")[:3])


def test_packages_at_pinned_versions(host, layer):
    for name, version in layer["spec"]["apt"].items():
        assert host.package(name).version == version, name


def test_repository_key_is_nvidias(host, layer):
    if _pip(layer):
        pytest.skip("wheel CUDA: no apt repository; pip checked every wheel's sha256")
    out = host.check_output("gpg --batch --with-colons --no-default-keyring "
                            "--keyring /usr/share/keyrings/nvidia-cuda.gpg --list-keys")
    assert layer["spec"]["options"]["key_fingerprint"] in out
