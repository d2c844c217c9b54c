"""The plan's scheduler-dependent parts: which launcher a role runs, the node table a scheduler
gives before any rendezvous, the master a scheduler names, and a launcher role's SSH.

``make.make_plan`` calls these with the scheduler's ``NodeTable`` (``cfg.node``) and reads only its
typed fields; it stays the one decision for every scheduler, and names none of them nor any
launcher (the units and ``launchers.ROLE_DEFAULTS`` do). What each role runs:

- ``single``: the command, or the launcher on this node only (as before schedulers).
- ``main``/``child`` with ``rendezvous`` (AWS Batch, and a Slurm step of one task per node whose
  launcher needs SSH: ``settings.wiring``): the entrypoint wires the nodes (``main``).
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
from ..schedulers import torchenv


def requested(plan: Any, cfg: Any, count: int, command: List[str] = ()) -> str:
    """The launcher this role runs: ``MNP_LAUNCHER`` where it can work there, else the role's
    own; what cannot work is a plan problem naming the scheduler's way to do it. A command that
    is itself a launcher is ``launcher_command``'s."""
    mode = cfg.mode
    own = launchers.launcher_command(list(command))
    if own and mode not in ("rank", "worker"):
        return launcher_command(plan, cfg, own, list(command))
    if mode == "single":
        return launchers.AS_IS if not cfg.launcher_explicit and count == 1 else cfg.launcher
    if mode in ("main", "child") and cfg.rendezvous:
        return cfg.launcher
    wanted = cfg.launcher if cfg.launcher_explicit else launchers.ROLE_DEFAULTS.get(
        mode, launchers.EVERY_NODE)
    if mode in ("rank", "worker"):
        _not_used(plan, cfg, wanted)
        return launchers.AS_IS
    plan.problems.extend(_cannot_work(cfg, wanted))
    return wanted


def launcher_command(plan: Any, cfg: Any, own: str, command: List[str]) -> str:
    """The command starts a launcher itself (``torchrun ...``, ``mpirun ...``, as users copy
    their command lines). It runs as given where nothing would wrap it: on one node, or where a
    scheduler wired the nodes and MNP_LAUNCHER is unset (its torchrun reads the scheduler's
    ``PET_*``, its mpirun the allocation or the operator's hostfile), and with
    ``MNP_LAUNCHER=none``. Where the entrypoint would start a launcher around it (AWS Batch's
    default, or MNP_LAUNCHER naming one) it is refused with one line: a launcher inside a
    launcher nests jobs, and the copied line's own node count, rank, master or hostfile cannot
    be right on nodes whose addresses only the rendezvous learns."""
    explicit = cfg.launcher_explicit
    if explicit and cfg.launcher == launchers.AS_IS:
        if _every_node_unwired(cfg):
            plan.problems.append(_as_is_on_every_node(cfg, own, command))
        return launchers.AS_IS
    if not explicit and not (cfg.rendezvous and cfg.mode in ("main", "child")):
        plan.notes.append("the command starts %s itself: run as is%s (to have the entrypoint "
                          "launch it, give the program alone and set MNP_LAUNCHER)" % (
                              own, " on this node" if cfg.mode == "single" else
                              ", with the scheduler's variables"))
        return launchers.AS_IS
    plan.problems.append(_nested(cfg, own, command))
    return cfg.launcher


def _every_node_unwired(cfg: Any) -> bool:
    """True on a node of a multi-node step whose scheduler started one entrypoint per node and
    gives a launcher nothing to reach the other nodes with (a Slurm step: it has a
    ``wiring_id``, which only ``settings.wiring`` turns into a rendezvous, and not for ``none``):
    a command run as is there runs on every node, each time alone."""
    node = cfg.node
    return (cfg.mode in ("main", "child") and not cfg.rendezvous and cfg.num_nodes > 1
            and node is not None and node.wiring_id is not None)


def _as_is_on_every_node(cfg: Any, own: str, command: List[str]) -> str:
    """The one line for ``MNP_LAUNCHER=none`` with a launcher command on such a step: what works
    instead (the program alone with the launcher's unit, which wires the nodes where it must)."""
    unit = launchers.command_unit(command) or launchers.ROLE_DEFAULTS["launcher"]
    how = ("the entrypoints wire the step's nodes and node 0 runs it over the job's own SSH"
           if not launchers.UNITS[unit].starts_without_ssh else
           "every node runs it with its own node rank and the master from the node list")
    return ("the command starts %s itself and MNP_LAUNCHER=none runs it as is on each of the %d "
            "nodes of this %s step, with no hostfile, SSH or secret: %d separate jobs. Give the "
            "program alone (e.g. -- python3 train.py) with MNP_LAUNCHER=%s (%s; its own options "
            "in MNP_LAUNCHER_ARGS); MNP_LAUNCHER=none is for a program every task runs itself"
            % (own, cfg.num_nodes, cfg.node.scheduler, cfg.num_nodes, unit, how))


def _nested(cfg: Any, own: str, command: List[str]) -> str:
    """The one line for a launcher command the entrypoint would wrap in another launcher."""
    why = ("MNP_LAUNCHER=%s" % cfg.launcher if cfg.launcher_explicit
           else "MNP_LAUNCHER's default where the entrypoint wires the nodes")
    suggest = launchers.command_unit(command) or cfg.launcher
    as_is = ", or set MNP_LAUNCHER=%s to run the command as is" % launchers.AS_IS
    if cfg.node is not None and cfg.node.wiring_id is not None:
        # a Slurm step: there none wires nothing and runs the command on every node
        as_is = ""
    elif not cfg.rendezvous:
        as_is += " with the scheduler's variables"
    elif launchers.UNITS[suggest].reaches_hosts:  # one process on the main node reaches all
        as_is += (" on the main node, with the job's hostfile and SSH ready (only the variables "
                  "it passes itself reach the other nodes)")
    else:  # it would start on the main node alone
        as_is = ""
    return ("the command starts %s itself and the entrypoint would start %s around it (%s): "
            "give the program alone (e.g. -- python3 train.py) with MNP_LAUNCHER=%s and %s's "
            "own options in MNP_LAUNCHER_ARGS%s" % (own, cfg.launcher, why, suggest, suggest,
                                                    as_is))


def _where(node: Any) -> str:
    return "%s (%s)" % (node.scheduler, node.detected_from or "MNP_SCHEDULER")


def _not_used(plan: Any, cfg: Any, wanted: str) -> None:
    if cfg.launcher_explicit and wanted != launchers.AS_IS:
        plan.notes.append("MNP_LAUNCHER=%s not used: this process is %s under %s" % (
            wanted, "already one rank" if cfg.mode == "rank" else "an MPIJob worker",
            _where(cfg.node)))


def _cannot_work(cfg: Any, wanted: str) -> List[str]:
    """Why ``wanted`` cannot start this role's ranks under the scheduler, one line each."""
    mode, node, where = cfg.mode, cfg.node, _where(cfg.node)
    unit = launchers.UNITS[wanted]
    problems = []
    if mode == "launcher" and not unit.reaches_hosts:
        problems.append("MNP_LAUNCHER=%s cannot start ranks on the other nodes from %s: use %s "
                        "(the default here), or run the entrypoint once per node (srun "
                        "--ntasks-per-node=1 mnp-entrypoint ...)"
                        % (wanted, where, launchers.ROLE_DEFAULTS["launcher"]))
    if mode in ("main", "child", "peer") and not unit.starts_without_ssh:
        problems.append("MNP_LAUNCHER=%s needs SSH between the nodes, which %s does not serve: "
                        "use %s (the default here)%s" % (
                            wanted, where, launchers.EVERY_NODE,
                            ", or " + node.other_ways if node.other_ways else ""))
    tasks = node.tasks_here()
    if mode in ("main", "child") and tasks > 1 and wanted != launchers.AS_IS:
        problems.append("%d tasks of this Slurm step run on this node and each would start "
                        "its own %s: use srun --ntasks-per-node=1 (%s starts the node's "
                        "processes) or srun --mpi=pmix (every task is a rank)"
                        % (tasks, wanted, wanted))
    if mode == "peer" and not unit.joins_elastic:
        problems.append("%s assigns node ranks through an elastic rendezvous "
                        "(PET_RDZV_ENDPOINT): only MNP_LAUNCHER=%s joins it"
                        % (where, launchers.ROLE_DEFAULTS["peer"]))
    return problems


def slots(plan: Any, cfg: Any, facts: Any) -> Optional[Tuple[int, str]]:
    """Processes per node a job's spec gives torchrun (``PET_NPROC_PER_NODE`` as a number, or
    torchrun's word counted here as torchrun counts it; a word torchrun would stop on, or whose
    count depends on its release, is a problem), or None: a scheduler's task counts are tasks,
    not torchrun's processes."""
    node = cfg.node
    if node is not None and node.nproc_word:
        count, why = torchenv.resolve(node.nproc_word, facts.gpus, facts.hpus,
                                      os.cpu_count() or 1, facts.slots_source)
        if count is None:
            plan.problems.append(why)
            return None
        return count, why
    if node is None or node.slots_are != "processes" or not node.slots:
        return None
    return node.slots[0], "the scheduler: %s" % node.extra.get("nproc per node", "")


def table(cfg: Any, facts: Any, count: int) -> Optional[List[NodeInfo]]:
    """The node table of a scheduler that names its nodes (Slurm's list, the MPIJob hostfile), or
    the main node and this one with placeholders; None when ``make`` builds Batch's."""
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
    """The master address and port a scheduler gives (its DNS name, its open port) where it
    gives them, else node 0's address and ``MNP_MASTER_PORT``."""
    node = cfg.node
    if node is None or cfg.rendezvous:
        return default_master, cfg.master_port
    return node.main_address or default_master, node.master_port or cfg.master_port


def children(plan: Any, cfg: Any, unit: Any) -> bool:
    """The ``children`` line for roles the scheduler wired; False for Batch and single."""
    if cfg.rendezvous or cfg.mode == "single":
        return False
    node = cfg.node
    elastic = node.elastic
    plan.children = {
        "launcher": "%s starts the ranks on the scheduler's hosts" % unit.name,
        "worker": "none: the launcher reaches this pod over SSH",
        "rank": "none: this process is one rank of a running job",
        "peer": "every node runs the same torchrun; the rendezvous at %s assigns node ranks"
                % (elastic.endpoint if elastic is not None else "?"),
    }.get(cfg.mode, "every node runs %s with its own node rank (the scheduler started one "
                    "entrypoint per node)" % unit.name)
    return True


def launcher_ssh(env: Any, cfg: Any, user_env: dict) -> None:
    """A launcher role's ssh where its scheduler has its own (an MPIJob launcher: the operator's
    ``OMPI_MCA_plm_rsh_args`` plus the options the scheduler's table names)."""
    node = cfg.node
    if cfg.mode != "launcher" or node is None or node.launcher_ssh is None:
        return
    ssh = node.launcher_ssh
    name = "OMPI_MCA_plm_rsh_args"
    theirs = user_env.get(name, "")
    value = (theirs + " " + ssh.options).strip() if ssh.options not in theirs else theirs
    user_env[name] = value
    env.set(name, value, ssh.reason, ssh.source)
