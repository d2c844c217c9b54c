"""The start-up health gate (``MNP_HEALTH=off|basic|full``): is this node what its instance type
promises, and (``full``) is every node's link as fast as its instance type's floor?

``basic`` (the default), on every node before sshd, the rendezvous or any rank, each check
against the instance table row it used (``instances``, rendered from
``matrix/model/instances.yaml``: the entrypoint cannot import ``matrix``):

- GPUs (``nvidia-smi -L``, ``/proc/driver/nvidia/gpus``, ``/dev/nvidia[0-9]*``) or Gaudi HPUs: at
  least the row's count;
- EFA devices (``/dev/infiniband/uverbs*``), on an EFA plan: at least the row's interfaces;
- ``/dev/shm``: at least the row's ``shm_mib`` (what the job definition and manifests give it);
- free space on every writable file system of the container (the job's mounts, its root, its
  state folder): at least ``MIN_FREE_BYTES``;
- the NCCL network plugin loads: the EFA preflight's check (``preflight``), on EFA plans.

The checks are a pure function of the node's facts (``checks``), so the dry run lists them with
their rows; only free space is measured when the gate runs (``free_space``).

``full`` adds a bounded bandwidth probe over the job's own fabric once every node has joined
(``bandwidth``, run by ``run.gate``): each node sends ``LINK_MIB`` to its neighbours in a ring,
both ways, and the job times an all-reduce; the slowest node's link is compared with
``FLOORS``. It never takes more than ``FULL_BUDGET_S`` seconds.
"""

import os

from .instances import INSTANCES, TABLE

MODES = ("off", "basic", "full")
# Below 1 GiB free a checkpoint of even a small model cannot be written, and pip's and
# PyTorch's caches fail: project choice, well under any data volume a job mounts.
MIN_FREE_BYTES = 1 << 30
# File systems whose free space matters (writable data); pseudo and memory file systems do not.
DATA_FILESYSTEMS = ("ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "overlay", "lustre", "nfs",
                    "nfs4", "fuse.s3fs", "fuse.mountpoint-s3", "efs")

# -- the bandwidth floors (``full``) ---------------------------------------------------------
# Each node's link: what it sends to and receives from its ring neighbours, one TCP flow each
# (gloo) or NCCL's transport between two GPUs (EFA). The TCP floor: a fifth of the 5 Gbit/s a
# single flow gets between EC2 instances outside a cluster placement group
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html,
# "Single-flow traffic": limited to 5 Gbps when the instances are not in one cluster placement
# group), so a healthy node passes with room and a broken or throttled link does not.
TCP_LINK_FLOOR_GBPS = 1.0
# Without an instance type (a workstation, ``invoke run``'s containers on one host) there is no
# EC2 figure to hold the link to: a fifth of gigabit Ethernet (IEEE 802.3ab), what any wired
# host moves, still catches a throttled or broken link. Project choice.
LOCAL_LINK_FLOOR_GBPS = 0.2
LOCAL_SOURCE = "no instance type: a fifth of gigabit Ethernet (IEEE 802.3ab), project choice"
# The all-reduce of ALLREDUCE_MIB over every GPU of the job, as nccl-tests reports it (bus
# bandwidth, GB/s): half of the lowest healthy figure aws-samples/awsome-distributed-training
# published for 256 MiB on two nodes (micro-benchmarks/nccl-tests/README.md at commit
# 0162aacd5da07d424e13f44bef8dd2c4cfcc66e4: section "Results", 2x p4de.24xlarge 69.89 / 69.64 GB/s
# out-of-place / in-place, 2x p5.48xlarge 342.81 / 346.46; section "Amazon EKS" step 4, 2x
# p5.48xlarge with EFA installer 1.28.0 and NCCL 2.18.5, 167.17 / 166.62). The probe times one
# all-reduce after a short warm-up, so its figure may include part of NCCL's connection set-up
# and lie below a long nccl-tests run's: half of the lowest published run leaves that margin;
# a node below it is broken, not slow. Rounded down. Types without a published run have no
# all-reduce floor (the link floor holds).
ALLREDUCE_FLOORS_GBS = {"p4d.24xlarge": 34.0, "p4de.24xlarge": 34.0, "p5.48xlarge": 83.0,
                        "p5e.48xlarge": 83.0}
ALLREDUCE_SOURCE = ("aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/"
                    "README.md Results and Amazon EKS (256 MiB all_reduce busbw on two nodes): "
                    "half of the lowest healthy run, rounded down")
LINK_SOURCE = ("a fifth of the 5 Gbit/s single-flow limit, EC2 user guide "
               "ec2-instance-network-bandwidth.html")
LINK_MIB = 32
ALLREDUCE_MIB = 256
# The probe as a whole (start, join, both rings, the all-reduce) is stopped after this; a link
# too slow to move LINK_MIB in the time is reported as below LINK_MIB / FULL_BUDGET_S.
FULL_BUDGET_S = 60.0


def promise(instance_type):
    """``{"gpus", "hpus", "efa", "shm_mib"}`` of the table's row, or ``None``: what the type
    promises (the rows cite the EC2 pages each figure comes from; shm_mib is the project's)."""
    row = INSTANCES.get(instance_type or "")
    if row is None:
        return None
    return {"gpus": row.gpus, "hpus": row.hpus, "efa": row.efa_interfaces, "shm_mib": row.shm_mib}


def _row(instance_type, field, value):
    return "%s row %s: %s %s" % (TABLE, instance_type, field, value)


def checks(mode, facts, fabric_kind, runs_ranks=True):
    """The basic checks for the plan: ``[{"check", "found", "expected", "row", "ok"}]``; empty
    when ``mode`` is off or the instance type (and so its row) is unknown.

    A node that runs no ranks (an MPIJob launcher pod) has no check against the row: the row
    describes the nodes its launcher reaches, not this one. The operator gives the launcher no
    ``nvidia.com/gpu`` or EFA device and blanks ``NVIDIA_VISIBLE_DEVICES``, and ``invoke k8s``
    pins it to no instance type, so its GPUs, EFA devices and ``/dev/shm`` say nothing about the
    job (the EFA preflight is skipped there for the same reason: ``preflight.checks``)."""
    if mode == "off":
        return []
    row = promise(facts.instance_type)
    if row is None or not runs_ranks:
        return []
    itype = facts.instance_type
    out = []
    if row["gpus"]:
        out.append(_count("GPUs", facts.gpus, row["gpus"], facts.slots_source,
                          _row(itype, "gpus", row["gpus"])))
    if row["hpus"]:
        out.append(_count("Gaudi HPUs", facts.hpus, row["hpus"], facts.slots_source,
                          _row(itype, "hpus", row["hpus"])))
    if row["efa"] and fabric_kind == "efa":
        out.append(_count("EFA devices", len(facts.efa_devices), row["efa"],
                          "/dev/infiniband/uverbs*", _row(itype, "efa_interfaces", row["efa"])))
    return out + _shm(facts, row, itype)


def _shm(facts, row, itype):
    """The ``/dev/shm`` check, where the node's size is known."""
    if facts.shm_bytes is None:
        return []
    found = facts.shm_bytes >> 20
    # tmpfs sizes are rounded to pages: allow 1 %
    return [{"check": "/dev/shm MiB", "found": found, "expected": row["shm_mib"],
             "where": "statvfs /dev/shm", "row": _row(itype, "shm_mib", row["shm_mib"]),
             "ok": found * 100 >= row["shm_mib"] * 99}]


def _count(what, found, expected, where, row):
    return {"check": what, "found": found, "expected": expected, "where": where, "row": row,
            "ok": found >= expected}


def failed(results):
    """One line per failed check: what was found, where, and the row it was compared with."""
    return ["%s: %s found (%s), fewer than the %s the instance type promises (%s)"
            % (r["check"], r["found"], r["where"], r["expected"], r["row"])
            for r in results if not r["ok"]]


def mounts(text):
    """``[(mount point, fstype, read_only)]`` of /proc/self/mounts ``text``."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        out.append((point, parts[2], "ro" in parts[3].split(",")))
    return out


def free_space(mounts_text=None, statvfs=os.statvfs, minimum=MIN_FREE_BYTES):
    """Lines for the writable data file systems with less than ``minimum`` bytes free (one per
    file system: bind mounts of one device are checked once)."""
    if mounts_text is None:
        try:
            with open("/proc/self/mounts") as handle:
                mounts_text = handle.read()
        except (OSError, IOError):
            return []
    seen = set()
    low = []
    for point, fstype, read_only in mounts(mounts_text):
        if read_only or not (fstype in DATA_FILESYSTEMS or fstype.startswith("fuse.")):
            continue
        try:
            st = statvfs(point)
        except (OSError, IOError):
            continue
        key = (st.f_fsid, st.f_blocks) if hasattr(st, "f_fsid") else point
        if key in seen or not st.f_blocks:
            continue
        seen.add(key)
        free = st.f_bavail * st.f_frsize
        if free < minimum:
            low.append("%s (%s) has %d MiB free, below the %d MiB a job needs to write its "
                       "checkpoints" % (point, fstype, free >> 20, minimum >> 20))
    return low


def plan_record(mode, results, fabric_kind, accelerator, instance_type):
    """What the dry run shows: the mode, each basic check with its row, and what ``full``
    adds (the probe, its floors and its bound)."""
    record = {"mode": mode, "checks": results,
              "free_space": "each writable file system has at least %d MiB free"
                            % (MIN_FREE_BYTES >> 20) if mode != "off" else None,
              "instance_row": instance_type if promise(instance_type) else None,
              "bandwidth": None}
    if mode == "full":
        record["bandwidth"] = bandwidth_plan(fabric_kind, accelerator, instance_type)
    return record


def bandwidth_plan(fabric_kind, accelerator, instance_type):
    """The full probe's backend, sizes, floors and time bound."""
    nccl = accelerator == "gpu"
    floor = ALLREDUCE_FLOORS_GBS.get(instance_type or "") if nccl else None
    known = bool(instance_type)
    return {"backend": "nccl" if nccl else "gloo", "link_mib": LINK_MIB,
            "allreduce_mib": ALLREDUCE_MIB,
            "link_floor_gbps": TCP_LINK_FLOOR_GBPS if known else LOCAL_LINK_FLOOR_GBPS,
            "link_source": LINK_SOURCE if known else LOCAL_SOURCE, "allreduce_floor_gbs": floor,
            "allreduce_source": ALLREDUCE_SOURCE if floor else None,
            "budget_s": FULL_BUDGET_S, "fabric": fabric_kind}


def link_figures(nodes):
    """Each node's link figure (Gbit/s) from every node's ``{"node", "in_fwd", "in_rev"}``
    (what it received from its ring neighbours): the best of what it sent (as the two nodes
    that received it measured) and the best of what it received. A node with one slow
    neighbour is not the slow node; a node all of whose links are slow is."""
    by_node = dict((r["node"], r) for r in nodes)
    order = sorted(by_node)
    count = len(order)
    figures = {}
    for pos, node in enumerate(order):
        after = by_node[order[(pos + 1) % count]]  # received this node's forward ring send
        before = by_node[order[(pos - 1) % count]]  # received its reverse ring send
        sent = max(after["in_fwd"], before["in_rev"])
        received = max(by_node[node]["in_fwd"], by_node[node]["in_rev"])
        figures[node] = min(sent, received)
    return figures


def verdict(result, probe):
    """``(ok, slowest node, line)`` from the probe's ``{"nodes": [...], "busbw"}``."""
    figures = link_figures(result["nodes"])
    slowest = min(sorted(figures), key=lambda n: figures[n])
    floor = probe["link_floor_gbps"]
    link_line = "node %s: %.2f Gbit/s link bandwidth, floor %.2f Gbit/s (%s)" % (
        slowest, figures[slowest], floor, probe["link_source"])
    if figures[slowest] < floor:
        return False, slowest, link_line
    busbw = result.get("busbw")
    ar_floor = probe.get("allreduce_floor_gbs")
    if ar_floor and busbw is not None and busbw < ar_floor:
        return False, slowest, ("all-reduce bus bandwidth %.1f GB/s, floor %.1f GB/s (%s); "
                                "slowest link %s" % (busbw, ar_floor, probe["allreduce_source"],
                                                     link_line))
    return True, slowest, "slowest " + link_line + (
        "; all-reduce bus bandwidth %.2f GB/s" % busbw if busbw is not None else "")
