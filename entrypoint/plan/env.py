"""The plan's environment: the variables the entrypoint sets, each with its reason and source.

``make_plan`` (``plan``) fills an ``Env`` from the version-dependent rows (``envtable``), the
library paths of the fabric, and the wiring of the job (root, SSH, hostfiles, ``MNP_*``), then
merges it with the user's environment (``merge``: the user's values win).
"""

import os
from typing import Any, Dict, List, Optional, Tuple

from ..core.nodes import NodeInfo
from ..probe import fabric
from . import envtable, hostfile

OFI_RENAME = ("https://github.com/aws/aws-ofi-nccl/blob/master/RELEASENOTES.md 'v1.15.0' (the "
              "plugin's own notes: default library name libnccl-net-ofi.so, a libnccl-net.so "
              "symlink unless --disable-nccl-net-symlink; NCCL_NET_PLUGIN=ofi selects it), "
              "https://github.com/aws/aws-ofi-nccl/pull/918")


class Env(object):
    """The variables the entrypoint sets, in order, each with its reason and source."""

    def __init__(self):
        self.entries = []

    def set(self, name: str, value: str, reason: str, source: str = "") -> None:
        for entry in self.entries:
            if entry["name"] == name:
                entry.update(value=value, reason=reason, source=source)
                return
        self.entries.append({"name": name, "value": value, "reason": reason, "source": source})

    def as_dict(self) -> Dict[str, str]:
        return dict((e["name"], e["value"]) for e in self.entries)


def table_rows(plan: Any, env: Env, facts: Any) -> None:
    """The version-dependent variables (``envtable``), and why the notable others are unset."""
    context = {"fabric": plan.fabric["kind"], "accelerator": facts.accelerator,
               "rdma": plan.fabric["rdma"],
               "nic": "ena" if facts.nic_vendor == fabric.ENA_VENDOR else "other",
               "present": sorted(facts.installed()),
               "nccl_node": bool(facts.versions.get("nccl")) or facts.accelerator == "gpu"}
    chosen = envtable.select(context, facts.versions, facts.interface)
    for row, value, guesses in chosen:
        reason = row.why + ("" if not guesses else " (guessed: %s)" % ", ".join(guesses))
        env.set(row.setting, value, reason, row.source)
    selected = set(row.setting for row, _, _ in chosen)
    for name in sorted(envtable.NOT_SET_REASONS):
        accelerators, reason = envtable.NOT_SET_REASONS[name]
        if name not in selected and facts.accelerator in accelerators:
            plan.not_set.append({"name": name, "reason": reason})


def wiring(env: Env, cfg: Any, facts: Any, table: List[NodeInfo],
           hostfiles: Optional[Dict[str, str]], need_ssh: bool) -> Tuple[str, int]:
    """Root, SSH and ``MNP_*`` variables; returns ``(master address, total processes)``."""
    if facts.is_root:
        for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
            env.set(name, "1", "running as root: Open MPI refuses otherwise",
                    "https://github.com/open-mpi/ompi/issues/4451")
    if need_ssh:
        ssh_config = os.path.join(cfg.state_dir, "ssh", "ssh_config")
        env.set("OMPI_MCA_plm_rsh_args", "-F %s" % ssh_config,
                "mpirun's ssh uses the per-job keys and known_hosts")
        if facts.binaries.get("pdsh"):
            env.set("PDSH_SSH_ARGS_APPEND", "-F %s" % ssh_config,
                    "pdsh's ssh uses the per-job keys and known_hosts")
        env.set("MNP_SSH_CONFIG", ssh_config, "the per-job ssh client settings")
    if hostfiles:
        env.set("MNP_HOSTFILE", hostfiles["openmpi"], "Open MPI/DeepSpeed hostfile")
        env.set("MNP_HOSTFILE_PLAIN", hostfiles["plain"], "one address per line")
        env.set("MNP_HOSTFILE_INTEL", hostfiles["intel"], "Intel MPI/MPICH hostfile")
    if cfg.mode in ("rank", "worker", "peer"):
        # a launcher above (or the MPIJob's) wired this job, or an elastic rendezvous will:
        # no node index or main address is known here to pass on
        return facts.address, len(table)
    master = "127.0.0.1" if cfg.mode == "single" else sorted(
        table, key=lambda n: n.index)[0].address
    np = cfg.np_override or hostfile.total_slots(table)
    env.set("MNP_NUM_NODES", str(len(table)), "nodes in the job")
    env.set("MNP_NODE_INDEX", str(cfg.node_index), "this node's index")
    env.set("MNP_NODE_ADDRESS", facts.address, "this node's address")
    env.set("MNP_MASTER_ADDRESS", master, "node 0's address: rank 0 and its store live there")
    env.set("MNP_NP", str(np), "total processes (MNP_NP or the sum of slots)")
    return master, np


def libraries(plan: Any, env: Env, kind: str, facts: Any) -> None:
    """``LD_LIBRARY_PATH`` for EFA's libfabric, the aws-ofi-nccl plugin and Habana's wrapper."""
    dirs = []
    why = []
    if kind == "efa":
        dirs += list(facts.libdirs)
        if facts.plugin_path:
            dirs.append(os.path.dirname(facts.plugin_path))
        why.append("EFA's libfabric and Open MPI%s" % (" and the aws-ofi-nccl plugin"
                                                      if facts.plugin_path else ""))
        if facts.plugin_ofi_only:
            env.set("NCCL_NET_PLUGIN", "ofi", "the plugin ships libnccl-net-ofi.so without the "
                    "libnccl-net.so name NCCL looks for", OFI_RENAME)
        if facts.accelerator == "gpu" and not facts.plugin_path:
            plan.notes.append("no aws-ofi-nccl plugin found: NCCL cannot use EFA")
    if facts.accelerator == "hpu" and kind == "efa":
        if facts.hccl_wrapper:
            dirs.insert(0, os.path.dirname(facts.hccl_wrapper))
            why.insert(0, "Habana's hccl_ofi_wrapper")
        else:
            plan.notes.append("no libhccl_ofi_wrapper.so found: HCCL cannot use EFA (the "
                              "hccl-ofi-wrapper layer installs it)")
    unique = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    if unique:
        env.set("LD_LIBRARY_PATH", ":".join(unique), " and ".join(why) + " (appended to yours)",
                envtable.HCCL_WRAPPER if facts.hccl_wrapper and kind == "efa" else "")


def merge(user_env: Dict[str, str], env: Env) -> Tuple[Dict[str, str], List[str]]:
    """The command's environment: the user's, plus ours where the user has no value (their
    values win; ``LD_LIBRARY_PATH``: theirs first, ours appended; ``MNP_*`` are always ours)."""
    full = dict(user_env)
    kept = []
    for entry in env.entries:
        name, value = entry["name"], entry["value"]
        if name == "LD_LIBRARY_PATH":
            current = [p for p in full.get(name, "").split(":") if p]
            extra = [p for p in value.split(":") if p and p not in current]
            full[name] = ":".join(current + extra)
            continue
        if name in user_env and not name.startswith("MNP_"):
            if user_env[name] != value:
                kept.append("%s=%s (ours: %s)" % (name, user_env[name], value))
            continue
        full[name] = value
    return full, kept
