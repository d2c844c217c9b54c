"""The node plan: one pure function of (settings, node facts) that the run executes and the dry
run prints.

``make_plan(cfg, facts, command, user_env, table, hostfiles)`` decides, without touching the
machine: the role, the address, the slots and their source, the fabric and why, every
environment variable the entrypoint sets with its reason and source (``env``, from the
``envtable`` rows), the launcher unit and its argv (``unit.launch(LaunchRequest)``), what runs on
children, the files to write (DeepSpeed's env file) and the problems that stop a real run (a
missing launcher program). The run writes ``files`` and starts ``argv`` with ``environment``;
``MNP_DRY_RUN=1`` prints ``text()``, ``MNP_DRY_RUN=json`` prints ``to_dict()`` as JSON (shape:
``record``). ``matrix.jobs.explain`` calls the same function with facts built from a stack's
declared versions and the instance table.
"""

import os
import shlex

from .. import launchers
from ..core.nodes import NodeInfo
from ..launchers import base, mpi
from ..probe import driver, fabric, health, preflight
from ..settings import config
from . import checks, hostfile, roles
from . import env as planenv
from .record import PLAN_VERSION, Plan, redact, redact_lines  # noqa: F401 (the plan's record)


def decide_fabric(mode, facts):
    """``(kind, why)`` from ``MNP_FABRIC`` and the node's EFA devices and ``fi_info``."""
    names = ", ".join(facts.efa_devices) or "none"
    if mode == "tcp":
        return "tcp", "MNP_FABRIC=tcp (uverbs devices: %s)" % names
    if mode == "efa":
        if not facts.efa_devices:
            return "efa", ("MNP_FABRIC=efa, although no /dev/infiniband/uverbs* device is "
                           "visible (pass it to the container)")
        return "efa", "MNP_FABRIC=efa (uverbs devices: %s)" % names
    if not facts.efa_devices:
        return "tcp", "no /dev/infiniband/uverbs* device in the container"
    count = len(facts.efa_devices)
    if facts.fi_info_efa is None:
        return "tcp", ("%d uverbs device(s) (%s) but fi_info -p efa failed or is not "
                       "installed" % (count, names))
    if not facts.fi_info_efa:
        return "tcp", ("%d uverbs device(s) (%s) but fi_info -p efa lists no efa provider"
                       % (count, names))
    return "efa", ("%d uverbs device(s) (%s) and fi_info -p efa finds the efa provider"
                   % (count, names))


def placeholder_table(cfg, facts, slots):
    """The node table before the rendezvous: this node's and the main node's addresses, the
    others as ``<node-N>``."""
    if cfg.mode == "single":
        return [NodeInfo(0, "localhost", slots, "")]
    table = []
    for index in range(cfg.num_nodes):
        if index == cfg.node_index:
            addr = facts.address
        elif index == cfg.main_index and cfg.main_address:
            addr = cfg.main_address
        else:
            addr = "<node-%d>" % index
        table.append(NodeInfo(index, addr, slots, ""))
    return table


def make_plan(cfg, facts, command, user_env, table=None, hostfiles=None):
    """The plan for this node. ``table`` is the node table (``None``: placeholders, for the dry
    run); ``hostfiles`` maps ``openmpi``/``plain``/``intel`` to paths, or ``None``."""
    plan = Plan()
    command = list(command)
    user_env = dict(user_env)
    for name in ("MNP_SECRET", "MNP_SECRET_FILE"):
        user_env.pop(name, None)
    _describe(plan, cfg, facts)
    count = _slots(plan, cfg, facts)
    if table is None:
        table = roles.table(cfg, facts, count) or placeholder_table(cfg, facts, count)
    plan.table = list(table)
    _fabric(plan, cfg, facts)
    plan.preflight = preflight.checks(plan.fabric["kind"], facts, _runs_ranks(cfg))
    unit = _unit(plan, cfg, facts, count, command)
    need_ssh = cfg.rendezvous and unit.needs_ssh

    env = planenv.Env()
    planenv.table_rows(plan, env, facts)
    planenv.libraries(plan, env, plan.fabric["kind"], facts)
    master, np = planenv.wiring(env, cfg, facts, table, hostfiles, need_ssh)
    _attempt_and_health(plan, env, cfg, facts)
    checks.node_limits(plan, facts, plan.fabric["kind"])
    checks.efa_devices(plan, facts, plan.fabric["kind"], _runs_ranks(cfg))
    checks.imex_channel(plan, facts, cfg.health, _runs_ranks(cfg))
    if cfg.mode == "main" and cfg.rendezvous and unit.needs_ssh:  # torchrun has no hostfile
        checks.duplicate_addresses(plan, table)
    hostfile_path = _hostfile_path(cfg, hostfiles)
    roles.launcher_ssh(env, cfg, user_env)
    options = unit_options(cfg, unit)
    launcher_args = cfg.launcher_args
    if unit.uses_mpi(facts, options, cfg.rendezvous):
        launcher_args = mpi.apply(plan, env, unit, facts.interface, user_env, cfg.launcher_args,
                                  hostfile_path if hostfiles else None)
    full, kept = planenv.merge(user_env, env)
    driver.apply(plan, env, full, facts, getattr(cfg, "driver_check", "on"))  # issue 33
    plan.kept.extend(kept)
    plan.notes.extend(unit.prepare_environment(full))
    _drop_task_env(plan, cfg, full)
    request = base.LaunchRequest(
        command, table, cfg.node_index, count, np, (master, cfg.master_port),
        roles.master(cfg, master), hostfile_path, base.export_names(full, cfg.export_env),
        launcher_args, full, user_env, facts, cfg.mode, cfg.rendezvous, cfg.state_dir, cfg.node,
        options, cfg.node.elastic if cfg.node is not None else None)
    _launch(plan, cfg, env, unit, request, table, full)
    _children(plan, cfg, facts, unit, table, need_ssh, command)
    plan.environment = full
    # what the entrypoint sets and the user did not override (those are listed in ``kept``)
    plan.env = [dict(e) for e in env.entries if full.get(e["name"]) == e["value"]
                or e["name"] == "LD_LIBRARY_PATH"]
    return plan


def _attempt_and_health(plan, env, cfg, facts):
    """``MNP_ATTEMPT`` for the command, and the start-up health gate's checks (issue 24)."""
    env.set("MNP_ATTEMPT", str(cfg.attempt), "which attempt of the job this is (1 first): above "
            "1, resume from your last checkpoint", cfg.attempt_source)
    kind = plan.fabric["kind"]
    results = health.checks(cfg.health, facts, kind, _runs_ranks(cfg))
    plan.health = health.plan_record(cfg.health, results, kind, facts.accelerator,
                                     facts.instance_type)
    if cfg.health == "full" and cfg.num_nodes > 1 and not facts.versions.get("pytorch"):
        plan.problems.append("MNP_HEALTH=full needs PyTorch in the image (the bandwidth probe "
                             "runs torch.distributed); use MNP_HEALTH=basic")


def _describe(plan, cfg, facts):
    """The plan's role, facts and address records."""
    plan.facts = facts.to_dict()
    plan.role = {"mode": cfg.mode, "node_index": cfg.node_index, "num_nodes": cfg.num_nodes,
                 "main_index": cfg.main_index, "main_address": cfg.main_address,
                 "rendezvous": cfg.rendezvous}
    if cfg.node is not None:  # which scheduler, from which variable, and what it says
        plan.role.update(scheduler=cfg.node.scheduler, detected_from=cfg.node.detected_from,
                         node=cfg.node.to_dict(), lines=cfg.node.lines())
        plan.problems.extend(cfg.node.problems)  # what the scheduler's variables leave undone
    plan.address = {"address": facts.address, "interface": facts.interface,
                    "reason": facts.address_reason}


def _hostfile_path(cfg, hostfiles):
    """The Open MPI hostfile a launcher reads; "" where the scheduler's hosts are used (Slurm's
    allocation, the operator's hostfile)."""
    if not (cfg.rendezvous or cfg.mode == "single"):
        return ""
    return hostfiles["openmpi"] if hostfiles else os.path.join(cfg.state_dir, "hostfile")


def unit_options(cfg, unit):
    """The unit's own settings (``Unit.options``), by variable name, as ``cfg`` holds them."""
    fields = dict((setting.name, setting.field) for setting in config.TABLE)
    unknown = [name for name in unit.options if not fields.get(name)]
    if unknown:
        raise ValueError("launcher unit %s: options %s are not settings of settings/config.py"
                         % (unit.name, ", ".join(unknown)))
    return dict((name, getattr(cfg, fields[name])) for name in unit.options)


# What an MPIJob worker runs in place of a command (``run.worker``), as its plan says it.
WORKER_SERVES = "sshd for the launcher; the container command is ignored"


def _launch(plan, cfg, env, unit, request, table, full):
    """The unit's argv and what comes with it, on the nodes that start a launcher; what it sets
    for the command goes into ``full``, the command's environment."""
    if cfg.mode == "child" and unit.needs_ssh and cfg.rendezvous:
        return  # the main node's launcher reaches this node over SSH
    if cfg.mode == "worker":  # an MPIJob worker serves sshd; its container command never runs
        plan.launcher["serves"] = WORKER_SERVES
        return
    launch = unit.launch(request)
    plan.argv = launch.argv
    plan.problems.extend(launch.problems)
    plan.notes.extend(launch.notes)
    plan.files.extend(launch.files)
    plan.launcher.update(launch.info)
    for name, (value, reason, source) in sorted(launch.environment.items()):
        full[name] = value
        if name not in request.user_env:
            env.set(name, value, reason, source)
    if cfg.rendezvous or cfg.mode == "single":
        plan.hostfile = hostfile.render_openmpi(table).splitlines()


def _slots(plan, cfg, facts):
    """Slots per node: ``MNP_SLOTS_PER_NODE`` or the detected count, with the source."""
    given = None if cfg.slots_override else roles.slots(plan, cfg, facts)
    if cfg.slots_override:
        count = cfg.slots_override
        source = "MNP_SLOTS_PER_NODE=%d (detected: %d from %s)" % (
            count, facts.slots, facts.slots_source)
    elif given:
        count, source = given
    else:
        count, source = facts.slots, facts.slots_source
    plan.slots = {"count": count, "source": source}
    return count


def _drop_task_env(plan, cfg, full):
    """Remove the task's own variables (``base.TASK_ENV``) from the command's environment where
    the entrypoints wired a scheduler's tasks: the launcher gives each rank its own."""
    if cfg.node is None or not cfg.node.wired_because:
        return
    found = [name for name in base.TASK_ENV if name in full]
    for name in found:
        del full[name]
    if found:
        plan.notes.append("removed from the launcher's environment (this task's own, set per "
                          "task by the scheduler or its container hooks): %s" % ", ".join(found))


def _runs_ranks(cfg):
    return cfg.node is None or cfg.node.runs_ranks


def _fabric(plan, cfg, facts):
    kind, why = decide_fabric(cfg.fabric, facts)
    if not _runs_ranks(cfg):
        why, note = _fabric_for_ranks_elsewhere(cfg, kind, why)
        plan.notes.append(note)
    rdma, rdma_why = fabric.rdma_capable(facts.instance_type, facts.gpu_names)
    if facts.instance_type:
        rdma_why = "%s (from %s)" % (rdma_why, facts.instance_source)
    plan.fabric = {"kind": kind, "why": why, "rdma": rdma, "rdma_why": rdma_why}
    if fabric.family_note(facts.instance_type):  # a type the table lacks: say which rows decide
        plan.notes.append(rdma_why)
    if facts.instance_type is None and kind == "efa" and facts.accelerator == "gpu":
        plan.notes.append("instance type unknown: set MNP_INSTANCE_TYPE for the RDMA settings")


def _fabric_for_ranks_elsewhere(cfg, kind, why):
    """``(why, note)`` on a node that runs no ranks: its fabric is the ranks' (its launcher passes
    the plan's variables to them), which ``MNP_FABRIC`` names; this node's devices say nothing."""
    if cfg.fabric != "auto":
        return ("MNP_FABRIC=%s, for the ranks on the other nodes (none runs here)" % kind,
                "no rank runs on this node (%s): the fabric is planned for the ranks its launcher "
                "starts elsewhere, and the EFA preflight is theirs" % cfg.node.scheduler)
    return why, ("MNP_FABRIC=auto decided the fabric from this node, which runs no ranks (%s): "
                 "set MNP_FABRIC to the ranks' fabric (efa or tcp), since the plan's variables "
                 "reach every rank" % cfg.node.scheduler)


def _unit(plan, cfg, facts, count, command=()):
    """The launcher unit: the command as is for one slot on one node unless a launcher was asked
    for; ``launchers.resolve`` may swap it for an older release's (its note says so)."""
    requested = roles.requested(plan, cfg, count, command)
    name, note = launchers.resolve(requested, facts.versions.get("pytorch"))
    if note:
        plan.notes.append(note)
    unit = launchers.UNITS[name]
    plan.launcher = unit.to_dict()
    plan.launcher.update(requested=cfg.launcher, unit=name)
    if not cfg.rendezvous and cfg.mode != "single":  # SSH only where the scheduler serves it
        plan.launcher["needs_ssh"] = unit.needs_ssh and cfg.mode == "launcher" and \
            cfg.node is not None and cfg.node.launcher_ssh is not None
    return unit


def _children(plan, cfg, facts, unit, table, need_ssh, command):
    """What children do, the rendezvous and SSH lines, and a missing sshd as a problem."""
    if cfg.mode == "single":
        plan.children = "none (single node)"
        return
    if roles.children(plan, cfg, unit):
        return
    plan.children = unit.on_children
    if cfg.mode == "child" and unit.needs_ssh and command:
        plan.notes.append("container command ignored on this node (the main node's %s reaches "
                          "it over SSH): %s" % (unit.name, " ".join(map(shlex.quote, command))))
    secret = "set (HMAC-SHA256)" if cfg.secret else "NOT SET: any host could join"
    if cfg.mode == "main":
        others = ", ".join(str(n.index) for n in table if n.index != cfg.main_index)
        plan.rendezvous = ("listen on port %d, wait up to %gs for nodes %s; secret %s"
                           % (cfg.rendezvous_port, cfg.wait_timeout, others, secret))
    else:
        plan.rendezvous = ("register with %s:%d (retrying up to %gs); secret %s; heartbeat "
                           "timeout %gs" % (cfg.main_address, cfg.rendezvous_port,
                                            cfg.wait_timeout, secret, cfg.heartbeat_timeout))
    if need_ssh:
        plan.ssh = ("sshd on port %d with a per-job host key; client key made by the main node; "
                    "StrictHostKeyChecking yes" % cfg.ssh_port)
        if not facts.binaries.get("sshd"):
            plan.problems.append("sshd not found (install openssh-server) but the %s launcher "
                                 "needs SSH; use MNP_LAUNCHER=%s to run without it"
                                 % (unit.name, launchers.EVERY_NODE))
