"""EC2 instance types a stack can run on under AWS Batch, and what a job definition needs of them.

Each row carries the source of its numbers. Memory is the installed memory in MiB (GiB x 1024);
the job definition asks for less (see :func:`job_memory_mib`), because Batch can only place a
job on an instance whose *registered* memory (installed memory minus kernel and agent) covers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from matrix.errors import UserError

_EC2_DOCS = "docs.aws.amazon.com/ec2/latest/instancetypes (accelerated / compute optimized specs)"
_EFA_DOCS = "docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html"
_FACTS = "shared/facts/stack-versions-and-recipes.md"

# Batch docs recommend keeping a 5 % memory buffer for the ECS agent and system processes
# (docs.aws.amazon.com/batch/latest/userguide/ecs-reserved-memory.html).
MEMORY_RESERVE_FRACTION = 0.05
MEMORY_RESERVE_MIN_MIB = 2048


@dataclass(frozen=True)
class InstanceType:
    """What one EC2 instance type offers a Batch multi-node job.

    ``gpus`` counts NVIDIA GPUs (Batch's ``GPU`` resource); ``hpus`` counts Habana Gaudi
    accelerators, which Batch does not schedule as a resource (the DL1 job runs privileged).
    ``efa_interfaces`` is the number of EFA devices, one ``/dev/infiniband/uverbsN`` each;
    ``efa_rdma_read`` tells whether EFA on this type supports RDMA reads (GPUDirect RDMA).
    ``shm_mib`` is the ``/dev/shm`` size to give the container.
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

    @property
    def accelerators(self) -> int:
        """GPUs or HPUs per instance (0 for CPU-only types)."""
        return self.gpus or self.hpus

    @property
    def has_efa(self) -> bool:
        """Whether the type has at least one EFA interface."""
        return self.efa_interfaces > 0

    def slots_per_node(self) -> int:
        """Ranks to start per node: one per accelerator, else one per physical core."""
        return self.accelerators or max(1, self.vcpus // 2)


INSTANCE_TYPES: dict[str, InstanceType] = {
    row.name: row
    for row in (
        InstanceType(
            name="p3.16xlarge",
            vcpus=64,
            memory_mib=488 * 1024,
            gpus=8,
            hpus=0,
            efa_interfaces=0,
            efa_rdma_read=False,
            shm_mib=8192,
            source=f"{_EC2_DOCS}: 8x V100, 64 vCPU, 488 GiB, no EFA; shm: project choice",
        ),
        InstanceType(
            name="p3dn.24xlarge",
            vcpus=96,
            memory_mib=768 * 1024,
            gpus=8,
            hpus=0,
            efa_interfaces=1,
            efa_rdma_read=False,
            shm_mib=8192,
            source=(
                f"{_EC2_DOCS}: 8x V100 32 GB, 96 vCPU, 768 GiB, 1 EFA; {_FACTS} 1.1/2.1 "
                "(no GPUDirect RDMA over EFA); shm: project choice"
            ),
        ),
        InstanceType(
            name="p4d.24xlarge",
            vcpus=96,
            memory_mib=1152 * 1024,
            gpus=8,
            hpus=0,
            efa_interfaces=4,
            efa_rdma_read=True,
            shm_mib=8192,
            source=(
                f"{_EC2_DOCS}: 8x A100, 96 vCPU, 1152 GiB, 4 EFA; {_EFA_DOCS} (RDMA read); "
                f"{_FACTS} 5 (4 uverbs devices, sharedMemorySize 8192 in ADT p4d template)"
            ),
        ),
        InstanceType(
            name="p5.48xlarge",
            vcpus=192,
            memory_mib=2048 * 1024,
            gpus=8,
            hpus=0,
            efa_interfaces=32,
            efa_rdma_read=True,
            shm_mib=49152,
            source=(
                f"{_EC2_DOCS}: 8x H100, 192 vCPU, 2048 GiB, 32 EFA; {_EFA_DOCS} (RDMA read); "
                f"{_FACTS} 5 (32 uverbs devices, sharedMemorySize 49152 in ADT p5 template)"
            ),
        ),
        InstanceType(
            name="dl1.24xlarge",
            vcpus=96,
            memory_mib=768 * 1024,
            gpus=0,
            hpus=8,
            efa_interfaces=1,
            efa_rdma_read=False,
            shm_mib=64000,
            source=(
                f"{_FACTS} 4 and 5: 8 Gaudi HPUs, 96 vCPU, 768 GB, 1 EFA, sharedMemorySize "
                "64000 (AWS Batch DL1 workshop job definition); RDMA read: not in the list the "
                "entrypoint uses (p4d/p4de, p5*, p6, trn1/trn2; entrypoint/fabric.py)"
            ),
        ),
        InstanceType(
            name="c5n.18xlarge",
            vcpus=72,
            memory_mib=192 * 1024,
            gpus=0,
            hpus=0,
            efa_interfaces=1,
            efa_rdma_read=False,
            shm_mib=4096,
            source=f"{_EC2_DOCS}: 72 vCPU, 192 GiB, 1 EFA (CPU type for cpu-tcp); shm: choice",
        ),
    )
}


def get_instance_type(name: str) -> InstanceType:
    """The table row for ``name``; an unknown name is a :class:`UserError` listing known ones."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        known = ", ".join(sorted(INSTANCE_TYPES))
        raise UserError(
            f"--instance-type {name!r} is not in the instance table ({known})"
        ) from None


def job_memory_mib(instance: InstanceType) -> int:
    """Memory (MiB) to request per node: installed memory less a buffer for the agent and OS.

    The buffer is 5 % of the installed memory, at least 2 GiB, and the result is rounded down
    to a whole GiB so the number reads well in the console.
    """
    reserve = max(MEMORY_RESERVE_MIN_MIB, int(instance.memory_mib * MEMORY_RESERVE_FRACTION))
    return (instance.memory_mib - reserve) // 1024 * 1024
