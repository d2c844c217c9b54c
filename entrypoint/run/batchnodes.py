"""The main and child nodes the entrypoint wires itself: AWS Batch's, and those of a scheduler
that starts one entrypoint per node but serves no SSH its launcher needs (a Slurm step of one
task per node with mpirun or DeepSpeed: ``settings.wiring``, ``NodeTable.wired``).

Main node: sshd for the SSH launchers, the rendezvous server, every child's registration within
``MNP_WAIT_TIMEOUT``, hostfiles and ``known_hosts``, ``go``, the launcher, supervision, ``done``.
Child node: sshd, registration with the main node, ``go`` (torchrun starts here too), and exit on
``done``, on losing the main node, or on a signal. ``BatchNodes`` is given the node it runs on
(a ``host.NodeHost``: ``main.Runner``, which probes, plans and supervises the launcher for every
role) and reads only that interface; ``ChildWatch`` is what the main node's launcher supervision
reads of the children. A child's registration is the state machine of ``rendezvous.states``: a
child that failed its start-up checks registers, never says ready, and reports its status, so the
main node cannot count it ready and starts nothing.
"""

import shlex
import time

from ..core.errors import (
    CONFIGURATION_EXIT,
    INFRASTRUCTURE_EXIT,
    InfrastructureError,
    JobFailure,
    StartupError,
)
from ..core.log import log
from ..plan import hostfile
from ..rendezvous import server as rendezvous
from . import attribution, gate, outcome, ssh
from . import host as host_interface

CHILD_FINISH_WAIT = 60.0
# After the main node's launcher failed, how long to listen for a child lost at the same moment
# (a container that died resets its connection at once): the job then failed because of it.
LOST_GRACE = 2.0
# The most of a failure's reason a child sends (the main node accepts up to 1000 characters)
WIRE_ERROR_CHARS = 900


class BatchNodes(object):
    """The main and child node runs of the node ``host`` (a ``host.NodeHost``)."""

    def __init__(self, host):
        missing = host_interface.missing_names(host)
        if missing:
            raise TypeError("%s does not implement NodeHost: %s"
                            % (type(host).__name__, ", ".join(missing)))
        self.host = host

    # -- main node -------------------------------------------------------------------------
    def run_main(self, own=None):
        """The main node's run; ``own``: this node's own start-up finding that the rendezvous
        weighs against the children's (``gate.NO_EFA_DEVICES``): then nothing is started."""
        cfg = self.host.cfg
        comment = self.key_comment()
        host_pub = client_pub = ""
        sshd = None
        if self.host.need_ssh:
            host_pub = ssh.prepare_server(self.host.paths, cfg.ssh_port, self.host.user, comment)
            client_pub = ssh.prepare_client(self.host.paths, cfg.ssh_port, self.host.user, comment,
                                            self.host.facts.address)
            ssh.authorize(self.host.paths, client_pub, self.host.environ)
            sshd = self.host.start_sshd()
            if cfg.node is None or not cfg.node.wired_because:
                # not where a scheduler's home is the user's own (Slurm's is shared, lasts)
                log(ssh.install_user_config(self.host.paths))
        main_info = rendezvous.NodeInfo(cfg.node_index, self.host.facts.address,
                                        self.host.slot_count, host_pub)
        interval, timeout = self.host.hb()
        server = rendezvous.Server(cfg.secret, cfg.job_id, cfg.num_nodes, cfg.main_index,
                                   {"client_key": client_pub}, cfg.rendezvous_port,
                                   need_host_key=self.host.need_ssh, hb_interval=interval,
                                   hb_timeout=timeout)
        try:
            server.start()
        except OSError as exc:
            raise InfrastructureError("cannot listen on rendezvous port %d: %s"
                                      % (cfg.rendezvous_port, exc)) from None
        try:
            try:
                ended = self.main_after_start(server, main_info, sshd, own)
            except JobFailure as exc:
                log("error: %s" % exc)
                ended = outcome.of_error(exc, self.host.node)
            except rendezvous.ServerFailed as exc:  # its own bug: this node's failure
                log("error: %s" % exc)
                ended = outcome.infrastructure(self.host.node, str(exc))
            server.done(ended.code)
            return ended
        finally:
            server.stop()

    def main_after_start(self, server, main_info, sshd, own=None):
        """Every child registered, hostfiles, the full health gate, the launcher: the
        ``Outcome`` the main node sends its children with ``done``."""
        cfg = self.host.cfg
        table = self.wait_for_children(server, main_info, sshd, own)
        if not isinstance(table, list):
            return table  # how waiting ended: a signal, a missing node, a failed node
        hostfiles = hostfile.write_all(cfg.state_dir, table)
        if self.host.need_ssh:
            ssh.write_known_hosts(self.host.paths, table, cfg.ssh_port, self.host.user)
        log("all %d nodes registered; hostfile %s:" % (len(table), hostfiles["openmpi"]))
        for line in hostfile.render_openmpi(table).splitlines():
            log("  " + line)
        plan = self.host.make_plan(table, hostfiles)
        try:
            self.host.prepare(plan)
        except StartupError as exc:
            log("error: %s" % exc)
            return outcome.configuration(self.host.node, str(exc))
        failed = gate.full(self.host, table)
        if failed is not None:
            return failed
        return self.host.run_launcher(plan, watch=ChildWatch(server, self.host, table))

    def wait_for_children(self, server, main_info, sshd, own=None):
        """The node table once every child is ready, or the ``Outcome`` that ended the wait: a
        signal, a node that never registered, a node that failed its start-up checks. Nodes
        without EFA devices (``own``: this one) are weighed once every child has answered."""
        cfg = self.host.cfg
        start = time.monotonic()
        deadline = start + cfg.wait_timeout
        log("waiting up to %gs for %d child node(s) on port %d"
            % (cfg.wait_timeout, cfg.num_nodes - 1, server.port))
        next_note = start + 30
        lacking = {cfg.node_index} if own is not None else set()
        while True:
            now = time.monotonic()
            if self.host.sup.signal_received:
                log("signal %d while waiting for nodes: stopping" % self.host.sup.signal_received)
                return outcome.stopped(self.host.node, self.host.sup.signal_received,
                                       cfg.scheduler, others=True)
            if sshd is not None and not self.host.alive(sshd):
                raise InfrastructureError("sshd exited with %s while waiting for nodes"
                                          % sshd.code)
            missing = server.wait(min(0.5, max(0.0, deadline - now)))
            failed = self._failed_while_waiting(server, lacking)
            if failed is not None:
                return failed
            missing = [i for i in missing if i not in server.nodes.failed]
            if not missing and lacking:
                return gate.efa_verdict(cfg.num_nodes, lacking)
            if not missing:
                table = server.go(self.go_payload, main_info)
                if table is not None:
                    log("rendezvous complete in %.2fs" % (time.monotonic() - start))
                    return table
                continue
            if time.monotonic() >= deadline:
                return self._never_registered(server, missing)
            if now >= next_note:
                next_note = now + 30
                log("still waiting for node(s) %s (%ds left)"
                    % (", ".join(map(str, missing)), deadline - now))

    def _failed_while_waiting(self, server, lacking):
        """A child that registered and then reported a failure (its start-up health checks):
        the job ends now instead of at the wait timeout. One without EFA devices is added to
        ``lacking`` instead: the verdict waits for every node's answer."""
        while True:
            event = server.next_event(0)
            if event is None:
                return None
            kind, index, value = event
            if kind == "exit" and server.nodes.causes.get(index) == gate.NO_EFA_DEVICES:
                log("node %d has no EFA device (exit code %d)" % (index, value))
                lacking.add(index)
            elif kind == "exit" and value != 0:
                log("node %d failed before the job started (exit code %d)" % (index, value))
                return outcome.of_child(index, value)

    def _never_registered(self, server, missing):
        cfg, names = self.host.cfg, ", ".join(map(str, missing))
        ready = ", ".join(str(i) for i in sorted(server.ready)) or "none"
        reason = ("node(s) %s never registered within %gs (registered: %s); see MNP_WAIT_TIMEOUT"
                  % (names, cfg.wait_timeout, ready))
        log("timed out after %gs: %s" % (cfg.wait_timeout, reason))
        return outcome.infrastructure(",".join(map(str, missing)), reason)

    @staticmethod
    def go_payload(table):
        return {"nodes": [[n.index, n.address, n.slots] for n in table]}

    # -- child node ------------------------------------------------------------------------
    def run_child(self):
        if not self.host.local_launcher and self.host.command:
            log("the main node launches the job over SSH; this node ignores its command (%s)"
                % " ".join(shlex.quote(a) for a in self.host.command))
        sshd = None
        host_pub = self.child_host_key()
        if self.host.need_ssh:
            sshd = self.host.start_sshd()
        client = self.register(host_pub)
        if isinstance(client, outcome.Outcome):
            return client
        try:
            return self.child_loop(client, sshd)
        finally:
            client.close()

    def child_host_key(self):
        """This child's SSH host key (made fresh for the job), "" without SSH."""
        cfg = self.host.cfg
        if not self.host.need_ssh:
            return ""
        return ssh.prepare_server(self.host.paths, cfg.ssh_port, self.host.user, self.key_comment())

    def key_comment(self):
        """The comment on this node's SSH keys: the job and node they were made for."""
        cfg = self.host.cfg
        return "mnp-%s-node%d" % (rendezvous.job_base(cfg.job_id) or "job", cfg.node_index)

    def register(self, host_pub, why="error", passed=True):
        """Register with the main node and, when this node ``passed`` its start-up checks,
        report ready: the started ``Client``, or the ``Outcome`` when that failed (rejected:
        configuration; unreachable: infrastructure). ``why`` starts the line that says it
        failed. A node that did not pass never says ready (``rendezvous.states``)."""
        cfg = self.host.cfg
        interval, timeout = self.host.hb()
        client = rendezvous.Client(cfg.secret, cfg.main_address, cfg.rendezvous_port, {
            "job": cfg.job_id, "index": cfg.node_index, "addr": self.host.facts.address,
            "slots": self.host.slot_count, "host_key": host_pub,
        }, hb_interval=interval, hb_timeout=timeout)
        try:
            welcome = client.register(None, timeout=cfg.wait_timeout,
                                      stop=lambda: self.host.sup.signal_received is not None)
        except rendezvous.Rejected as exc:
            log("%s: %s" % (why, exc))
            return outcome.configuration(self.host.node, str(exc))
        except rendezvous.RendezvousError as exc:
            if self.host.sup.signal_received:
                return outcome.stopped(self.host.node, self.host.sup.signal_received,
                                       cfg.scheduler)
            log("%s: %s" % (why, exc))
            return outcome.infrastructure(self.host.node, "could not register with the main node "
                                          "%s: %s" % (cfg.main_address, exc))
        if passed and self.host.need_ssh:
            key = welcome.get("client_key") or ""
            if not rendezvous.HOST_KEY_RE.match(key):
                client.close()
                return outcome.infrastructure(self.host.node, "the main node sent no usable SSH "
                                              "client key")
            ssh.authorize(self.host.paths, key, self.host.environ)
        if passed:
            client.ready()
        client.start()
        log("registered with the main node %s:%d after %d attempt(s)"
            % (cfg.main_address, cfg.rendezvous_port, client.attempts))
        return client

    def report_failed_child(self, failed):
        """A child that failed its start-up checks registers (never ready) and reports its code,
        so the main node ends the job at once naming it; then waits for ``done`` a while."""
        self.host.make_state_dir()
        client = self.register(self.child_host_key(), "could not tell the main node",
                               passed=False)
        if isinstance(client, outcome.Outcome):
            return failed
        try:
            client.report_exit(failed.code, failed.cause)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not self.host.sup.signal_received:
                event = client.next_event(0.2)
                if event is not None and event[0] == "done" and failed.cause and \
                        event[1].get("status") == CONFIGURATION_EXIT:  # every node lacks it
                    return outcome.configuration(self.host.node, "the main node found the same "
                                                 "on every node: %s" % failed.cause)
                if event is not None and event[0] in ("done", "lost"):
                    break
        finally:
            client.close()
        return failed

    def child_loop(self, client, sshd):
        """Serve the job until the main node says ``done`` (or is lost, or a signal)."""
        cfg = self.host.cfg
        state = {"launcher": None, "reported": False}
        while True:
            self.host.sup.reap()
            if self.host.sup.signal_received:
                sig = self.host.sup.signal_received
                log("signal %d: stopping" % sig)
                if not state["reported"]:
                    client.report_exit(128 + sig)
                self.host.sup.stop_all(min(cfg.stop_timeout, 10))
                return outcome.stopped(self.host.node, sig, cfg.scheduler)
            self._child_report(client, sshd, state)
            event = client.next_event(0.1)
            if event is None:
                continue
            ended = self._child_message(client, event, state)
            if ended is not None:
                return ended

    def _child_report(self, client, sshd, state):
        """Tell the main node once when sshd or the local launcher ended; a failed launcher's
        report is its ranks' first failure (``attribution``): the rank's own status (torchrun's
        root cause: 7, not torchrun's 1), the rank, the exception line, when it was seen."""
        if state["reported"]:
            return
        launcher = state["launcher"]
        if sshd is not None and not sshd.running:
            log("sshd exited with %d: telling the main node" % sshd.code)
            client.report_exit(INFRASTRUCTURE_EXIT)
            state["reported"] = True
        elif launcher is not None and not launcher.running:
            log("launcher exited with %d" % launcher.code)
            state["own"] = self.host.own_outcome(launcher.code)
            failure = state["own"]
            wire = None
            if not failure.ok:
                wire = {"rank": failure.rank, "local_rank": failure.local_rank, "at": failure.at,
                        "error": failure.error[:WIRE_ERROR_CHARS] if failure.error else None}
            client.report_exit(failure.code, failure=wire)
            state["reported"] = True

    def _child_message(self, client, event, state):
        """Act on one message from the main node; the child's ``Outcome`` when it ends."""
        kind, payload = event
        launcher = state["launcher"]
        if kind == "go" and self.host.local_launcher and launcher is None:
            table = [rendezvous.NodeInfo(i, a, s, "") for i, a, s in payload.get("nodes", [])]
            state["failed"] = gate.full(self.host, table)
            if state["failed"] is not None:
                return None  # the main node names the slow node and ends the job
            plan = self.host.make_plan(table, None)
            if gate.blocking(plan.problems):
                log("error: %s" % gate.blocking(plan.problems)[0])
                client.report_exit(CONFIGURATION_EXIT)
                state["reported"] = True
                return None
            state["launcher"] = self.host.start_launcher(plan)
            if state["launcher"] is None:
                client.report_exit(127)
                state["reported"] = True
        elif kind == "go":
            table = [rendezvous.NodeInfo(i, a, s, "") for i, a, s in payload.get("nodes", [])]
            state["failed"] = gate.full(self.host, table)
            if state["failed"] is None:
                log("all nodes registered; serving SSH for the main node's launcher")
        elif kind == "done":
            log("the main node reports the job ended (exit code %s): stopping"
                % payload.get("status"))
            own = state.get("own")
            if own is None and launcher is not None and not launcher.running:
                own = self.host.own_outcome(launcher.code)
            self.host.sup.stop_all(5)
            if own is not None and not own.ok:
                return own
            if state.get("failed") is not None and payload.get("status"):
                return state["failed"]  # the job failed on the gate's finding: say so here too
            return outcome.success(self.host.node, "this node's part ended; the main node reports "
                                   "exit code %s" % payload.get("status"))
        elif kind == "lost":
            log("lost the main node (%s): stopping" % payload)
            self.host.sup.stop_all(5)
            return outcome.infrastructure(self.host.node, "lost the main node (%s)" % payload)
        return None


class ChildWatch(object):
    """The children's events while the main node's launcher runs (``Runner.run_launcher``):
    a child lost, or one that reports a failure, is the job's failure."""

    def __init__(self, server, host, table=()):
        self.server = server
        self.host = host
        self.addresses = dict((row.index, row.address) for row in table)

    def next_failure(self, timeout, children_done):
        """The next event within ``timeout`` s as the job's failure ``Outcome``, or ``None``."""
        event = self.server.next_event(timeout)
        return None if event is None else self.failure(event, children_done)

    def failure(self, event, children_done):
        """A running-phase event as the job's failure ``Outcome``, or ``None``."""
        kind, index, value = event
        if kind == "lost":
            if index is None:  # the rendezvous server itself stopped: value is its reason
                return outcome.infrastructure(self.host.node, value)
            return outcome.infrastructure(index, "node %s lost (%s)" % (index, value),
                                          self.addresses.get(index))
        if kind == "exit":
            children_done[index] = value
            if value != 0:
                report = self.server.nodes.failures.get(index)
                failure = None if report is None else attribution.Failure.from_wire(value, report)
                log("node %d failed (exit code %d)%s" % (
                    index, value, "" if failure is None else ": " + describe(failure)))
                return outcome.of_child(index, value, failure, self.addresses.get(index))
        return None

    def wait_finish(self, children_done):
        want = set(range(self.host.cfg.num_nodes)) - {self.host.cfg.main_index}
        deadline = time.monotonic() + CHILD_FINISH_WAIT
        while set(children_done) != want and time.monotonic() < deadline:
            if self.host.sup.signal_received:
                return None
            event = self.server.next_event(0.2)
            if event is not None:
                failure = self.failure(event, children_done)
                if failure is not None:
                    return failure
        missing = sorted(want - set(children_done))
        if missing:
            return outcome.infrastructure(",".join(map(str, missing)), (
                "node(s) %s did not finish within %gs of the main node"
                % (", ".join(map(str, missing)), CHILD_FINISH_WAIT)))
        return None

    def lost_meanwhile(self, children_done):
        """A child lost or failed while the launcher failed, within ``LOST_GRACE``."""
        deadline = time.monotonic() + LOST_GRACE
        while time.monotonic() < deadline:
            event = self.server.next_event(0.1)
            if event is not None:
                failure = self.failure(event, children_done)
                if failure is not None:
                    return failure
        return None


def describe(failure):
    """A child's reported failure in a few words (a peer's words, already made printable)."""
    parts = ["rank %d" % failure.rank] if failure.rank is not None else []
    if failure.error:
        parts.append(failure.error)
    return ", ".join(parts) or "no detail"
