"""EC2 instance types a stack can run on under AWS Batch, and what a job definition needs of them.

The figures live in one table, ``instances.yaml`` next to this file (schema:
``schemas/instances.schema.yaml``); every row says where each figure comes from. Memory is the
installed memory in MiB (GiB x 1024); the job definition asks for less (see
:func:`job_memory_mib`), because Batch can only place a job on an instance whose *registered*
memory (installed memory minus kernel and agent) covers it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from matrix.errors import UserError
from matrix.model import yamlsrc
from matrix.model.schema import check_schema

TABLE = Path(__file__).parent / "instances.yaml"

# Batch docs recommend keeping a 5 % memory buffer for the ECS agent and system processes
# (docs.aws.amazon.com/batch/latest/userguide/ecs-reserved-memory.html).
MEMORY_RESERVE_FRACTION = 0.05
MEMORY_RESERVE_MIN_MIB = 2048

_SOURCE_KEY = re.compile(r"\[([a-z0-9-]+)\]")


@dataclass(frozen=True)
class InstanceType:
    """What one EC2 instance type offers a Batch multi-node job.

    ``gpus`` counts NVIDIA GPUs (Batch's ``GPU`` resource) of model ``gpu_model``; ``hpus``
    counts Habana Gaudi accelerators (``hpu_model``), which Batch does not schedule as a
    resource (the DL1 job runs privileged). ``efa_interfaces`` is the number of EFA devices, one
    ``/dev/infiniband/uverbsN`` each; ``efa_rdma_read`` tells whether EFA on this type supports
    RDMA reads (GPUDirect RDMA). ``shm_mib`` is the ``/dev/shm`` size to give the container.
    ``arch`` is the CPU architecture as GOARCH names it (``amd64``, ``arm64``), what a stack's
    platform must say to run there; ``imex_channel`` says multi-node NVLink on the type needs an
    NVIDIA IMEX channel device in the container (p6e-gb200). ``source`` names the upstream page
    and section of every figure; ``unverified`` lists the figures not confirmed there, with the
    reason. ``notice`` is the one line whoever picks the type must read (that it may no longer
    be offered, say): ``invoke stacks`` shows it under every stack listing the type, and every
    artefact written for the type carries it.
    """

    name: str
    vcpus: int
    memory_mib: int
    gpus: int
    hpus: int
    efa_interfaces: int
    efa_rdma_read: bool
    shm_mib: int
    source: str
    gpu_model: str | None = None
    hpu_model: str | None = None
    network_gbps: int = 0
    threads_per_core: int = 2
    arch: str = "amd64"
    imex_channel: bool = False
    unverified: str = ""
    notice: str = ""

    @property
    def accelerators(self) -> int:
        """GPUs or HPUs per instance (0 for CPU-only types)."""
        return self.gpus or self.hpus

    @property
    def has_efa(self) -> bool:
        """Whether the type has at least one EFA interface."""
        return self.efa_interfaces > 0

    @property
    def cores(self) -> int:
        """Physical cores: vCPUs over hardware threads per core."""
        return max(1, self.vcpus // self.threads_per_core)

    def slots_per_node(self) -> int:
        """Ranks to start per node: one per accelerator, else one per physical core."""
        return self.accelerators or self.cores


def _expand(text: str, sources: dict[str, str], where: str) -> str:
    """``text`` followed by the full reference of every ``[key]`` it cites."""
    keys = list(dict.fromkeys(_SOURCE_KEY.findall(text)))
    unknown = [key for key in keys if key not in sources]
    if unknown:
        raise UserError(f"{where}: source cites [{unknown[0]}], which is not under sources: "
                        f"({', '.join(sorted(sources))})")
    if not keys:
        raise UserError(f"{where}: source cites no [key] from sources:")
    return text + " | " + " | ".join(f"[{key}] {' '.join(sources[key].split())}" for key in keys)


def _row(name: str, raw: dict[str, Any], sources: dict[str, str], where: str) -> InstanceType:
    return InstanceType(
        name=name,
        vcpus=raw["vcpus"],
        memory_mib=raw["memory_gib"] * 1024,
        gpus=raw.get("gpus", 0),
        hpus=raw.get("hpus", 0),
        efa_interfaces=raw["efa_interfaces"],
        efa_rdma_read=raw["efa_rdma_read"],
        shm_mib=raw["shm_mib"],
        source=_expand(raw["source"], sources, where),
        gpu_model=raw.get("gpu_model"),
        hpu_model=raw.get("hpu_model"),
        network_gbps=raw["network_gbps"],
        threads_per_core=raw.get("threads_per_core", 2),
        arch=raw["arch"],
        imex_channel=raw.get("imex_channel", False),
        unverified=raw.get("unverified", ""),
        notice=raw.get("notice", ""),
    )


@cache
def load_instance_types(path: Path = TABLE) -> dict[str, InstanceType]:
    """Read and schema-check the instance table; problems name ``file:line``."""
    located = yamlsrc.load(path)
    if not isinstance(located.data, dict):
        raise UserError(f"{path}: expected a mapping with sources and instances")
    check_schema(located, "instances")
    sources = located.data["sources"]
    return {
        name: _row(name, raw, sources, located.where(("instances", name, "source")))
        for name, raw in located.data["instances"].items()
    }


def instance_names(path: Path = TABLE) -> list[str]:
    """The table's instance types, read without the schema check (shell completion asks on
    every Tab; every task that uses a row loads the checked table)."""
    data = yamlsrc.load(path).data
    rows = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(rows, dict):
        raise UserError(f"{path}: expected a mapping with sources and instances")
    return [str(name) for name in rows]


class _Table(Mapping[str, InstanceType]):
    """The instance table, read on first use rather than at import: shell completion imports
    this module on every Tab and never looks a type up (nor should it load jsonschema)."""

    def _rows(self) -> dict[str, InstanceType]:
        return load_instance_types()

    def __getitem__(self, name: str) -> InstanceType:
        return self._rows()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows())

    def __len__(self) -> int:
        return len(self._rows())


INSTANCE_TYPES: Mapping[str, InstanceType] = _Table()


def get_instance_type(name: str) -> InstanceType:
    """The table row for ``name``; an unknown name is a :class:`UserError` listing known ones."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        known = ", ".join(sorted(INSTANCE_TYPES))
        raise UserError(
            f"--instance-type {name!r} is not in the instance table {TABLE.name} ({known})"
        ) from None


def job_memory_mib(instance: InstanceType) -> int:
    """Memory (MiB) to request per node: installed memory less a buffer for the agent and OS.

    The buffer is 5 % of the installed memory, at least 2 GiB, and the result is rounded down
    to a whole GiB so the number reads well in the console.
    """
    reserve = max(MEMORY_RESERVE_MIN_MIB, int(instance.memory_mib * MEMORY_RESERVE_FRACTION))
    return (instance.memory_mib - reserve) // 1024 * 1024
