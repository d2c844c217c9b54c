"""The start-up gate, run by every node before any rank starts (``probe.health`` says what).

``basic``: the EFA preflight, then the plan's health checks (the node against its instance
table row) and free space, before sshd or the rendezvous. A failure is an infrastructure
failure on this node; a Batch child first registers and reports it, so the main node ends the
job at once and names the node.

``full``: once every node has joined, the bandwidth probe (``probe/bandwidth.py``) on every node
at once, bounded by ``health.FULL_BUDGET_S``; the main node's verdict names the slowest node and
its figure against the floor, and fails the job with the infrastructure code.
"""

import json
import os
import signal
import subprocess
import time

from ..core.errors import InfrastructureError, JobFailure
from ..core.log import log
from ..plan import checks
from ..probe import bandwidth, health
from . import outcome

PROBE_PREFIX = "MNP_BANDWIDTH "
# The cause a node reports with its status when it has no EFA device on an EFA plan: the main
# node of a wired job tells one bad host (infrastructure) from a job definition that passes no
# device to any node (configuration) by how many nodes report it.
NO_EFA_DEVICES = "no-efa-devices"


def blocking(problems):
    """The plan's problems that stop a run before the gate: all but a missing EFA device, which
    the gate decides (``basic``)."""
    return [p for p in problems if not p.startswith(checks.NO_EFA_DEVICES)]


def check_efa_devices(runner):
    """Raise ``InfrastructureError`` (with ``cause``) when the plan uses EFA with no device."""
    for problem in runner.plan.problems:
        if problem.startswith(checks.NO_EFA_DEVICES):
            exc = InfrastructureError("%s on node %s" % (problem, runner.node), node=runner.node)
            exc.cause = NO_EFA_DEVICES
            raise exc


def efa_verdict(num_nodes, lacking):
    """The job's ``Outcome`` once every node has answered and ``lacking`` (indices) have no EFA
    device on an EFA plan: all of them, the job definition passes none (configuration, the same
    on any host); only some, those hosts (infrastructure, retried elsewhere)."""
    names = ",".join(str(i) for i in sorted(lacking))
    if len(lacking) == num_nodes:
        return outcome.configuration(names, "no node has an EFA device (MNP_FABRIC=efa, no "
                                     "/dev/infiniband/uverbs*): the job definition passes none "
                                     "to the container (linuxParameters.devices)")
    return outcome.infrastructure(names, "node(s) %s have no EFA device (MNP_FABRIC=efa, no "
                                  "/dev/infiniband/uverbs*) while the others have: those hosts"
                                  % names.replace(",", ", "))


def basic(runner):
    """``None`` when this node passes; else its failure ``Outcome`` (after a Batch child has
    reported it to the main node: registered, never ready, its status and cause sent). A
    wired main node without EFA devices gets its ``Outcome`` back too (``cause`` set): it
    still runs the rendezvous, starting nothing, to learn whether any node has them."""
    try:
        check_efa_devices(runner)
        runner.check_preflight()
        check_health(runner)
    except JobFailure as exc:
        cfg = runner.cfg
        cause = getattr(exc, "cause", None)
        if not (cfg.rendezvous and (cfg.mode == "child" or cause)):
            raise
        log("error: %s" % exc)
        failed = outcome.of_error(exc, runner.node)
        failed.cause = cause
        if cfg.mode == "child":
            return runner.batch.report_failed_child(failed)
        return failed
    return None


def check_health(runner):
    """The plan's basic checks and free space; raises ``InfrastructureError`` naming the node."""
    record = runner.plan.health
    if not record or record["mode"] == "off":
        return
    started = time.monotonic()
    problems = health.failed(record["checks"]) + health.free_space()
    if problems:
        raise InfrastructureError("health check failed on node %s: %s"
                                  % (runner.node, "; ".join(problems)), node=runner.node)
    shown = ", ".join("%s %s >= %s" % (c["check"], c["found"], c["expected"])
                      for c in record["checks"]) or "no instance row"
    log("health (MNP_HEALTH=%s) basic checks passed in %.2fs: %s (%s); free space >= %d MiB"
        % (record["mode"], time.monotonic() - started, shown,
           record["instance_row"] or "instance type unknown", health.MIN_FREE_BYTES >> 20))


def probe_port(cfg):
    """The port the probe's rank 0 listens on: the first after MNP_MASTER_PORT that the
    entrypoint does not use itself (torchrun binds MNP_MASTER_PORT later)."""
    port = cfg.master_port + 1
    while port in (cfg.rendezvous_port, cfg.ssh_port, cfg.master_port):
        port += 1
    return port


def probe_argv(runner, table):
    cfg = runner.cfg
    plan = runner.plan.health["bandwidth"]
    python = runner.facts.binaries.get("python3") or "python3"
    main = [n for n in table if n.index == cfg.main_index][0]
    return [python, bandwidth.__file__.replace(".pyc", ".py"), "--master", main.address,
            "--address", runner.facts.address,
            "--port", str(probe_port(cfg)), "--nodes", str(len(table)),
            "--node", str(cfg.node_index), "--backend", plan["backend"],
            "--link-mib", str(plan["link_mib"]), "--allreduce-mib", str(plan["allreduce_mib"]),
            "--timeout", str(int(plan["budget_s"])),
            "--link-floor", str(plan["link_floor_gbps"]),
            "--link-timeout", "%g" % (plan["budget_s"] / 3.0)]


def full(runner, table):
    """The bandwidth probe on this node (all nodes run it at once); ``None`` when it passes or
    is not asked for, else the failure ``Outcome`` naming the slowest node."""
    record = runner.plan.health
    if not record or record["mode"] != "full" or len(table) < 2:
        return None
    plan = record["bandwidth"]
    started = time.monotonic()
    result, why = run_probe(probe_argv(runner, table), runner.plan.environment,
                            plan["budget_s"], runner.sup)
    took = time.monotonic() - started
    if result is None:
        log("bandwidth probe failed after %.1fs: %s" % (took, why))
        return outcome.infrastructure(runner.node, "bandwidth probe failed: %s" % why)
    missing = result.get("missing") or []
    if missing:  # another node's silence names that node, never this one
        names = ", ".join(map(str, missing))
        line = ("node(s) %s sent no bandwidth figures within %gs (the probe did not finish "
                "there)" % (names, plan["budget_s"]))
        log("health check failed after %.1fs: %s" % (took, line))
        return outcome.infrastructure(",".join(map(str, missing)), line)
    ok, slowest, line = health.verdict(result, plan)
    figures = health.link_figures(result["nodes"])
    for report in sorted(result["nodes"], key=lambda r: r["node"]):
        log("bandwidth node %d: received %s (forward ring), %s (reverse); link figure %.2f "
            "Gbit/s" % (report["node"], _received(report, "fwd", result),
                        _received(report, "rev", result), figures[report["node"]]))
    if ok:
        log("health (MNP_HEALTH=full) bandwidth probe passed in %.1fs: %s" % (took, line))
        return None
    if slowest in bounded_senders(result["nodes"]):
        line += "; below %.3f Gbit/s: %d MiB did not arrive within %.1fs" % (
            figures[slowest], plan["link_mib"], result.get("link_s") or plan["budget_s"])
    log("health check failed after %.1fs: %s" % (took, line))
    return outcome.infrastructure(slowest, "bandwidth below the floor on %s" % line)


def _received(report, way, result):
    if report.get("bound_" + way):
        return "below %.3f Gbit/s (not all within %.1fs)" % (report["in_" + way],
                                                           result.get("link_s") or 0)
    return "%.2f Gbit/s" % report["in_" + way]


def bounded_senders(reports):
    """The nodes whose send did not arrive in time somewhere: in the forward ring a node
    receives from the one before it, in the reverse ring from the one after it."""
    order = sorted(r["node"] for r in reports)
    by_node = dict((r["node"], r) for r in reports)
    senders = set()
    for pos, node in enumerate(order):
        if by_node[node].get("bound_fwd"):
            senders.add(order[(pos - 1) % len(order)])
        if by_node[node].get("bound_rev"):
            senders.add(order[(pos + 1) % len(order)])
    return senders


def run_probe(argv, env, budget, sup):
    """``(result, None)`` or ``(None, why)``; the probe is killed after ``budget`` seconds."""
    env = dict(env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env, universal_newlines=True,
                                start_new_session=True)
    except OSError as exc:
        return None, "cannot start %s: %s" % (argv[0], exc.strerror or exc)
    deadline = time.monotonic() + budget + 10
    while True:
        try:
            out, err = proc.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            if sup.signal_received or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                _, err = proc.communicate()
                for line in (err or "").splitlines()[-20:]:
                    log("probe: " + line)
                if sup.signal_received:
                    return None, "stopped by signal %d" % sup.signal_received
                return None, ("no result within %gs: a link is far below the floor or a node "
                              "did not start the probe" % budget)
    for line in out.splitlines():
        if line.startswith(PROBE_PREFIX):
            return json.loads(line[len(PROBE_PREFIX):]), None
    last = [x for x in (err or "").splitlines() if x.strip()]
    return None, "exit %s: %s" % (proc.returncode, last[-1] if last else "no output")
