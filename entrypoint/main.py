"""The flow: probe, then run as a single node, the main node, or a child node.

Single node (no Batch variables, or one node): the command runs directly when there is one slot
and ``MNP_LAUNCHER`` is not set; otherwise through the launcher on this node only.

Main node:

1. start its own sshd (mpirun, deepspeed, none) with a fresh host key, make the job's client key;
2. start the rendezvous server and wait for every child, at most ``MNP_WAIT_TIMEOUT`` seconds;
   on timeout, name the missing indices, tell the registered children to stop, exit 1;
3. write the hostfiles and ``known_hosts``, send ``go`` to every child, start the launcher;
4. supervise: a lost child, or a child that reports failure, stops the launcher and fails the job
   (exit 1); SIGTERM/SIGINT are forwarded; the exit code is the launcher's (128+N for a signal);
5. send ``done`` to every child and exit.

Child node:

1. start sshd with a fresh host key (mpirun, deepspeed, none);
2. register with the main node (retrying until ``MNP_WAIT_TIMEOUT``), receive the main node's
   client key into ``authorized_keys``, report ready;
3. on ``go``: torchrun starts here too; the SSH launchers need nothing more;
4. exit when the main node says ``done`` (promptly), when the main node vanishes (no message for
   ``MNP_HEARTBEAT_TIMEOUT`` seconds, 15 by default, so well within Batch's 30 s), or on SIGTERM.
   If sshd or the local launcher dies, the child tells the main node, which fails the job.
"""

import os
import shlex
import shutil
import sys
import time

from . import config, fabric, hostfile, launch, lifecycle, netaddr, rendezvous, slots, ssh
from .log import log, out, set_role

SECRET_WORDS = ("SECRET", "PASSWORD", "TOKEN", "PRIVATE", "CREDENTIAL")
CHILD_FINISH_WAIT = 60.0


class UsageError(Exception):
    """A usage problem (exit 2), e.g. no command."""


class StartupError(Exception):
    """Something the job needs is missing or broken (exit 1)."""


def redact(name, value):
    upper = name.upper()
    if any(word in upper for word in SECRET_WORDS) or upper.endswith("_KEY"):
        return "<redacted>"
    return value


class Runner(object):
    def __init__(self, cfg, command, environ=None):
        self.cfg = cfg
        self.command = list(command)
        self.environ = dict(os.environ if environ is None else environ)
        self.sup = lifecycle.Supervisor()
        self.is_root = os.geteuid() == 0
        self.user = ssh.current_user()
        self.paths = ssh.Paths(cfg.state_dir)
        self.need_ssh = cfg.is_multi and cfg.launcher in ("mpirun", "deepspeed", "none")
        self.addr = None
        self.slots = None
        self.fabric = None
        self.kept = []

    # -- probing ---------------------------------------------------------------------------
    def probe(self):
        cfg = self.cfg
        if cfg.mode == "single":
            try:
                self.addr = netaddr.choose(None, cfg.interface)
            except netaddr.AddressError as exc:
                if cfg.interface:
                    raise config.ConfigError("MNP_NETWORK_INTERFACE", str(exc)) from None
                self.addr = netaddr.Choice("127.0.0.1", None, "no usable interface (%s)" % exc)
        else:
            try:
                self.addr = netaddr.choose(cfg.main_address, cfg.interface)
            except netaddr.AddressError as exc:
                if cfg.interface:
                    raise config.ConfigError("MNP_NETWORK_INTERFACE", str(exc)) from None
                raise StartupError(str(exc)) from None
        self.slots = slots.detect(cfg.slots_override)
        fab = fabric.decide(cfg.fabric, run=slots.run_tool)
        imds = fabric.imds_instance_type if fab.kind == "efa" else None
        self.fabric = fabric.configure(fab, self.addr.interface, self.slots.kind, self.slots.names,
                                       cfg.instance_type, run=slots.run_tool, imds=imds)

    def describe(self):
        cfg = self.cfg
        if cfg.mode == "single":
            log("single node (no AWS Batch MNP variables)")
        else:
            log("%s node %d of %d (main node index %d%s)"
                % (cfg.mode, cfg.node_index, cfg.num_nodes, cfg.main_index,
                   ", main address %s" % cfg.main_address if cfg.main_address else ""))
        log("address %s (%s)" % (self.addr.address, self.addr.reason))
        log("slots %d: %s" % (self.slots.count, self.slots.source))
        fabric.log_decision(self.fabric)
        versions = ", ".join("%s %s" % kv for kv in sorted(self.fabric.versions.items()))
        if versions:
            log("versions: %s" % versions)

    # -- environment and command -----------------------------------------------------------
    def base_env(self):
        env = dict(self.environ)
        for name in ("MNP_SECRET", "MNP_SECRET_FILE"):
            env.pop(name, None)
        return env

    def launch_env(self, table, hostfiles):
        user_env = self.base_env()
        env, self.kept = fabric.merge_env(user_env, self.fabric.env)
        extra = {}
        if self.is_root:
            extra["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            extra["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        if self.need_ssh:
            extra["OMPI_MCA_plm_rsh_args"] = "-F %s" % self.paths.ssh_config
            extra["PDSH_SSH_ARGS_APPEND"] = "-F %s" % self.paths.ssh_config
            extra["MNP_SSH_CONFIG"] = self.paths.ssh_config
        if hostfiles:
            extra["MNP_HOSTFILE"] = hostfiles["openmpi"]
            extra["MNP_HOSTFILE_PLAIN"] = hostfiles["plain"]
            extra["MNP_HOSTFILE_INTEL"] = hostfiles["intel"]
        extra["MNP_NUM_NODES"] = str(len(table))
        extra["MNP_NODE_INDEX"] = str(self.cfg.node_index)
        extra["MNP_NODE_ADDRESS"] = self.addr.address
        extra["MNP_MASTER_ADDRESS"] = self.master_addr(table)
        extra["MNP_NP"] = str(self.np(table))
        for key, value in extra.items():
            if key in env and key in user_env and not key.startswith("MNP_"):
                if env[key] != value:
                    self.kept.append("%s=%s (ours: %s)" % (key, env[key], value))
                continue
            env[key] = value
        return user_env, env

    def master_addr(self, table):
        if self.cfg.mode == "single":
            return "127.0.0.1"
        return sorted(table, key=lambda n: n.index)[0].address

    def np(self, table):
        return self.cfg.np_override or hostfile.total_slots(table)

    def effective_launcher(self):
        cfg = self.cfg
        if cfg.mode == "single" and not cfg.launcher_explicit and self.slots.count == 1:
            return "none"
        return cfg.launcher

    def build_command(self, table, hostfiles, user_env, env, write_files=True):
        cfg = self.cfg
        kind = self.effective_launcher()
        hostfile_path = hostfiles["openmpi"] if hostfiles else "<hostfile>"
        mca = fabric.mca_flags(self.fabric.mca, user_env)
        exports = launch.export_names(env, cfg.export_env)
        if kind == "mpirun":
            mpirun = shutil.which("mpirun", path=env.get("PATH"))
            if mpirun is None:
                raise StartupError("mpirun not found on PATH: install Open MPI or set "
                                   "MNP_LAUNCHER")
            return launch.mpirun_argv(os.path.abspath(mpirun), self.command, env, self.np(table),
                                      hostfile_path, mca, exports, cfg.launcher_args,
                                      self.is_root)
        if kind == "torchrun":
            prefix = launch.torchrun_prefix(lambda n: shutil.which(n, path=env.get("PATH")))
            return launch.torchrun_argv(prefix, self.command, len(table), cfg.node_index,
                                        self.slots.count, self.master_addr(table),
                                        cfg.master_port, cfg.launcher_args)
        if kind == "deepspeed":
            which = lambda n: shutil.which(n, path=env.get("PATH"))  # noqa: E731
            runner = cfg.deepspeed_launcher or ("pdsh" if which("pdsh") else "openmpi")
            args = list(cfg.launcher_args)
            if runner == "openmpi":
                args = (["--allow-run-as-root"] if self.is_root else []) + mca + [
                    "-mca", "plm_rsh_no_tree_spawn", "1"] + args
            ds_env = os.path.join(cfg.state_dir, "deepspeed_env")
            if write_files and "DS_ENV_FILE" not in user_env:
                launch.deepspeed_env_file(ds_env, env, exports)
                env["DS_ENV_FILE"] = ds_env
            return launch.deepspeed_argv(launch.deepspeed_prefix(which), self.command,
                                         hostfile_path, runner, self.master_addr(table),
                                         cfg.master_port,
                                         " ".join(shlex.quote(a) for a in args))
        return list(self.command)

    # -- dry run ---------------------------------------------------------------------------
    def dry_run(self):
        cfg = self.cfg
        lines = ["mnp-entrypoint dry run (MNP_DRY_RUN=1): nothing is started"]
        if cfg.mode == "single":
            lines.append("role: single node (no AWS Batch MNP variables)")
        else:
            lines.append("role: %s, node %d of %d, main node index %d"
                         % (cfg.mode, cfg.node_index, cfg.num_nodes, cfg.main_index))
        lines.append("address: %s on %s (%s)"
                     % (self.addr.address, self.addr.interface, self.addr.reason))
        lines.append("devices: %d slot(s) from %s" % (self.slots.count, self.slots.source))
        lines.append(self.fabric.line())
        lines.extend("  " + note for note in self.fabric.notes)
        for key, value in sorted(self.fabric.versions.items()):
            lines.append("  version %s: %s" % (key, value))
        lines.append("launcher: %s" % self.effective_launcher())
        table = self.placeholder_table()
        if cfg.is_multi:
            secret = "set (HMAC-SHA256)" if cfg.secret else "NOT SET: any host could join"
            if cfg.mode == "main":
                lines.append("rendezvous: listen on port %d, wait up to %gs for nodes %s; "
                             "secret %s" % (cfg.rendezvous_port, cfg.wait_timeout,
                                            ", ".join(str(n.index) for n in table
                                                      if n.index != cfg.main_index), secret))
            else:
                lines.append("rendezvous: register with %s:%d (retrying up to %gs); secret %s"
                             % (cfg.main_address, cfg.rendezvous_port, cfg.wait_timeout, secret))
            if self.need_ssh:
                lines.append("ssh: sshd on port %d with a per-job host key; client key made by "
                             "the main node; StrictHostKeyChecking yes" % cfg.ssh_port)
            lines.append("heartbeat timeout: %gs" % cfg.heartbeat_timeout)
        hostfiles = None
        if cfg.mode != "child" or self.effective_launcher() == "torchrun":
            lines.append("hostfile (Open MPI/DeepSpeed; other nodes' entries are placeholders "
                         "until the rendezvous):")
            lines.extend("  " + line for line in hostfile.render_openmpi(table).splitlines())
            lines.append("hostfile.intel:")
            lines.extend("  " + line for line in hostfile.render_intel(table).splitlines())
        if cfg.mode == "child" and self.effective_launcher() != "torchrun":
            lines.append("command: none on this node (the main node's %s reaches it over SSH); "
                         "container command ignored: %s"
                         % (self.effective_launcher(), " ".join(map(shlex.quote, self.command))))
            user_env, env = self.launch_env(table, None)
        else:
            paths = {"openmpi": os.path.join(cfg.state_dir, "hostfile"),
                     "plain": os.path.join(cfg.state_dir, "hostfile.plain"),
                     "intel": os.path.join(cfg.state_dir, "hostfile.intel")}
            if cfg.mode == "child" or (cfg.mode == "single"
                                       and self.effective_launcher() == "none"):
                paths = None
            hostfiles = paths
            user_env, env = self.launch_env(table, hostfiles)
            argv = self.build_command(table, hostfiles, user_env, env, write_files=False)
            lines.append("command: %s" % " ".join(shlex.quote(a) for a in argv))
        lines.append("environment set by the entrypoint:")
        for key in sorted(env):
            if env.get(key) != user_env.get(key):
                lines.append("  %s=%s" % (key, redact(key, env[key])))
        if self.kept:
            lines.append("user's values kept:")
            lines.extend("  " + k for k in self.kept)
        lines.append("full environment of the command:")
        for key in sorted(env):
            lines.append("  %s=%s" % (key, redact(key, env[key])))
        out("\n".join(lines))
        return 0

    def placeholder_table(self):
        cfg = self.cfg
        if cfg.mode == "single":
            return [rendezvous.NodeInfo(0, "localhost", self.slots.count, "")]
        table = []
        for index in range(cfg.num_nodes):
            if index == cfg.node_index:
                addr = self.addr.address
            elif index == cfg.main_index and cfg.main_address:
                addr = cfg.main_address
            else:
                addr = "<node-%d>" % index
            table.append(rendezvous.NodeInfo(index, addr, self.slots.count, ""))
        return table

    # -- running ---------------------------------------------------------------------------
    def run(self):
        cfg = self.cfg
        if not self.command and not (cfg.mode == "child" and cfg.launcher != "torchrun"):
            raise UsageError("no command given: pass the program as the container command, "
                             "e.g. python3 train.py")
        self.probe()
        if cfg.dry_run:
            return self.dry_run()
        self.describe()
        self.sup.install_signal_handlers()
        try:
            if cfg.mode == "single":
                return self.run_single()
            if cfg.secret is None:
                log("WARNING: MNP_SECRET is not set: any host that can reach port %d could join "
                    "this job. Set MNP_SECRET (e.g. from Secrets Manager) on every node."
                    % cfg.rendezvous_port)
            self.make_state_dir()
            if cfg.mode == "main":
                return self.run_main()
            return self.run_child()
        finally:
            self.sup.stop_all(2)

    def make_state_dir(self):
        try:
            os.makedirs(self.cfg.state_dir, mode=0o700, exist_ok=True)
            os.chmod(self.cfg.state_dir, 0o700)
        except OSError as exc:
            raise StartupError("cannot create MNP_STATE_DIR %s: %s" % (self.cfg.state_dir, exc)) \
                from None

    def run_single(self):
        table = [rendezvous.NodeInfo(0, "localhost", self.slots.count, "")]
        hostfiles = None
        if self.effective_launcher() != "none":
            self.make_state_dir()
            hostfiles = hostfile.write_all(self.cfg.state_dir, table)
        user_env, env = self.launch_env(table, hostfiles)
        argv = self.build_command(table, hostfiles, user_env, env)
        return self.run_launcher(argv, env, server=None)

    def start_sshd(self):
        sshd = ssh.find_sshd()
        if sshd is None:
            raise StartupError("sshd not found (install openssh-server) but MNP_LAUNCHER=%s "
                               "needs SSH; use MNP_LAUNCHER=torchrun to run without it"
                               % self.cfg.launcher)
        proc = self.sup.spawn("sshd", ssh.sshd_argv(sshd, self.paths))
        if not ssh.wait_listening(self.paths.pid_file, self.cfg.ssh_port, 15,
                                  alive=lambda: self._alive(proc)):
            raise StartupError("sshd did not start listening on port %d (exit code %s)"
                               % (self.cfg.ssh_port, proc.code))
        log("sshd listening on port %d" % self.cfg.ssh_port)
        return proc

    def _alive(self, proc):
        self.sup.reap()
        return proc.running

    def hb(self):
        timeout = self.cfg.heartbeat_timeout
        return min(2.0, timeout / 4.0), timeout

    # -- main node -------------------------------------------------------------------------
    def run_main(self):
        cfg = self.cfg
        comment = "mnp-%s-node%d" % (rendezvous.job_base(cfg.job_id) or "job", cfg.node_index)
        host_pub = client_pub = ""
        sshd = None
        if self.need_ssh:
            host_pub = ssh.prepare_server(self.paths, cfg.ssh_port, self.user, comment)
            client_pub = ssh.prepare_client(self.paths, cfg.ssh_port, self.user, comment)
            ssh.authorize(self.paths, client_pub)
            sshd = self.start_sshd()
            log(ssh.install_user_config(self.paths))
        main_info = rendezvous.NodeInfo(cfg.node_index, self.addr.address, self.slots.count,
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
                ssh.write_known_hosts(self.paths, table, cfg.ssh_port)
            log("all %d nodes registered; hostfile %s:" % (len(table), hostfiles["openmpi"]))
            for line in hostfile.render_openmpi(table).splitlines():
                log("  " + line)
            user_env, env = self.launch_env(table, hostfiles)
            argv = self.build_command(table, hostfiles, user_env, env)
            code = self.run_launcher(argv, env, server=server)
            server.done(code)
            return code
        finally:
            server.stop()

    def wait_for_children(self, server, main_info, sshd):
        cfg = self.cfg
        start = time.time()
        deadline = start + cfg.wait_timeout
        log("waiting up to %gs for %d child node(s) on port %d"
            % (cfg.wait_timeout, cfg.num_nodes - 1, server.port))
        next_note = start + 30
        while True:
            now = time.time()
            if self.sup.signal_received:
                log("signal %d while waiting for nodes: stopping" % self.sup.signal_received)
                return None
            if sshd is not None and not self._alive(sshd):
                raise StartupError("sshd exited with %s while waiting for nodes" % sshd.code)
            missing = server.wait(min(0.5, max(0.0, deadline - now)))
            if not missing:
                table = server.go(self.go_payload, main_info)
                if table is not None:
                    log("rendezvous complete in %.2fs" % (time.time() - start))
                    return table
                continue
            if time.time() >= deadline:
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

    # -- the launcher ----------------------------------------------------------------------
    def start_launcher(self, argv, env):
        """Log the command and spawn it; ``None`` (after saying why) when it cannot start."""
        if self.kept:
            log("user's values kept: %s" % "; ".join(self.kept))
        log("running: %s" % " ".join(shlex.quote(a) for a in argv))
        try:
            return self.sup.spawn("launcher", argv, env=env, forward_signals=True)
        except OSError as exc:
            log("cannot start %s: %s" % (argv[0], exc))
            return None

    def run_launcher(self, argv, env, server):
        cfg = self.cfg
        launcher = self.start_launcher(argv, env)
        if launcher is None:
            return 127
        failure = None
        escalated = False
        children_done = {}
        while True:
            self.sup.reap()
            if not launcher.running:
                break
            sig = self.sup.signal_received
            if sig and not escalated and time.time() - self.sup.stop_requested_at > \
                    cfg.stop_timeout:
                log("launcher still running %gs after signal %d: killing it"
                    % (cfg.stop_timeout, sig))
                lifecycle.kill_group(launcher.pid)
                escalated = True
            event = server.next_event(0.1) if server else None
            if server is None:
                time.sleep(0.05)
            if event is None:
                continue
            failure = self._child_event(event, children_done)
            if failure:
                log("%s: stopping the launcher" % failure)
                self.sup.terminate(launcher, min(cfg.stop_timeout, 10))
                break
        code = launcher.code
        log("launcher exited with %d" % code)
        lifecycle.end_group(launcher.pid, 2.0, self.sup.reap)
        if failure is None and server is not None and code == 0 and \
                self.effective_launcher() == "torchrun":
            failure = self._wait_children_finish(server, children_done)
        if self.sup.signal_received:
            final = 128 + self.sup.signal_received
        elif failure:
            final = code if code not in (0, 128 + 15, 128 + 9) else 1
            log("job failed: %s" % failure)
        else:
            final = code
        log("exit code %d" % final)
        return final

    def _child_event(self, event, children_done):
        kind, index, value = event
        if kind == "lost":
            return "node %s lost (%s)" % (index, value)
        if kind == "exit":
            children_done[index] = value
            if value != 0:
                return "node %d failed (exit code %d)" % (index, value)
        return None

    def _wait_children_finish(self, server, children_done):
        want = set(range(self.cfg.num_nodes)) - {self.cfg.main_index}
        deadline = time.time() + CHILD_FINISH_WAIT
        while set(children_done) != want and time.time() < deadline:
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
        if self.effective_launcher() != "torchrun" and self.command:
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
            "job": cfg.job_id, "index": cfg.node_index, "addr": self.addr.address,
            "slots": self.slots.count, "host_key": host_pub,
        }, hb_interval=interval, hb_timeout=timeout)
        try:
            welcome = client.register(time.time() + cfg.wait_timeout,
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
            ssh.authorize(self.paths, key)
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
            if kind == "go" and self.effective_launcher() == "torchrun" and launcher is None:
                table = [rendezvous.NodeInfo(i, a, s, "") for i, a, s in payload.get("nodes", [])]
                user_env, env = self.launch_env(table, None)
                argv = self.build_command(table, None, user_env, env)
                launcher = self.start_launcher(argv, env)
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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg = config.load()
    except config.ConfigError as exc:
        sys.stderr.write("mnp-entrypoint: error: %s\n" % exc)
        return 2
    set_role(cfg.role_label())
    try:
        return Runner(cfg, argv).run()
    except (config.ConfigError, UsageError) as exc:
        log("error: %s" % exc)
        return 2
    except (StartupError, ssh.SshError) as exc:
        log("error: %s" % exc)
        return 1
    except KeyboardInterrupt:
        return 130
