"""The plan's scheduler-dependent parts: which launcher a role runs, the node table a scheduler
gives before any rendezvous, the elastic torchrun line, and torchrun's ``PET_*`` variables.

``plan.make_plan`` calls these with the scheduler's ``NodeTable`` (``cfg.node``); it stays the one
decision for every scheduler. What each role runs:

- ``single``: the command, or the launcher on this node only (as before schedulers).
- ``main``/``child`` with ``rendezvous`` (AWS Batch): the entrypoint wires the nodes (``main``).
- ``main``/``child`` without (a Slurm one-task-per-node step, a PyTorchJob or TrainJob pod): the
  scheduler wired the nodes; every node runs torchrun with the scheduler's master address and
  port, node rank and node count. An SSH launcher cannot run there: nothing serves SSH.
- ``peer`` (an elastic PyTorchJob, or ``PET_RDZV_ENDPOINT`` set by hand): torchrun with the
  rendezvous endpoint, backend, ``MIN:MAX`` nodes, id and restart budget; ranks come from it.
- ``launcher`` (a Slurm batch script or ``salloc`` shell, an MPIJob launcher): ``mpirun`` over the
  scheduler's hosts. Open MPI inside a Slurm allocation reads it and starts its daemons through
  Slurm (no hostfile, no SSH); an MPIJob launcher uses the operator's hostfile and keys
  (``OMPI_MCA_orte_default_hostfile``, ``/root/.ssh``).
- ``worker`` (an MPIJob worker): sshd as the operator expects (``worker``).
- ``rank`` (already a rank of mpirun, ``srun --mpi=pmix``, torchrun): the command itself.
"""

import os
from typing import Any, List, Optional, Tuple

from .. import launchers
from ..core.nodes import NodeInfo

TORCHRUN_SOURCE = ("torch/distributed/argparse_util.py (env action: every torchrun option also "
                   "reads PET_<OPTION>)")
# The launcher a role runs when MNP_LAUNCHER is not set.
DEFAULTS = {"launcher": "mpirun", "peer": "torchrun", "rank": "none", "worker": "none"}
LOCAL = ("torchrun", "torch.distributed.launch", "none")  # start on every node, no SSH
# Commands that are themselves launchers: under a scheduler that wired the nodes they run as is.
LAUNCHER_PROGRAMS = ("torchrun", "mpirun", "mpiexec", "deepspeed", "srun", "horovodrun")
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch",
                    "deepspeed.launcher.runner")


def scheduled(cfg: Any) -> bool:
    """True when a scheduler other than Batch placed this node among others (no rendezvous)."""
    return cfg.mode in ("main", "child") and not cfg.rendezvous


def launcher_command(command: List[str]) -> Optional[str]:
    """The launcher the command itself calls (``torchrun train.py``, as Kubeflow's examples
    write it), or None."""
    if not command:
        return None
    program = os.path.basename(command[0])
    if program in LAUNCHER_PROGRAMS:
        return program
    if program.startswith("python") and len(command) > 2 and command[1] == "-m" and \
            command[2] in LAUNCHER_MODULES:
        return "%s -m %s" % (program, command[2])
    return None


def requested(plan: Any, cfg: Any, count: int, command: List[str] = ()) -> str:
    """The launcher this role runs: ``MNP_LAUNCHER`` where it can work there, else the role's
    own; what cannot work is a plan problem naming the scheduler's way to do it. Where a
    scheduler wired the nodes and the command is itself a launcher, the command runs as is
    (a launcher inside a launcher would nest jobs), with the scheduler's variables left for it."""
    mode = cfg.mode
    if mode == "single":
        return "none" if not cfg.launcher_explicit and count == 1 else cfg.launcher
    if mode in ("main", "child") and cfg.rendezvous:
        return cfg.launcher
    own = launcher_command(list(command))
    if own and not cfg.launcher_explicit and mode not in ("rank", "worker"):
        plan.notes.append("the command starts %s itself: run as is, with the scheduler's "
                          "variables (set MNP_LAUNCHER to have the entrypoint launch it)" % own)
        return "none"
    wanted = cfg.launcher if cfg.launcher_explicit else DEFAULTS.get(mode, "torchrun")
    node = cfg.node
    where = "%s (%s)" % (node.scheduler, node.detected_from or "MNP_SCHEDULER")
    if mode in ("rank", "worker"):
        if cfg.launcher_explicit and wanted != "none":
            plan.notes.append("MNP_LAUNCHER=%s not used: this process is %s under %s" % (
                wanted, "already one rank" if mode == "rank" else "an MPIJob worker", where))
        return "none"
    if mode == "launcher" and wanted not in ("mpirun", "deepspeed", "none"):
        plan.problems.append("MNP_LAUNCHER=%s cannot start ranks on the other nodes from %s: "
                             "use mpirun (the default here), or run the entrypoint once per node "
                             "(srun --ntasks-per-node=1 mnp-entrypoint ...)" % (wanted, where))
    if mode in ("main", "child", "peer") and wanted not in LOCAL:
        plan.problems.append("MNP_LAUNCHER=%s needs SSH between the nodes, which %s does not "
                             "serve: use torchrun (the default here)%s" % (
                                 wanted, where, ", or srun --mpi=pmix (every task is a rank) or "
                                 "mpirun from the batch script" if node.scheduler == "slurm"
                                 else ""))
    tasks = node.slots[node.node_rank] if (node.scheduler == "slurm" and node.slots and
                                           node.node_rank is not None) else 1
    if mode in ("main", "child") and tasks > 1 and wanted != "none":
        plan.problems.append("%d tasks of this Slurm step run on this node and each would start "
                             "its own %s: use srun --ntasks-per-node=1 (%s starts the node's "
                             "processes) or srun --mpi=pmix (every task is a rank)"
                             % (tasks, wanted, wanted))
    if mode == "peer" and wanted != "torchrun":
        plan.problems.append("%s assigns node ranks through an elastic rendezvous "
                             "(PET_RDZV_ENDPOINT): only MNP_LAUNCHER=torchrun joins it" % where)
    return wanted


def slots(cfg: Any) -> Optional[Tuple[int, str]]:
    """Processes per node a Kubeflow job's spec gives torchrun (``PET_NPROC_PER_NODE`` as a
    number), or None: Slurm's task counts are tasks, not torchrun's processes."""
    node = cfg.node
    if node is None or node.scheduler not in ("pytorchjob", "trainjob") or not node.slots:
        return None
    return node.slots[0], "the scheduler: %s" % node.extra.get("nproc per node", "")


def table(cfg: Any, facts: Any, count: int) -> Optional[List[NodeInfo]]:
    """The node table of a scheduler that names its nodes (Slurm's list, the MPIJob hostfile), or
    the main node and this one with placeholders; None when ``plan`` builds Batch's."""
    node = cfg.node
    if node is None or cfg.rendezvous or cfg.mode == "single":
        return None
    if cfg.mode in ("rank", "worker"):
        return [NodeInfo(0, facts.address, count, "")]
    if node.hosts:
        per = node.slots if (node.slots and cfg.mode == "launcher") else [count] * len(node.hosts)
        return [NodeInfo(i, host, per[i], "") for i, host in enumerate(node.hosts)]
    out = []
    for index in range(cfg.num_nodes):
        if index == cfg.main_index and node.main_address:
            addr = node.main_address
        elif index == cfg.node_index and node.node_rank is not None:
            addr = facts.address
        else:
            addr = "<node-%d>" % index
        out.append(NodeInfo(index, addr, count, ""))
    return out


def master(cfg: Any, default_master: str) -> Tuple[str, int]:
    """torchrun's master address and port: the scheduler's (its DNS name, its open port) where
    it gives them, else node 0's address and ``MNP_MASTER_PORT``."""
    node = cfg.node
    if node is None or cfg.rendezvous:
        return default_master, cfg.master_port
    port = node.extra.get("master port")
    return (node.main_address or default_master,
            int(port) if port and port.isdigit() else cfg.master_port)


def elastic_argv(prefix: List[str], cfg: Any, count: int, command: List[str]) -> List[str]:
    """The torchrun line of an elastic peer, from the node table's rendezvous facts."""
    extra = cfg.node.extra
    backend = extra.get("rdzv backend", "c10d").split(" ")[0]
    line = list(prefix) + ["--nnodes", extra.get("nnodes", "1:1"), "--nproc_per_node",
                           str(count), "--rdzv_backend", backend,
                           "--rdzv_endpoint", extra.get("rdzv endpoint", "")]
    for key, flag in (("rdzv id", "--rdzv_id"), ("max restarts", "--max_restarts"),
                      ("rdzv conf", "--rdzv_conf")):
        if extra.get(key):
            line += [flag, extra[key]]
    line += list(cfg.launcher_args)
    kind, rest = launchers.split_program(command)
    if kind == "module":
        return line + ["-m"] + rest
    if kind == "script":
        return line + rest
    return line + ["--no_python"] + rest


def clear_pet(plan: Any, full: dict, unit_name: str) -> None:
    """torchrun reads every option from ``PET_<OPTION>`` too: when the entrypoint writes
    torchrun's command line, the scheduler's ``PET_*`` values leave the command's environment,
    so no option comes from two places (single-node flags plus an inherited
    ``PET_RDZV_ENDPOINT`` would join every node's world into one store)."""
    if unit_name not in ("torchrun", "torch.distributed.launch"):
        return
    cleared = sorted(name for name in full if name.startswith("PET_"))
    for name in cleared:
        del full[name]
    if cleared:
        plan.notes.append("cleared %s: torchrun's command line carries what they say (%s)"
                          % (", ".join(cleared), TORCHRUN_SOURCE))


def children(plan: Any, cfg: Any, unit: Any) -> bool:
    """The ``children`` line for roles the scheduler wired; False for Batch and single."""
    if cfg.rendezvous or cfg.mode == "single":
        return False
    node = cfg.node
    plan.children = {
        "launcher": "%s starts the ranks on the scheduler's hosts" % unit.name,
        "worker": "none: the launcher reaches this pod over SSH",
        "rank": "none: this process is one rank of a running job",
        "peer": "every node runs the same torchrun; the rendezvous at %s assigns node ranks"
                % node.extra.get("rdzv endpoint", "?"),
    }.get(cfg.mode, "every node runs %s with its own node rank (the scheduler started one "
                    "entrypoint per node)" % unit.name)
    return True


MPIJOB_SSH = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"


def mpijob_ssh(env: Any, cfg: Any, user_env: dict) -> None:
    """An MPIJob launcher's ssh: the operator's ``OMPI_MCA_plm_rsh_args`` plus no host key
    checking, since every worker makes its host key when it starts (``worker``) and the operator
    distributes none (its base images say ``StrictHostKeyChecking no`` in ssh_config)."""
    node = cfg.node
    if cfg.mode != "launcher" or node is None or node.scheduler != "mpijob":
        return
    name = "OMPI_MCA_plm_rsh_args"
    theirs = user_env.get(name, "")
    value = (theirs + " " + MPIJOB_SSH).strip() if MPIJOB_SSH not in theirs else theirs
    user_env[name] = value
    env.set(name, value, "the operator's ssh options, and no host key checking: each worker "
            "makes its host key at start", "kubeflow/mpi-operator pkg/controller/"
            "mpi_job_controller.go (OMPI_MCA_plm_rsh_args)")
