"""Checks of the node against what the plan needs, each a note or a problem with its source:
``/dev/shm`` and the memlock limit NCCL (and EFA) need, and two nodes that share one address."""

# NCCL needs shared memory for its intra-node transport and pinned (locked) memory for EFA:
# Docker's 64 MiB /dev/shm and the default memlock limit are too small.
SHM_MIN_BYTES = 1 << 30
SHM_SOURCE = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html "
              "'Docker' (--shm-size=1g --ulimit memlock=-1)")


def node_limits(plan, facts, kind):
    """One line each when /dev/shm or the memlock limit is below what NCCL (and EFA) need."""
    if facts.accelerator != "gpu":
        return
    if facts.shm_bytes is not None and facts.shm_bytes < SHM_MIN_BYTES:
        plan.notes.append("/dev/shm is %d MiB, below the 1024 MiB NCCL needs between the GPUs of "
                          "a node: set linuxParameters.sharedMemorySize (MiB, e.g. 16384) in the "
                          "job definition (%s)" % (facts.shm_bytes >> 20, SHM_SOURCE))
    if facts.memlock is not None and facts.memlock != -1 and (
            kind == "efa" or facts.memlock < SHM_MIN_BYTES):
        plan.notes.append("the memlock limit is %d KiB, not unlimited as NCCL%s needs: set "
                          "ulimits [{name: memlock, softLimit: -1, hardLimit: -1}] in the job "
                          "definition (%s)" % (facts.memlock >> 10,
                                               " over EFA" if kind == "efa" else "", SHM_SOURCE))


def duplicate_addresses(plan, table):
    """Two nodes with one address would be one host to Open MPI and an error to DeepSpeed."""
    seen = {}
    for node in sorted(table, key=lambda n: n.index):
        if node.address.startswith("<"):
            continue
        if node.address in seen:
            plan.problems.append("nodes %d and %d both have the address %s: each node needs its "
                                 "own (awsvpc networking gives every container one)"
                                 % (seen[node.address], node.index, node.address))
        else:
            seen[node.address] = node.index


# A node told to use EFA that has no EFA device: a line of the plan (the dry run shows it), and at
# run time the start-up gate's finding (``run.gate``): on one host, that host (infrastructure);
# on every node of the job, the job definition that passes no device (configuration).
NO_EFA_DEVICES = "MNP_FABRIC=efa but no /dev/infiniband/uverbs* device is visible"


def efa_devices(plan, facts, kind, runs_ranks=True):
    """A problem when the plan uses EFA and the container sees no EFA device, on a node that
    runs ranks (an MPIJob launcher's pod has no EFA device by design: its ranks run elsewhere)."""
    if kind == "efa" and runs_ranks and not facts.efa_devices:
        plan.problems.append("%s: pass the instance's EFA devices to the container (the job "
                             "definition's linuxParameters.devices, `invoke jobdef` writes them "
                             "for an EFA instance type), or set MNP_FABRIC=tcp" % NO_EFA_DEVICES)


# What the health gate says on an instance type whose row has imex_channel (p6e-gb200): each
# fact from the row's [imex] source in matrix/model/instances.yaml.
IMEX_SOURCE = ("NVIDIA IMEX guide https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/"
               "imexchannels.html 'IMEX Channels'; NCCL v2.30.7-1 src/mnnvl.cc (ncclSystemError at "
               "communicator init without one)")


def imex_channel(plan, facts, health_mode, runs_ranks=True):
    """A problem when the node's instance type joins a multi-node NVLink domain (its row's
    ``imex_channel``) and the container sees no IMEX channel character device: NCCL's MNNVL
    fails at communicator init without one. Part of the start-up health gate (not with
    ``MNP_HEALTH=off``); only where the devices were probed (``facts.imex_channels`` is a list)."""
    from ..probe import fabric
    from ..probe.instances import INSTANCES

    row = INSTANCES.get(facts.instance_type or "")
    if (health_mode == "off" or not runs_ranks or row is None
            or not getattr(row, "imex_channel", False) or facts.imex_channels is None
            or facts.imex_channels):
        return
    plan.problems.append(
        "node %s (%s): no NVIDIA IMEX channel: no character device %s/channel<N> in the "
        "container, which multi-node NVLink needs [%s]. Give the job one: Slurm >= 24.05.2 "
        "SwitchType=switch/nvidia_imex (or a prolog that configures nvidia-imex and creates "
        "it), on EKS a ComputeDomain resource claim (NVIDIA DRA driver), with Docker "
        "--device %s/channel0 on a host with NVreg_CreateImexChannel0=1; or set "
        "NCCL_MNNVL_ENABLE=0 to run without multi-node NVLink"
        % (facts.address, facts.instance_type, fabric.IMEX_CHANNELS, IMEX_SOURCE,
           fabric.IMEX_CHANNELS))
