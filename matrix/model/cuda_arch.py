"""Which GPU architectures a stack compiles CUDA code for: its instances' GPUs, limited to what
its CUDA version's nvcc can target.

Two tables, each with its source:

* GPU model (``gpu_model`` in matrix/model/instances.yaml) -> compute capability, from NVIDIA's
  "CUDA GPUs" page (https://developer.nvidia.com/cuda-gpus, "Compute Capability" tables:
  data center products).
* compute capability -> the first CUDA release whose nvcc targets it and the first release that
  dropped it, from the CUDA Toolkit release notes
  (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/, "New Features" / "Deprecated or
  Dropped Features" of each release) and the nvcc manual's "GPU Feature List"
  (https://docs.nvidia.com/cuda/cuda-compiler-driver-nvcc/#gpu-feature-list).

Templates get the result as ``cuda_archs`` (e.g. ``["8.6", "9.0", "10.0"]``) and the macros in
images/_macros.j2 turn it into nvcc ``-gencode`` flags or a ``TORCH_CUDA_ARCH_LIST``.

Stacks that share their CUDA layers (same base, same CUDA release: a family such as an EFA stack
and its TCP sibling) compile for the GPUs of the whole family, so the compiled layers are the same
image in both; see :func:`family_archs`.
"""

from __future__ import annotations

from dataclasses import dataclass

from matrix.errors import UserError
from matrix.model.entities import Matrix, Stack
from matrix.model.instances import INSTANCE_TYPES

# GPU model (as the instance table names it) -> compute capability.
GPU_COMPUTE_CAPABILITY: dict[str, str] = {
    "V100": "7.0",
    "A100": "8.0",
    "A10G": "8.6",
    "L4": "8.9",
    "L40S": "8.9",
    "H100": "9.0",
    "H200": "9.0",
    "B200": "10.0",
}


@dataclass(frozen=True)
class ArchSupport:
    """CUDA releases whose nvcc compiles for one compute capability: [first, dropped)."""

    first: tuple[int, int]
    dropped: tuple[int, int] | None
    source: str


_NOTES = "CUDA Toolkit release notes"
ARCH_SUPPORT: dict[str, ArchSupport] = {
    # Volta (sm_70): offline compilation for Maxwell, Pascal and Volta removed in CUDA 13.0.
    "7.0": ArchSupport((9, 0), (13, 0), f"{_NOTES} 9.0 (Volta); 13.0 (Volta dropped)"),
    "8.0": ArchSupport((11, 0), None, f"{_NOTES} 11.0 (NVIDIA Ampere GPU architecture, sm_80)"),
    "8.6": ArchSupport((11, 1), None, f"{_NOTES} 11.1 (sm_86)"),
    "8.9": ArchSupport((11, 8), None, f"{_NOTES} 11.8 (Ada Lovelace, sm_89)"),
    "9.0": ArchSupport((11, 8), None, f"{_NOTES} 11.8 (Hopper, sm_90)"),
    "10.0": ArchSupport((12, 8), None, f"{_NOTES} 12.8 (Blackwell, sm_100)"),
}


def _release(cuda: str) -> tuple[int, int]:
    major, minor = (cuda.split(".") + ["0"])[:2]
    return int(major), int(minor)


def supported(cc: str, cuda: str) -> bool:
    """Whether nvcc of CUDA release ``cuda`` (e.g. "11.7.1") compiles for ``cc``."""
    support = ARCH_SUPPORT[cc]
    release = _release(cuda)
    return support.first <= release and (support.dropped is None or release < support.dropped)


def cuda_archs(cuda: str | None, gpu_models: list[str]) -> list[str]:
    """Compute capabilities to compile for, ascending: every GPU model's that ``cuda`` supports.

    An unknown GPU model is an error (the table must grow with the instance table); a GPU the
    CUDA release cannot target is left out (its kernels would need a newer nvcc).
    """
    if not cuda or not gpu_models:
        return []
    found = set()
    for model in gpu_models:
        cc = GPU_COMPUTE_CAPABILITY.get(model)
        if cc is None:
            raise UserError(f"matrix/model/cuda_arch.py: GPU model {model!r} has no compute capability "
                            f"in GPU_COMPUTE_CAPABILITY (known: "
                            f"{', '.join(sorted(GPU_COMPUTE_CAPABILITY))})")
        if supported(cc, cuda):
            found.add(cc)
    return sorted(found, key=lambda cc: tuple(map(int, cc.split("."))))


def gpu_model(instance: str) -> str | None:
    """The NVIDIA GPU model of an instance type, None for CPU or Gaudi instances."""
    row = INSTANCE_TYPES.get(instance)
    return row.gpu_model if row is not None and row.gpus else None


def stack_cuda(stack: Stack) -> str | None:
    """The stack's CUDA release (from its base or a layer), None for stacks without CUDA."""
    return stack.versions().get("cuda")


def _family(stack: Stack) -> tuple[str, str] | None:
    cuda = stack_cuda(stack)
    return (stack.base.name, ".".join(cuda.split(".")[:2])) if cuda else None


def family_archs(matrix: Matrix, stack: Stack) -> list[str]:
    """``cuda_archs`` of ``stack``: the GPUs of every stack in its family (same base, same
    CUDA major.minor), so stacks that share CUDA layers share their compiled images too."""
    family = _family(stack)
    if family is None:
        return []
    models = sorted({model for other in matrix.stacks.values() if _family(other) == family
                     for instance in other.instances if (model := gpu_model(instance))})
    return cuda_archs(stack_cuda(stack), models)
