"""Which GPU architectures a stack compiles CUDA code for: its instances' GPUs, limited to what
its CUDA version's nvcc can target.

Two tables, each with its source:

* GPU model (``gpu_model`` in matrix/model/instances.yaml) -> compute capability, from NVIDIA's
  "CUDA GPUs" page (:data:`GPUS_PAGE`).
* compute capability -> the first CUDA release whose nvcc targets it and the first release that
  dropped it, from the CUDA Toolkit release notes
  (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/, "New Features" / "Deprecated or
  Dropped Features" of each release) and the nvcc manual's "GPU Feature List"
  (https://docs.nvidia.com/cuda/cuda-compiler-driver-nvcc/#gpu-feature-list).

Templates get the result as ``cuda_archs`` (e.g. ``["8.6", "9.0", "10.0"]``: one per major, see
:func:`cuda_archs`) and the macros in images/_macros.j2 turn it into nvcc ``-gencode`` flags or a
``TORCH_CUDA_ARCH_LIST``.

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
    "B300": "10.3",  # Blackwell Ultra (p6-b300)
    "GB200": "10.0",  # Grace Blackwell (p6e-gb200): "NVIDIA GB200 NVIDIA B200" in the 10.0 row
}


@dataclass(frozen=True)
class ArchSupport:
    """CUDA releases whose nvcc compiles for one compute capability: [first, dropped)."""

    first: tuple[int, int]
    dropped: tuple[int, int] | None
    source: str


_NOTES = "https://docs.nvidia.com/cuda/archive/{}/cuda-toolkit-release-notes/index.html"
ARCH_SUPPORT: dict[str, ArchSupport] = {
    # Volta (sm_70): offline compilation for compute capability < 7.5 (Maxwell, Pascal, Volta)
    # was removed in CUDA 13.0.
    "7.0": ArchSupport((9, 0), (13, 0),
                       f"{_NOTES.format('9.0')} section \"General CUDA\" (Volta, sm_70, from "
                       f"CUDA 9.0); {_NOTES.format('13.0.0')} section \"Deprecated or Dropped "
                       f"Features\" (offline compilation for architectures below sm_75 removed)"),
    "8.0": ArchSupport((11, 0), None,
                       f"{_NOTES.format('11.0')} section \"General CUDA\" (NVIDIA Ampere GPU "
                       f"architecture, sm_80, from CUDA 11.0)"),
    "8.6": ArchSupport((11, 1), None,
                       f"{_NOTES.format('11.1.0')} section \"General CUDA\" (sm_86, GA10x, "
                       f"from CUDA 11.1)"),
    "8.9": ArchSupport((11, 8), None,
                       f"{_NOTES.format('11.8.0')} section \"General CUDA\" (Ada sm_89 from "
                       f"CUDA 11.8; earlier nvcc stops at sm_86)"),
    "9.0": ArchSupport((11, 8), None,
                       f"{_NOTES.format('11.8.0')} section \"General CUDA\" (Hopper sm_90 "
                       f"from CUDA 11.8)"),
    "10.0": ArchSupport((12, 8), None,
                        f"{_NOTES.format('12.8.0')} section \"General CUDA\" (Blackwell "
                        f"sm_100 from CUDA 12.8)"),
    "10.3": ArchSupport((12, 9), None,
                        "https://docs.nvidia.com/cuda/archive/12.9.1/cuda-features-archive/"
                        "index.html section \"CUDA 12.9 Features\" / \"General CUDA\" (compiler "
                        "target support for SM architecture 10.3: sm_103, sm_103f, sm_103a)"),
}
# Why one cubin per major serves every GPU of that major.
BINARY_COMPATIBILITY = ("https://docs.nvidia.com/cuda/ada-compatibility-guide/index.html section "
                        "1.2 \"Application Compatibility on the NVIDIA Ada GPU Architecture\" (a "
                        "cubin generated for a compute capability runs on any GPU of the same "
                        "major and the same or a higher minor revision: one for 8.6 runs on 8.9)")
GPUS_PAGE = ("https://developer.nvidia.com/cuda-gpus (\"Compute Capability\" tables: data center "
             "products)")


def _release(cuda: str) -> tuple[int, int]:
    major, minor = (cuda.split(".") + ["0"])[:2]
    return int(major), int(minor)


def _sm(cc: str) -> str:
    return "sm_" + cc.replace(".", "")


def supported(cc: str, cuda: str) -> bool:
    """Whether nvcc of CUDA release ``cuda`` (e.g. "11.7.1") compiles for ``cc``."""
    return unsupported_reason(cc, cuda) is None


def unsupported_reason(cc: str, cuda: str) -> str | None:
    """Why CUDA release ``cuda`` cannot compile for ``cc`` (None when it can)."""
    support = ARCH_SUPPORT[cc]
    release = _release(cuda)
    if release < support.first:
        first = ".".join(map(str, support.first))
        return f"{_sm(cc)} needs CUDA {first} or newer"
    if support.dropped is not None and release >= support.dropped:
        dropped = ".".join(map(str, support.dropped))
        return f"CUDA {dropped} dropped {_sm(cc)}"
    return None


def compute_capability(model: str) -> str:
    """The compute capability of a GPU model; an unknown model is an error (the table must grow
    with the instance table)."""
    cc = GPU_COMPUTE_CAPABILITY.get(model)
    if cc is None:
        raise UserError(f"matrix/model/cuda_arch.py: GPU model {model!r} has no compute capability "
                        f"in GPU_COMPUTE_CAPABILITY (known: "
                        f"{', '.join(sorted(GPU_COMPUTE_CAPABILITY))})")
    return cc


def cuda_archs(cuda: str | None, gpu_models: list[str]) -> list[str]:
    """Compute capabilities to compile for, ascending: the lowest of each major among the GPUs.

    One cubin per major is enough to run: a cubin built for compute capability X.y runs on every
    GPU of compute capability X.z with z >= y (:data:`BINARY_COMPATIBILITY`), so sm_86 code
    serves the A10G and the L4/L40S (8.9) alike, and sm_100 code the B200 and the B300 (10.3).
    PyTorch's own wheels ship neither sm_89 nor sm_103 either: 2.15.0+cu132 carries sm_75 sm_80
    sm_86 sm_90 sm_100 sm_120 (``torch._C._cuda_getArchFlags()`` in the cuda13.2 stacks). Unlike
    this rule, PyTorch keeps sm_80 beside sm_86; no family here has both.

    No CUDA means nothing to compile (an empty list). A CUDA release with no GPU to compile for,
    or a GPU its nvcc cannot target, is an error: leaving the GPU out would build kernels for
    none of the hardware the stack targets (the rule class ``gpu-arch`` in rules.yaml refuses
    such stacks before anything renders).
    """
    if not cuda:
        return []
    if not gpu_models:
        raise UserError(f"CUDA {cuda}: no GPU model to compile kernels for (a CUDA stack needs "
                        f"an instance type with NVIDIA GPUs)")
    found = set()
    for model in gpu_models:
        cc = compute_capability(model)
        reason = unsupported_reason(cc, cuda)
        if reason:
            raise UserError(f"CUDA {cuda} cannot compile for the {model} GPU ({reason}; source: "
                            f"{ARCH_SUPPORT[cc].source})")
        found.add(cc)
    lowest: dict[int, str] = {}  # major -> its lowest capability, majors in ascending order
    for cc in sorted(found, key=_release):
        lowest.setdefault(_release(cc)[0], cc)
    return list(lowest.values())


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
    CUDA major.minor), so stacks that share CUDA layers share their compiled images too.

    A GPU of the family the CUDA release cannot target is an error naming the stack and
    instance it comes from (one line), never a silent omission."""
    family = _family(stack)
    if family is None:
        return []
    cuda = stack_cuda(stack)
    models: dict[str, tuple[str, str]] = {}
    for other in matrix.stacks.values():
        if _family(other) != family:
            continue
        for instance in other.instances:
            model = gpu_model(instance)
            if model:
                models.setdefault(model, (other.name, instance))
    if not models:
        raise UserError(f"{stack.where}: stack {stack.name}: CUDA {cuda}, but none of its "
                        f"instance types ({', '.join(stack.instances)}) has an NVIDIA GPU to "
                        f"compile kernels for")
    for model, (owner, instance) in sorted(models.items()):
        cc = compute_capability(model)
        reason = unsupported_reason(cc, cuda)
        if reason:
            shared = "" if owner == stack.name else f" (stack {owner}, which shares its CUDA layers)"
            raise UserError(f"{stack.where}: stack {stack.name}: CUDA {cuda} cannot compile for "
                            f"instance {instance}{shared}: its {model} GPU is {_sm(cc)} and "
                            f"{reason} [source: {ARCH_SUPPORT[cc].source}]")
    return cuda_archs(cuda, sorted(models))
