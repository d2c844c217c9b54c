"""Rendezvous: children register with the main node; the main node waits for every index.

``Server`` runs on the main node: ``connection.Connections`` (sockets, framing, authentication,
limits) with the job's node table in a ``registry.Registry`` (who registered, dedup, go/stop).
``Client`` runs on a child.

Rules:

- Children may start before the main node listens, in any order, at any time: ``Client.register``
  retries with exponential backoff (50 ms doubling to 2 s, with jitter) until its deadline.
- A registration is checked (HMAC, nonces, job id, index range, address, slots, key format) and
  a bad one is rejected, logged, and never reaches the node table.
- A node that registers again (a restarted container) replaces its old entry: the table is keyed
  by node index, the old connection is closed. A node whose connection drops before the job
  starts is removed and waited for again.
- ``Server.wait`` returns the missing indices after the deadline; the caller names them and exits
  non-zero.
- After ``go``, registrations are refused, and a lost connection or a heartbeat silence longer
  than the heartbeat timeout is a ``lost`` event: the main node fails the job instead of hanging.
  Children treat the same silence from the main node as "main node vanished" and exit.
- What a hostile peer can and cannot do to the server is in ``connection``.
- Every timeout uses ``time.monotonic``; the deadline ``Client.register`` takes is wall-clock
  (epoch seconds, as before) and converted once on entry.
"""

import collections
import contextlib
import random
import select
import socket
import threading
import time
from typing import Dict

from ..core.limits import MIN_HEARTBEAT_TIMEOUT
from ..core.log import log, printable
from . import protocol
from .connection import LOOP_TICK, MAX_PENDING, Connections, EventQueue, RendezvousError, ServerFailed
from .registry import HOST_KEY_RE, MAX_SLOTS, NodeInfo, Registry, check_go, job_base, validate_registration
from .states import CONNECTED, NodeState

__all__ = ["CLIENT_TICK", "HOST_KEY_RE", "LOOP_TICK", "MAX_SLOTS", "MIN_HEARTBEAT_TIMEOUT",
           "Client", "NodeInfo", "Rejected", "RendezvousError", "Server", "ServerFailed",
           "job_base", "validate_registration"]

CLIENT_TICK = 0.5  # the client loop wakes at least this often
STOP_POLL = 0.25  # while registering, stop() is checked at least this often
# The smallest heartbeat timeout the protocol tolerates: a child sends a heartbeat at most every


class Rejected(RendezvousError):
    """The main node refused this registration."""


class Server(Connections):
    """The main node's side. ``start``, then ``wait``, ``go``, ``events``, ``done``, ``stop``."""

    def __init__(self, secret, job_id, num_nodes, main_index, welcome, port, host="0.0.0.0",
                 need_host_key=True, hb_interval=2.0, hb_timeout=15.0, handshake_timeout=10.0,
                 max_pending=None):
        # every child may be mid-handshake at once when they all start together
        Connections.__init__(self, secret, port, host, hb_interval, hb_timeout,
                             handshake_timeout, max_pending or max(MAX_PENDING, num_nodes))
        self.job_id = job_id
        self.num_nodes = num_nodes
        self.main_index = main_index
        self.welcome = dict(welcome)
        self.need_host_key = need_host_key
        self.nodes = Registry(num_nodes, main_index)

    @property
    def ready(self) -> Dict[int, NodeInfo]:
        """index -> ``NodeInfo`` of every child that is ready."""
        return self.nodes.ready

    # -- main-thread API -------------------------------------------------------------------
    def missing(self):
        return self.nodes.missing()

    def wait(self, timeout):
        """Block until every child is ready or ``timeout`` seconds pass; return missing indices.
        Raises ``ServerFailed`` at once if the server thread has stopped (see ``failure``)."""
        self._check_alive()
        self.nodes.all_ready.wait(timeout)
        self._check_alive()
        return self.missing()

    def table(self, main_info):
        """All nodes, the main node included, sorted by index."""
        return self.nodes.table(main_info)

    def go(self, make_payload, main_info):
        """Start the job if every child is still ready: refuse new registrations from now on and
        send ``go`` to every child with ``make_payload(table)``. Returns the node table (sorted by
        index, main node included), or ``None`` when a node dropped out meanwhile (wait again).
        Done inside the loop thread, so no registration can slip in between check and send."""

        def _go():
            if not self.nodes.can_go():
                return None
            table = self.table(main_info)
            payload = make_payload(table)
            self.nodes.phase = "running"
            for conn in self.nodes.connections(NodeState.READY):
                self._send(conn, dict(payload, t="go"))
            return table

        table = self._run_in_loop(_go, 30)
        if table is None:
            self.nodes.all_ready.clear()
            if not self.missing():
                self.nodes.all_ready.set()
        return table

    def done(self, status, linger=2.0):
        """Tell every child the job ended (with ``status``), give the messages ``linger`` s."""

        def _done():
            self.nodes.phase = "stopping"
            for conn in self.nodes.connections(*CONNECTED):
                self._send(conn, {"t": "done", "status": status})

        try:
            self._run_in_loop(_done, 5)
        except ServerFailed:
            return  # nobody left to tell; the failure was already reported
        deadline = time.monotonic() + linger
        while time.monotonic() < deadline and any(c.out for c in list(self._conns)):
            time.sleep(0.02)

    def next_event(self, timeout):
        """Pop one running-phase event, waiting at most ``timeout`` s; ``None`` if none."""
        return self.events.get(timeout)

    # -- what an authenticated connection means (connection.Connections' hooks) -----------
    def _accepting(self):
        return self.nodes.phase == "waiting"

    def _shutdown(self):
        self.nodes.phase = "stopped"
        Connections._shutdown(self)

    def _on_failed(self):
        self.nodes.all_ready.set()

    def _on_register(self, conn, msg):
        info = validate_registration(msg, self.num_nodes, self.main_index, self.job_id,
                                     self.need_host_key)
        self._admitted(conn)
        old = self.nodes.replaced(conn, info)
        if old is not None:
            self._close(old, None, quiet=True)
        peer_ip = conn.peer.rsplit(":", 1)[0]
        if peer_ip != info.address:
            log("node %d connects from %s but registers %s (MNP_NETWORK_INTERFACE?)"
                % (info.index, peer_ip, info.address))
        self.nodes.add(conn, info)
        self._send(conn, dict(self.welcome, t="welcome"))

    def _on_message(self, conn, msg):
        kind = msg.get("t")
        if kind == "hb":
            return
        if kind == "ready" and conn.state is NodeState.REGISTERED:
            self.nodes.mark_ready(conn)
            return
        if kind == "exit" and conn.state in (NodeState.REGISTERED, NodeState.READY):
            self._emit(("exit", conn.index, self.nodes.mark_exited(conn, msg)))
            return
        raise protocol.ProtocolError("unexpected %s in state %s" % (printable(kind, 40),
                                                                    conn.state))

    def _on_closed(self, conn, was, reason, quiet):
        if not self.nodes.remove(conn, was) or quiet or reason is None:
            return
        event = self.nodes.lost(conn, was, reason)
        if event is not None:
            self._emit(event)


class Client(object):
    """A child's side: ``register`` (with retries), ``ready``, ``start``, then ``events``."""

    def __init__(self, secret, main_address, port, fields, hb_interval=2.0, hb_timeout=15.0,
                 connect_timeout=5.0):
        self.secret = secret
        self.main_address = main_address
        self.port = port
        self.fields = dict(fields)
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.connect_timeout = connect_timeout
        self.sock = None
        self.session = None
        self.buf = protocol.LineBuffer()
        self._lines = collections.deque()
        self.welcome = None
        self.attempts = 0
        self.events = EventQueue()
        self._send_lock = threading.Lock()
        self._thread = None
        self._stop = threading.Event()
        self._stop_check = None

    def _recv_message(self, deadline):
        """The next message, waiting until ``deadline`` (monotonic s), in slices of at most
        ``STOP_POLL`` seconds so that ``stop()`` is honoured while the main node is silent."""
        while not self._lines:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("no answer from the main node")
            if self._stop_check is not None and self._stop_check():
                raise RendezvousError("stopped while registering")
            self.sock.settimeout(min(remaining, STOP_POLL))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                raise ConnectionResetError("connection closed by the main node")
            self._lines.extend(self.buf.feed(chunk))
        return protocol.decode(self._lines.popleft())

    def _attempt(self, deadline):
        self.sock = socket.create_connection((self.main_address, self.port),
                                             timeout=min(self.connect_timeout,
                                                         max(0.1, deadline - time.monotonic())))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = protocol.LineBuffer()
        self._lines = collections.deque()
        step = min(deadline, time.monotonic() + 15)
        hello = self._recv_message(step)
        if hello.get("t") == "reject":
            raise Rejected("main node refused the connection: %s"
                           % printable(hello.get("reason")))
        if hello.get("t") != "hello" or not isinstance(hello.get("sn"), str) or \
                not protocol.NONCE_RE.match(hello["sn"]):
            raise protocol.ProtocolError("expected hello, got %s" % printable(hello.get("t"), 40))
        self.session = protocol.Session(self.secret, hello["sn"], protocol.new_nonce(),
                                        protocol.C2S)
        message = dict(self.fields, t="register", v=protocol.VERSION)
        self.sock.sendall(self.session.seal(message))
        answer = self._recv_message(step)
        try:
            answer = self.session.open(answer)
        except protocol.AuthError as exc:
            if answer.get("t") == "reject":
                raise Rejected("main node rejected this node (%s); its reply does not "
                               "authenticate either (%s): is MNP_SECRET the same on every node?"
                               % (printable(answer.get("reason")), exc)) from None
            raise Rejected("main node's reply failed authentication (%s)" % exc) from None
        if answer.get("t") == "reject":
            raise Rejected("main node rejected this node: %s" % printable(answer.get("reason")))
        if answer.get("t") != "welcome":
            raise protocol.ProtocolError("expected welcome, got %s"
                                         % printable(answer.get("t"), 40))
        if not isinstance(answer.get("client_key", ""), str):
            raise protocol.ProtocolError("welcome with a client key that is not a string")
        return answer

    def register(self, deadline, quiet=False, stop=None, timeout=None):
        """Register, retrying with backoff until ``deadline`` (epoch s; or ``timeout`` seconds
        from now, on the monotonic clock) or until ``stop()`` is true. Returns the welcome
        message; raises ``Rejected`` or ``RendezvousError``. An epoch deadline is turned into a
        monotonic one here, once: a wall-clock step while retrying neither ends the wait early
        nor stretches it. ``stop()`` is also checked while waiting for the main node's answer,
        so a node whose main accepts but never answers still stops promptly on SIGTERM."""
        if timeout is not None:
            deadline = time.monotonic() + timeout
        else:
            deadline = time.monotonic() + (deadline - time.time())
        self._stop_check = stop
        delay = 0.05
        last_error = None
        while True:
            if stop is not None and stop():
                raise RendezvousError("stopped while registering")
            self.attempts += 1
            try:
                self.welcome = self._attempt(deadline)
                return self.welcome
            except Rejected:
                self._close_sock()
                raise
            except (OSError, protocol.ProtocolError) as exc:
                last_error = exc
                self._close_sock()
            if not quiet and (self.attempts in (1, 10) or self.attempts % 50 == 0):
                log("main node %s:%d not answering yet (%s); retrying"
                    % (self.main_address, self.port, printable(str(last_error))))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RendezvousError("could not register with the main node %s:%d after %d "
                                      "attempts: %s" % (self.main_address, self.port,
                                                        self.attempts,
                                                        printable(str(last_error))))
            time.sleep(min(remaining, delay * (0.5 + random.random())))
            delay = min(delay * 2, 2.0)

    def send(self, message):
        with self._send_lock:
            sock = self.sock
            if sock is None:
                raise OSError("not connected")
            sock.sendall(self.session.seal(message))

    def ready(self):
        self.send({"t": "ready"})

    def start(self):
        """Start the reader/heartbeat thread; events: go, done, lost."""
        self.sock.settimeout(None)
        self.sock.setblocking(True)
        self._thread = threading.Thread(target=self._loop, name="rendezvous-client")
        self._thread.daemon = True
        self._thread.start()

    def _emit(self, event):
        self.events.put(event)

    def next_event(self, timeout):
        return self.events.get(timeout)

    def _loop(self):
        sock = self.sock
        last_rx = time.monotonic()
        next_hb = time.monotonic()
        try:
            pending = list(self._lines)
            self._lines.clear()
            while not self._stop.is_set():
                for line in pending:
                    msg = self.session.open(protocol.decode(line))
                    last_rx = time.monotonic()
                    kind = msg.get("t")
                    if kind == "go":
                        check_go(msg)
                        self._emit(("go", msg))
                    elif kind == "done":
                        if not protocol.is_int(msg.get("status")):
                            raise protocol.ProtocolError("done without an integer status")
                        self._emit(("done", msg))
                        return
                    elif kind != "hb":
                        raise protocol.ProtocolError("unexpected %s" % printable(kind, 40))
                pending = []
                now = time.monotonic()
                if now >= next_hb:
                    self.send({"t": "hb"})
                    next_hb = now + self.hb_interval
                if now - last_rx > self.hb_timeout:
                    self._emit(("lost", "no message from the main node for %gs"
                                % self.hb_timeout))
                    return
                readable, _, _ = select.select([sock], [], [], min(CLIENT_TICK,
                                                                   self.hb_interval))
                if readable:
                    chunk = sock.recv(65536)
                    if not chunk:
                        self._emit(("lost", "the main node closed the connection"))
                        return
                    last_rx = time.monotonic()
                    pending = self.buf.feed(chunk)
        except Exception as exc:  # whatever happens, the child must hear that the link is gone
            if not self._stop.is_set():
                self._emit(("lost", "connection to the main node failed: %s"
                            % printable(str(exc))))

    def report_exit(self, status, cause=None, failure=None):
        """Tell the main node this node's status (and, before ``ready``, the ``cause`` of a
        failed start-up check that the main node weighs across nodes; after, the ``failure`` of
        its ranks: ``registry.FAILURE_FIELDS``)."""
        message = {"t": "exit", "status": status}
        if cause:
            message["cause"] = cause
        if failure:
            message["failure"] = dict((k, v) for k, v in failure.items() if v is not None)
        with contextlib.suppress(OSError):
            self.send(message)

    def close(self):
        self._stop.set()
        self._close_sock()

    def _close_sock(self):
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
