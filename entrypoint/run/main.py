"""The flow: read who started this node (``config``: the scheduler's ``NodeTable``), probe the
node's facts once, compute the plan (``plan.make_plan``), then print it (``MNP_DRY_RUN``) or run
it. The run executes the plan's argv and environment; on AWS Batch it recomputes the plan with
the real node table after the rendezvous (``batchnodes``).

Single node (no scheduler variables, or one node): the command runs directly when there is one
slot and ``MNP_LAUNCHER`` is not set; otherwise through the launcher on this node only.

A node some other scheduler placed (Slurm, PyTorchJob, TrainJob, an MPIJob launcher, an elastic
torchrun peer, a rank of a running launcher): the plan's command runs here at once, supervised
like a single node's: signals are forwarded, its exit status is the entrypoint's. An MPIJob worker
serves SSH for the launcher (``worker``).

Batch main node (``batchnodes``):

1. start its own sshd (mpirun, deepspeed, none) with a fresh host key, make the job's client key;
2. start the rendezvous server and wait for every child, at most ``MNP_WAIT_TIMEOUT`` seconds;
   on timeout, name the missing indices, tell the registered children to stop, exit 1;
3. write the hostfiles and ``known_hosts``, send ``go`` to every child, start the launcher;
4. supervise: a lost child (infrastructure, 200), or a child that reports its ranks failed, stops
   the launcher and fails the job; SIGTERM/SIGINT are forwarded (the final line names the
   signal, 128+N); otherwise the exit status is the failed rank's own, read with its rank, node
   and exception from the launcher's output (``LauncherOutput``, ``attribution``; docs/
   entrypoint.md "The final line"); where a child's ranks and this node's both failed, the job's
   failure is the one seen first;
5. send ``done`` to every child and exit.

Batch child node:

1. start sshd with a fresh host key (mpirun, deepspeed, none);
2. register with the main node (retrying until ``MNP_WAIT_TIMEOUT``), receive the main node's
   client key into ``authorized_keys``, report ready;
3. on ``go``: torchrun (or torch.distributed.launch) starts here too; the SSH launchers need
   nothing more;
4. exit when the main node says ``done`` (promptly), when the main node vanishes (no message for
   ``MNP_HEARTBEAT_TIMEOUT`` seconds, 15 by default, so well within Batch's 30 s), or on SIGTERM.
   If sshd or the local launcher dies, the child tells the main node, which fails the job: a
   failed launcher's report carries its ranks' first failure (rank, exception, when).
"""

import contextlib
import json
import os
import shlex
import socket
import sys
import time

from ..core import errors
from ..core import log as log_mod
from ..core.errors import InfrastructureError, JobFailure, StartupError, UsageError
from ..core.log import log, out, printable, set_role
from ..launchers import mpirun, torchrun
from ..plan import hostfile
from ..plan import make as plan_mod
from ..probe import fabric, facts, netaddr, preflight
from ..rendezvous import server as rendezvous
from ..settings import config
from . import attribution, gate, lifecycle, outcome, ssh, tee, worker
from .batchnodes import BatchNodes
from .host import NodeHost

SECRET_VARIABLES = ("MNP_SECRET", "MNP_SECRET_FILE")
# After the launcher ended, how long its output may still take to arrive (a rank's last lines,
# torchrun's record): the final line comes after it.
OUTPUT_END_WAIT = 5.0
# A child reports its ranks failed after this node's own had: how long this node's launcher is
# given to end and say which of its ranks failed (torchrun looks every 5 s, --monitor_interval).
OWN_END_WAIT = 15.0


NO_COMMAND = ("no command given: set the training command as the container command on every "
              "node (the Batch job definition's containerProperties.command, e.g. "
              "`invoke jobdef ... -- python3 train.py`; `docker run IMAGE python3 train.py`)")


redact = plan_mod.redact


class Runner(NodeHost):
    """One node's run: probe, plan, then its role (``batchnodes`` for a Batch main or child)."""

    def __init__(self, cfg, command, environ=None):
        self.cfg = cfg
        self.command = list(command)
        self.environ = dict(os.environ if environ is None else environ)
        self.sup = lifecycle.Supervisor()
        self.paths = ssh.Paths(cfg.state_dir)
        self.facts = None
        self.plan = None  # the dry-run plan (placeholder node table)
        self.output = None  # the running launcher's ``LauncherOutput``
        self.batch = BatchNodes(self)  # the Batch roles, given this node as its ``NodeHost``

    # -- probing ---------------------------------------------------------------------------
    def probe(self):
        """Gather the node facts once; every later decision is ``plan.make_plan`` of them."""
        cfg = self.cfg
        try:
            self.facts = facts.probe(cfg, self.environ, imds=fabric.imds_instance_type)
        except netaddr.AddressError as exc:
            if cfg.interface:
                raise config.ConfigError("MNP_NETWORK_INTERFACE", str(exc)) from None
            if cfg.rendezvous:  # no route, no interface: this host's network, not the job
                raise InfrastructureError(str(exc)) from None
            self.facts = facts.probe(cfg, self.environ, imds=fabric.imds_instance_type,
                                     address=netaddr.Choice("127.0.0.1", None,
                                                            "no usable interface (%s)" % exc))
        self.plan = self.make_plan(None, None)

    @property
    def need_ssh(self):
        return self.plan.needs_ssh

    @property
    def local_launcher(self):
        """torchrun and torch.distributed.launch start on every node (no SSH)."""
        return not self.plan.launcher["needs_ssh"]

    @property
    def user(self):
        return self.facts.user

    @property
    def slot_count(self):
        return self.plan.slots["count"]

    def make_plan(self, table, hostfiles):
        return plan_mod.make_plan(self.cfg, self.facts, self.command, self.environ, table,
                                  hostfiles)

    def describe(self):
        cfg = self.cfg
        p = self.plan
        if cfg.rendezvous:
            log("%s node %d of %d (main node index %d%s)"
                % (cfg.mode, cfg.node_index, cfg.num_nodes, cfg.main_index,
                   ", main address %s" % cfg.main_address if cfg.main_address else ""))
            if cfg.node is not None and cfg.node.wired_because:  # a scheduler's nodes, ours to wire
                log("scheduler: %s (detected from %s); nodes wired by the entrypoint: %s"
                    % (cfg.node.scheduler, cfg.node.detected_from, cfg.node.wired_because))
        elif cfg.node is None or cfg.node.scheduler in ("single", "batch"):
            log("single node (no AWS Batch MNP variables)")
        else:
            for line in cfg.node.lines():
                log(line)
        log("address %s (%s)" % (p.address["address"], p.address["reason"]))
        log("slots %d: %s" % (p.slots["count"], p.slots["source"]))
        log("fabric %s: %s" % (p.fabric["kind"].upper(), p.fabric["why"]))
        versions = ", ".join("%s %s" % kv for kv in sorted(self.facts.versions.items()))
        if versions:
            log("versions: %s" % versions)
        log("launcher: %s" % p.launcher["unit"])
        for note in p.notes:
            log("  " + note)

    def prepare(self, plan):
        """Stop on the plan's problems (they were only lines in the dry run); write its files."""
        stop = gate.blocking(plan.problems)  # the gate has decided the rest
        if stop:
            raise StartupError(stop[0])
        for item in plan.files:
            if os.path.exists(item["path"]):
                log("replacing %s (%s)" % (item["path"], item["why"]))
            with open(item["path"], "w") as handle:
                handle.write(item["content"])

    # -- dry run ---------------------------------------------------------------------------
    def hostfile_paths(self):
        cfg = self.cfg
        if cfg.mode == "child" or (cfg.mode == "single" and self.plan.launcher["unit"] == "none"):
            return None
        if not (cfg.rendezvous or cfg.mode == "single"):
            return None  # the scheduler names the hosts (Slurm's allocation, MPIJob's hostfile)
        return {"openmpi": os.path.join(cfg.state_dir, "hostfile"),
                "plain": os.path.join(cfg.state_dir, "hostfile.plain"),
                "intel": os.path.join(cfg.state_dir, "hostfile.intel")}

    def dry_run_plan(self):
        """The plan the dry run prints: ``make_plan`` with the hostfiles this role writes."""
        return self.make_plan(None, self.hostfile_paths())

    def dry_run(self):
        """Print the plan; exit 1 when it has problems (a real run would stop at the first),
        the same rule as ``invoke explain``, so a pre-flight check can gate on the exit code."""
        plan = self.dry_run_plan()
        if self.cfg.dry_run == "json":
            out(json.dumps(plan.to_dict(), indent=2, sort_keys=True))
        else:
            out(plan.text())
        return 1 if plan.stops() else 0

    @property
    def node(self):
        """This node's name in the final line: its index in the job."""
        return self.cfg.node_index

    def run(self):
        """Probe, plan and run this node's part; the ``Outcome`` (an ``int`` for a dry run)."""
        cfg = self.cfg
        if not self.command and cfg.mode != "worker":  # an MPIJob worker only serves SSH
            # Every node, children included: the image has no default command, so a job
            # definition without one fails here instead of running something that succeeds.
            raise UsageError(NO_COMMAND)
        # Handlers first: as PID 1 a SIGTERM without a handler is dropped, and probing the
        # devices can take a minute. Until the plan is made a signal ends the run at once.
        self.sup.install_signal_handlers()
        self.sup.interruptible = True
        try:
            self.probe()
        except lifecycle.Interrupted as exc:
            log("signal %d while probing the node: stopping before anything started"
                % exc.signum)
            return outcome.stopped(self.node, exc.signum, cfg.scheduler)
        finally:
            self.sup.interruptible = False
        if self.sup.signal_received:
            return outcome.stopped(self.node, self.sup.signal_received, cfg.scheduler)
        if cfg.dry_run:
            return self.dry_run()
        self.describe()
        stop = gate.blocking(self.plan.problems)  # a line in the dry run, an error when running
        if stop:
            raise StartupError(stop[0])
        try:
            return self.run_role()
        finally:
            self.sup.stop_all(2)

    def run_role(self):
        """After the plan: the start-up checks, then this node's role."""
        cfg = self.cfg
        failed = gate.basic(self)  # a child reports its failure to the main node
        if failed is not None and not (cfg.mode == "main" and failed.cause):
            return failed
        if cfg.mode == "worker":
            return outcome.of_command(worker.serve(self), self.node, "sshd")
        if not cfg.rendezvous:
            return self.run_single()
        if cfg.secret is None:
            log("WARNING: MNP_SECRET is not set: any host that can reach port %d could join "
                "this job. Set MNP_SECRET (e.g. from Secrets Manager) on every node."
                % cfg.rendezvous_port)
        self.make_state_dir()
        if cfg.mode == "main":
            return self.batch.run_main(own=failed)
        return self.batch.run_child()

    def check_preflight(self):
        """The EFA preflight (``preflight``) on this node, before sshd, the rendezvous or any
        rank: what is missing is one line and the infrastructure code (a plugin the image lacks:
        configuration), never a silent fall-back to sockets."""
        if not self.plan.preflight:
            return
        failures = preflight.run(self.plan.preflight, self.plan.environment)
        if failures:
            message = "EFA preflight failed before any rank started: %s" % "; ".join(failures)
            if any(c["argv"] is None for c in self.plan.preflight):
                raise StartupError(message)  # nothing to load: the image has no plugin
            raise InfrastructureError(message)
        log("EFA preflight passed: %s" % "; ".join(c["check"] for c in self.plan.preflight))

    def make_state_dir(self):
        try:
            os.makedirs(self.cfg.state_dir, mode=0o700, exist_ok=True)
            os.chmod(self.cfg.state_dir, 0o700)
        except OSError as exc:
            raise StartupError("cannot create MNP_STATE_DIR %s: %s" % (self.cfg.state_dir, exc)) \
                from None

    def run_single(self):
        """One node, or a node whose scheduler wired the job: run the plan's command here."""
        if self.cfg.mode != "single":
            plan = self.make_plan(None, None)
            self.prepare(plan)
            return self.run_launcher(plan)
        table = [rendezvous.NodeInfo(0, "localhost", self.slot_count, "")]
        hostfiles = None
        if self.plan.launcher["unit"] != "none":
            self.make_state_dir()
            hostfiles = hostfile.write_all(self.cfg.state_dir, table)
        plan = self.make_plan(table, hostfiles)
        self.prepare(plan)
        return self.run_launcher(plan)

    def start_sshd(self):
        sshd = facts.find_sshd()
        if sshd is None:
            raise StartupError("sshd not found (install openssh-server) but MNP_LAUNCHER=%s "
                               "needs SSH; use MNP_LAUNCHER=torchrun to run without it"
                               % self.cfg.launcher)
        proc = self.sup.spawn("sshd", ssh.sshd_argv(sshd, self.paths))
        if not ssh.wait_listening(self.paths.pid_file, self.cfg.ssh_port, 15,
                                  alive=lambda: self.alive(proc)):
            raise InfrastructureError("sshd did not start listening on port %d (exit code %s)"
                               % (self.cfg.ssh_port, proc.code))
        log("sshd listening on port %d" % self.cfg.ssh_port)
        return proc

    def alive(self, proc):
        self.sup.reap()
        return proc.running

    def hb(self):
        timeout = self.cfg.heartbeat_timeout
        return min(2.0, timeout / 4.0), timeout

    # -- the launcher ----------------------------------------------------------------------
    def start_launcher(self, plan):
        """Log the command and spawn it, its stderr through ``tee`` (``LauncherOutput``);
        ``None`` (after saying why) when it cannot start."""
        argv, env = plan.argv, plan.environment
        if plan.kept:
            log("user's values kept: %s" % "; ".join(plan.kept))
        log("running: %s" % " ".join(shlex.quote(a) for a in argv))
        self.output = LauncherOutput(plan, self.cfg.node_index, self.own_names())
        try:
            proc = self.sup.spawn("launcher", argv, env=env, forward_signals=True,
                                  **self.output.tee.child_streams())
        except OSError as exc:
            self.output.tee.abandon()
            log("cannot start %s: %s" % (argv[0], exc))
            return None
        self.output.tee.started()
        return proc

    def own_names(self):
        """The names a launcher may give this host (Open MPI names the local node by its
        hostname)."""
        return (socket.gethostname(), self.facts.address)

    def launcher_failure(self, code):
        """This node's ``attribution.Failure`` once its launcher ended with ``code`` (None when it
        succeeded): after the last of its output has passed."""
        if self.output is None:
            return None
        return self.output.failure(code)

    def own_outcome(self, code):
        """The ``Outcome`` of this node's launcher ending with ``code``."""
        failure = self.launcher_failure(code)
        if failure is None:
            return outcome.of_command(code, self.node, address=self.facts.address)
        if not self.sup.signal_received:  # not a failure: the launcher was stopped
            log("first failure seen here: %s" % describe_failure(failure))
        return outcome.of_failure(failure, self.node, self.facts.address)

    def run_launcher(self, plan, watch=None):
        """Start the plan's launcher and supervise it (on the main node also the children's
        events, ``watch``: a ``batchnodes.ChildWatch``); the run's ``Outcome``. Where this node's
        ranks and a child's both failed, the job's failure is the one seen first."""
        launcher = self.start_launcher(plan)
        if launcher is None:
            return outcome.of_command(127, self.node, "%s (it cannot be started)" % plan.argv[0])
        children_done = {}
        failure = self.supervise(launcher, watch, children_done)
        code = launcher.code
        log("launcher exited with %d" % code)
        lifecycle.end_group(launcher.pid, 2.0, self.sup.reap)
        own = self.own_outcome(code)
        if failure is None and watch is not None:
            if code == 0 and self.local_launcher:
                failure = watch.wait_finish(children_done)
            elif code != 0:  # a launcher that failed because a node went away: say so
                failure = watch.lost_meanwhile(children_done)
        if self.sup.signal_received:
            return outcome.stopped(self.node, self.sup.signal_received, self.cfg.scheduler,
                                   others=watch is not None)
        if failure is not None and failure.cls == errors.USER and not own.ok:
            failure = outcome.earliest([failure, own])  # which ranks failed first
        if failure is not None:
            log("job failed: %s" % failure.reason)
            return failure
        return own

    def supervise(self, launcher, watch, children_done):
        """Reap until the launcher ends, escalating a forwarded signal to SIGKILL after
        ``MNP_STOP_TIMEOUT``; a child's failure stops it, unless this node's own ranks failed
        before (then its launcher is given ``OWN_END_WAIT`` s to end and report them). The
        child's failure ``Outcome`` or ``None``."""
        cfg = self.cfg
        escalated = False
        pending, deadline = None, None
        while True:
            self.sup.reap()
            if not launcher.running:
                return pending
            sig = self.sup.signal_received
            if sig and not escalated and time.monotonic() - self.sup.stop_requested_at > \
                    cfg.stop_timeout:
                log("launcher still running %gs after signal %d: killing it"
                    % (cfg.stop_timeout, sig))
                lifecycle.kill_group(launcher.pid)
                escalated = True
            if pending is not None and time.monotonic() > deadline:
                log("%s: stopping the launcher" % pending.reason)
                self.sup.terminate(launcher, min(cfg.stop_timeout, 10))
                return pending
            if watch is None or pending is not None:
                time.sleep(0.05)
                continue
            failure = watch.next_failure(0.1, children_done)
            if failure is None:
                continue
            own_at = self.output.scan.first_failure_at() if self.output is not None else None
            if failure.cls == errors.USER and own_at is not None and \
                    (failure.at is None or own_at < failure.at):
                log("%s, after this node's own ranks failed: waiting up to %gs for its launcher "
                    "to report them" % (failure.reason, OWN_END_WAIT))
                pending, deadline = failure, time.monotonic() + OWN_END_WAIT
                continue
            log("%s: stopping the launcher" % failure.reason)
            self.sup.terminate(launcher, min(cfg.stop_timeout, 10))
            return failure


class LauncherOutput(object):
    """What the final line reads of one launcher run: its stderr (stdout too under DeepSpeed's
    pdsh runner, which reports there) through ``tee`` into ``attribution.Scan``; how ranks map to
    nodes (``attribution.JobShape``: the plan's node table); torchrun's error file."""

    def __init__(self, plan, node_index, own_names):
        unit = plan.launcher.get("unit")
        pdsh = unit == "deepspeed" and plan.launcher.get("runner") == "pdsh"
        self.scan = attribution.Scan(pdsh=pdsh)
        self.tee = tee.Tee(self.scan, ("stdout", "stderr") if pdsh else ("stderr",))
        self.shape = attribution.JobShape(plan.table, node_index,
                                          mpirun.maps_by_slot(plan.argv or []), own_names)
        self.error_file = plan.environment.get(torchrun.ERROR_FILE_VARIABLE)
        if self.error_file and plan.value(torchrun.ERROR_FILE_VARIABLE) == self.error_file:
            with contextlib.suppress(OSError):  # where torchrun can write it
                os.makedirs(os.path.dirname(self.error_file), mode=0o700, exist_ok=True)
            with contextlib.suppress(OSError):  # ours, from an earlier run in this container
                os.unlink(self.error_file)

    def failure(self, code):
        self.tee.finish(OUTPUT_END_WAIT)
        return attribution.conclude(self.scan, code, self.shape, self.error_file)


def describe_failure(failure):
    """One line for the log: all that is known of a failure and what said it."""
    parts = []
    if failure.rank is not None:
        parts.append("rank %d" % failure.rank)
    if failure.local_rank is not None:
        parts.append("local rank %d" % failure.local_rank)
    if failure.node is not None:
        parts.append("node %d" % failure.node)
    if failure.host:
        parts.append("host %s" % printable(failure.host))
    parts.append("exit status %d" % failure.code)
    if failure.error:
        parts.append(failure.error)
    return "%s (from %s)" % (", ".join(parts), failure.how)


def dry_run_plan(cfg, command, environ, node_facts):
    """The plan this node's dry run prints (``Runner.dry_run``) had its probe found
    ``node_facts``: ``invoke explain`` prints it for every role of a generated job, with the facts
    the stack's image declares, so what it shows is this code's decision, not a copy of it."""
    runner = Runner(cfg, command, environ)
    runner.facts = node_facts
    runner.plan = runner.make_plan(None, None)  # what ``probe`` makes before the dry run
    return runner.dry_run_plan()


def main(argv=None):
    """Run the entrypoint; the exit code. Its last line names the class, node and reason."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg = config.load()
    except config.ConfigError as exc:  # before the role is known: bad input is one line
        log_mod.write_err("mnp-entrypoint: error: %s\n" % exc)
        return exc.exit_code
    # The secret stays in cfg only: not in PID 1's environment, so not inherited by sshd,
    # ssh-keygen, the probe tools or the launcher (nor visible in /proc/1/environ).
    for name in SECRET_VARIABLES:
        os.environ.pop(name, None)
    set_role(cfg.role_label())
    ended = _run(cfg, argv)
    if isinstance(ended, int):  # a dry run: the plan was the output
        return ended
    log(ended.line())
    return ended.code


def _run(cfg, argv):
    """``Runner.run`` with every error turned into its ``Outcome``."""
    node = cfg.node_index
    try:
        return Runner(cfg, argv).run()
    except JobFailure as exc:
        log("error: %s" % exc)
        return outcome.of_error(exc, node)
    except ssh.SshError as exc:
        log("error: %s" % exc)
        return outcome.configuration(node, str(exc))
    except rendezvous.RendezvousError as exc:
        log("error: %s" % exc)
        return outcome.infrastructure(node, str(exc))
    except KeyboardInterrupt:
        return outcome.stopped(node, 2, cfg.scheduler)
