"""AWS Batch's main and child nodes: the one scheduler whose nodes the entrypoint wires itself.

Main node: sshd for the SSH launchers, the rendezvous server, every child's registration within
``MNP_WAIT_TIMEOUT``, hostfiles and ``known_hosts``, ``go``, the launcher, supervision, ``done``.
Child node: sshd, registration with the main node, ``go`` (torchrun starts here too), and exit on
``done``, on losing the main node, or on a signal. ``main.Runner`` mixes this in; the rest of
the flow (probe, plan, launcher supervision) is shared with every other role.
"""

import shlex
import time

from ..core.errors import StartupError
from ..core.log import log
from ..plan import hostfile
from ..rendezvous import server as rendezvous
from . import ssh

CHILD_FINISH_WAIT = 60.0


class BatchNodes(object):
    """The main and child node runs; needs ``main.Runner``'s probe, plan and launcher methods."""

    # -- main node -------------------------------------------------------------------------
    def run_main(self):
        cfg = self.cfg
        comment = "mnp-%s-node%d" % (rendezvous.job_base(cfg.job_id) or "job", cfg.node_index)
        host_pub = client_pub = ""
        sshd = None
        if self.need_ssh:
            host_pub = ssh.prepare_server(self.paths, cfg.ssh_port, self.user, comment)
            client_pub = ssh.prepare_client(self.paths, cfg.ssh_port, self.user, comment,
                                            self.facts.address)
            ssh.authorize(self.paths, client_pub, self.environ)
            sshd = self.start_sshd()
            log(ssh.install_user_config(self.paths))
        main_info = rendezvous.NodeInfo(cfg.node_index, self.facts.address, self.slot_count,
                                        host_pub)
        interval, timeout = self.hb()
        server = rendezvous.Server(cfg.secret, cfg.job_id, cfg.num_nodes, cfg.main_index,
                                   {"client_key": client_pub}, cfg.rendezvous_port,
                                   need_host_key=self.need_ssh, hb_interval=interval,
                                   hb_timeout=timeout)
        try:
            server.start()
        except OSError as exc:
            raise StartupError("cannot listen on rendezvous port %d: %s"
                               % (cfg.rendezvous_port, exc)) from None
        try:
            table = self.wait_for_children(server, main_info, sshd)
            if table is None:
                code = 128 + self.sup.signal_received if self.sup.signal_received else 1
                server.done(code)
                return code
            hostfiles = hostfile.write_all(cfg.state_dir, table)
            if self.need_ssh:
                ssh.write_known_hosts(self.paths, table, cfg.ssh_port, self.user)
            log("all %d nodes registered; hostfile %s:" % (len(table), hostfiles["openmpi"]))
            for line in hostfile.render_openmpi(table).splitlines():
                log("  " + line)
            plan = self.make_plan(table, hostfiles)
            try:
                self.prepare(plan)
            except StartupError as exc:
                log("error: %s" % exc)
                server.done(1)
                return 1
            code = self.run_launcher(plan, server=server)
            server.done(code)
            return code
        finally:
            server.stop()

    def wait_for_children(self, server, main_info, sshd):
        cfg = self.cfg
        start = time.monotonic()
        deadline = start + cfg.wait_timeout
        log("waiting up to %gs for %d child node(s) on port %d"
            % (cfg.wait_timeout, cfg.num_nodes - 1, server.port))
        next_note = start + 30
        while True:
            now = time.monotonic()
            if self.sup.signal_received:
                log("signal %d while waiting for nodes: stopping" % self.sup.signal_received)
                return None
            if sshd is not None and not self._alive(sshd):
                raise StartupError("sshd exited with %s while waiting for nodes" % sshd.code)
            missing = server.wait(min(0.5, max(0.0, deadline - now)))
            if not missing:
                table = server.go(self.go_payload, main_info)
                if table is not None:
                    log("rendezvous complete in %.2fs" % (time.monotonic() - start))
                    return table
                continue
            if time.monotonic() >= deadline:
                log("timed out after %gs: node(s) %s never registered (registered: %s); "
                    "see MNP_WAIT_TIMEOUT" % (cfg.wait_timeout, ", ".join(map(str, missing)),
                                             ", ".join(str(i) for i in sorted(server.ready))
                                             or "none"))
                return None
            if now >= next_note:
                next_note = now + 30
                log("still waiting for node(s) %s (%ds left)"
                    % (", ".join(map(str, missing)), deadline - now))

    def go_payload(self, table):
        return {"nodes": [[n.index, n.address, n.slots] for n in table]}

    def _child_event(self, event, children_done):
        kind, index, value = event
        if kind == "lost":
            if index is None:  # the rendezvous server itself stopped: value is its reason
                return value
            return "node %s lost (%s)" % (index, value)
        if kind == "exit":
            children_done[index] = value
            if value != 0:
                return "node %d failed (exit code %d)" % (index, value)
        return None

    def _wait_children_finish(self, server, children_done):
        want = set(range(self.cfg.num_nodes)) - {self.cfg.main_index}
        deadline = time.monotonic() + CHILD_FINISH_WAIT
        while set(children_done) != want and time.monotonic() < deadline:
            if self.sup.signal_received:
                return None
            event = server.next_event(0.2)
            if event is not None:
                failure = self._child_event(event, children_done)
                if failure:
                    return failure
        missing = sorted(want - set(children_done))
        if missing:
            return "node(s) %s did not finish within %gs of the main node" % (
                ", ".join(map(str, missing)), CHILD_FINISH_WAIT)
        return None

    # -- child node ------------------------------------------------------------------------
    def run_child(self):
        cfg = self.cfg
        if not self.local_launcher and self.command:
            log("the main node launches the job over SSH; this node ignores its command (%s)"
                % " ".join(shlex.quote(a) for a in self.command))
        comment = "mnp-%s-node%d" % (rendezvous.job_base(cfg.job_id) or "job", cfg.node_index)
        host_pub = ""
        sshd = None
        if self.need_ssh:
            host_pub = ssh.prepare_server(self.paths, cfg.ssh_port, self.user, comment)
            sshd = self.start_sshd()
        interval, timeout = self.hb()
        client = rendezvous.Client(cfg.secret, cfg.main_address, cfg.rendezvous_port, {
            "job": cfg.job_id, "index": cfg.node_index, "addr": self.facts.address,
            "slots": self.slot_count, "host_key": host_pub,
        }, hb_interval=interval, hb_timeout=timeout)
        try:
            welcome = client.register(None, timeout=cfg.wait_timeout,
                                      stop=lambda: self.sup.signal_received is not None)
        except rendezvous.Rejected as exc:
            log("error: %s" % exc)
            return 1
        except rendezvous.RendezvousError as exc:
            if self.sup.signal_received:
                return 128 + self.sup.signal_received
            log("error: %s" % exc)
            return 1
        if self.need_ssh:
            key = welcome.get("client_key") or ""
            if not rendezvous.HOST_KEY_RE.match(key):
                log("error: the main node sent no usable SSH client key")
                return 1
            ssh.authorize(self.paths, key, self.environ)
        client.ready()
        client.start()
        log("registered with the main node %s:%d after %d attempt(s)"
            % (cfg.main_address, cfg.rendezvous_port, client.attempts))
        try:
            return self.child_loop(client, sshd)
        finally:
            client.close()

    def child_loop(self, client, sshd):
        cfg = self.cfg
        launcher = None
        reported = False
        while True:
            self.sup.reap()
            if self.sup.signal_received:
                sig = self.sup.signal_received
                log("signal %d: stopping" % sig)
                if not reported:
                    client.report_exit(128 + sig)
                self.sup.stop_all(min(cfg.stop_timeout, 10))
                return 128 + sig
            if sshd is not None and not sshd.running and not reported:
                log("sshd exited with %d: telling the main node" % sshd.code)
                client.report_exit(sshd.code or 1)
                reported = True
            if launcher is not None and not launcher.running and not reported:
                log("launcher exited with %d" % launcher.code)
                client.report_exit(launcher.code)
                reported = True
            event = client.next_event(0.1)
            if event is None:
                continue
            kind, payload = event
            if kind == "go" and self.local_launcher and launcher is None:
                table = [rendezvous.NodeInfo(i, a, s, "") for i, a, s in payload.get("nodes", [])]
                plan = self.make_plan(table, None)
                launcher = self.start_launcher(plan) if not plan.problems else None
                if plan.problems:
                    log("error: %s" % plan.problems[0])
                if launcher is None:
                    client.report_exit(127)
                    reported = True
            elif kind == "go":
                log("all nodes registered; serving SSH for the main node's launcher")
            elif kind == "done":
                log("the main node reports the job ended (exit code %s): stopping"
                    % payload.get("status"))
                own = launcher.code if launcher is not None and not launcher.running else None
                self.sup.stop_all(5)
                return own if own else 0
            elif kind == "lost":
                log("lost the main node (%s): stopping" % payload)
                self.sup.stop_all(5)
                return 1
