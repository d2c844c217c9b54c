"""The rendezvous server's connection handling: sockets, framing, authentication and limits.

``Connections`` runs one thread with a ``selectors`` loop (one connection per child, kept open
for the whole job). It turns bytes into authenticated messages and hands them to its subclass
(``rendezvous.Server``), which keeps the job's node registry (``registry``): ``_accepting``,
``_on_register``, ``_on_message`` and ``_on_closed``.

Hostile peers (the port is reachable by anything on the network; the secret is optional):

- Handling one connection ends in accepting or rejecting that connection, nothing else: every
  field is decoded with its type and bounds checked before use (``protocol.decode`` caps line
  size and nesting), and whatever a peer can send wrong is a ``ProtocolError`` that rejects
  that connection only.
- Any other exception while serving a connection is the server's own bug, not the peer's: it
  is never turned into a rejection (a legitimate child would exit as misconfigured, the main
  node would wait out ``MNP_WAIT_TIMEOUT``). Its traceback is logged in full and the server
  fails (``ServerFailed``): the main node ends the job at once as infrastructure (issue 31).
- At most ``max_pending`` connections may wait for authentication; a new one evicts the oldest
  (a legitimate child finishes its handshake within one round trip, an idle one is the likely
  attacker). Each must finish within ``handshake_timeout``.
- ``accept`` failing for lack of file descriptors (EMFILE/ENFILE) pauses accepting with an
  exponential back-off (10 ms to 1 s) instead of spinning; the kernel's listen backlog holds
  the waiting connections meanwhile, and the oldest connection still waiting for
  authentication (if older than ``PENDING_GRACE``) is dropped to free a descriptor.
- Peer-supplied text is escaped before it is logged (``log.printable``), and lines a peer can
  cause at will (rejections, accept failures) are throttled.
- If the server thread stops for any reason other than ``stop``, ``failure`` says why, ``wait``
  and ``go`` raise ``ServerFailed`` at once, and a ``("lost", None, reason)`` event is queued.
"""

import collections
import contextlib
import errno
import selectors
import socket
import threading
import time
import traceback
from typing import Any, Dict, Optional

from ..core.log import Throttle, log, printable
from . import protocol
from .states import CONNECTED, NodeState, advance

MAX_PENDING = 64  # connections waiting for authentication (at least; see Server.max_pending)
ACCEPT_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_BACKOFF = (0.01, 1.0)  # first and longest pause after accept fails for lack of resources
CLOSING_GRACE = 2.0  # how long a rejected peer gets to read the reply before it is cut off
PENDING_GRACE = 0.25  # a connection this young may be a child mid-handshake: not evicted on EMFILE
LOOP_TICK = 0.2  # the server loop wakes at least this often (heartbeats, timeouts)


class Conn(object):
    """One peer's socket, its buffers, its session and where it is in the protocol."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.buf = protocol.LineBuffer(protocol.MAX_HELLO_LINE)
        self.out = b""
        self.sn = protocol.new_nonce()
        self.session = None
        self.index = None  # an int in range, set only once the registration is valid
        self.claim = None  # what the peer says its index is, printable, for the log
        self.info = None
        self.state = NodeState.HELLO  # changed only by ``states.advance``
        self.closing_since = None  # set when a reply is still being sent before closing
        self.opened = time.monotonic()
        self.last_rx = self.opened


class RendezvousError(Exception):
    """The rendezvous could not complete (timeout, main node unreachable)."""


class ServerFailed(RendezvousError):
    """The main node's rendezvous server thread stopped; the job cannot go on."""


class ServerBug(Exception):
    """The server's own code failed while serving a connection (see ``Connections._contain``)."""


class EventQueue(object):
    """Events the rendezvous thread hands to the launching thread, oldest first."""

    def __init__(self):
        self._items = collections.deque()
        self._cond = threading.Condition()

    def put(self, event):
        with self._cond:
            self._items.append(event)
            self._cond.notify_all()

    def get(self, timeout):
        """Pop one event, waiting at most ``timeout`` s; ``None`` if none came."""
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            if self._items:
                return self._items.popleft()
        return None


class Connections(object):
    """The listening socket, the loop thread (``start``, ``stop``) and each connection's handling:
    accepting under limits, framing, the authenticated handshake, heartbeats and closing; every
    peer-supplied byte is checked here before anything else sees it. Subclasses say what an
    authenticated connection means (``_accepting``, ``_on_register``, ``_on_message``,
    ``_on_closed``, ``_on_failed``)."""

    def __init__(self, secret: Optional[bytes], port: int, host: str, hb_interval: float,
                 hb_timeout: float, handshake_timeout: float, max_pending: int) -> None:
        self.secret = secret
        self.port = port
        self.host = host
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.handshake_timeout = handshake_timeout
        self.max_pending = max_pending
        self.rejected = collections.deque(maxlen=200)  # (peer, reason), latest, for tests
        self.rejected_count = 0
        self.failure = None  # why the server thread stopped, when not by ``stop``
        self.events = EventQueue()  # ("lost", index, reason) | ("exit", index, status)
        self._calls = collections.deque()
        self._conns = set()
        self._pending = collections.OrderedDict()  # Conn -> None, oldest first (hello state)
        self._closing_reason = {}  # Conn -> why, for connections closing after a reply
        self._sel = None
        self._lsock = None
        self._wake_r = self._wake_w = None
        self._thread = None
        self._stopped = threading.Event()
        self._log_reject = Throttle("rejected connection(s)", limit=20, interval=10.0)
        self._log_accept = Throttle("failed accept(s)", limit=3, interval=10.0)
        self._accept_paused_until = None
        self._accept_backoff = ACCEPT_BACKOFF[0]

    # -- what the subclass decides ----------------------------------------------------------
    def _accepting(self) -> bool:
        """Whether new connections and registrations are welcome."""
        raise NotImplementedError

    def _on_register(self, conn: Conn, msg: Dict[str, Any]) -> None:
        """An authenticated ``register``: validate it, call ``_admitted``, answer."""
        raise NotImplementedError

    def _on_message(self, conn: Conn, msg: Dict[str, Any]) -> None:
        """An authenticated message after the registration."""
        raise NotImplementedError

    def _on_closed(self, conn: Conn, was: str, reason: Optional[str], quiet: bool) -> None:
        """``conn`` (in state ``was``) is closed; ``reason`` is ``None`` when expected."""
        raise NotImplementedError

    def _on_failed(self) -> None:
        """The loop thread stopped on a failure (``failure`` says why): wake every waiter."""
        raise NotImplementedError

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "Connections":
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((self.host, self.port))
        self.port = self._lsock.getsockname()[1]
        self._lsock.listen(4096)
        self._lsock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._lsock, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="rendezvous-server")
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self):
        self._call(self._shutdown)
        if self._thread is not None:
            self._thread.join(5)

    def _call(self, fn):
        self._calls.append(fn)
        with contextlib.suppress(OSError, AttributeError):
            self._wake_w.send(b"x")

    def _run_in_loop(self, fn, timeout):
        """Run ``fn`` in the loop thread; return its result or raise its exception here.
        Raises ``ServerFailed`` if the loop is (or goes) down instead of waiting in vain."""
        self._check_alive()
        result = {}
        finished = threading.Event()

        def _job():
            try:
                result["value"] = fn()
            except Exception as exc:  # handed to the calling thread, not lost in the loop
                result["error"] = exc
            finally:
                finished.set()

        self._call(_job)
        end = time.monotonic() + timeout
        while not finished.wait(0.05):
            self._check_alive()
            if time.monotonic() >= end:
                raise ServerFailed("rendezvous server did not answer within %gs" % timeout)
        if "error" in result:
            raise result["error"]
        return result.get("value")

    def _check_alive(self):
        if self.failure is not None:
            raise ServerFailed(self.failure)

    # -- loop ------------------------------------------------------------------------------
    def _loop(self):
        next_hb = time.monotonic() + self.hb_interval
        try:
            while not self._stopped.is_set():
                for key, mask in self._sel.select(self._select_timeout()):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._service(key.data, mask)
                now = time.monotonic()
                self._maybe_resume_accept(now)
                if now >= next_hb:
                    next_hb = now + self.hb_interval
                    self._heartbeat(now)
                    self._log_reject.flush()
                    self._log_accept.flush()
        except ServerBug as exc:  # its traceback is already in the log
            self._fail(str(exc))
        except BaseException as exc:  # never die silently: the main thread would wait forever
            _log_traceback("rendezvous server thread failed")
            self._fail("rendezvous server failed: %s" % printable(repr(exc)))
        else:
            if not self._stopped.is_set():
                self._fail("rendezvous server stopped unexpectedly")
        finally:
            with contextlib.suppress(Exception):
                self._close_all()

    def _fail(self, reason):
        self.failure = reason
        log(reason)
        self._emit(("lost", None, reason))
        self._on_failed()  # wake ``wait`` so it raises at once

    def _select_timeout(self):
        timeout = min(LOOP_TICK, self.hb_interval)
        if self._accept_paused_until is not None:
            timeout = min(timeout, max(0.0, self._accept_paused_until - time.monotonic()))
        return timeout

    def _service(self, conn, mask):
        """Read and/or flush one connection; whatever goes wrong ends this connection only."""
        try:
            if mask & selectors.EVENT_READ:
                self._read(conn)
            if mask & selectors.EVENT_WRITE and conn.state is not NodeState.CLOSED:
                self._flush(conn)
        except Exception as exc:
            self._contain(conn, exc)

    def _contain(self, conn, exc):
        """``exc`` escaped while serving ``conn``: not the peer's doing (what a peer can get
        wrong is a ``ProtocolError``, rejected where it is raised) but this server's bug. The
        traceback goes to the main node's log in full; the server fails (``ServerBug`` ends the
        loop), so the main node reports an internal failure, never a rejection of the child."""
        who = conn.peer if conn.claim is None else "%s (node %s)" % (conn.peer, conn.claim)
        if conn.index is not None:
            who = "node %d (%s)" % (conn.index, conn.peer)
        _log_traceback("rendezvous server: internal error while serving %s" % who)
        raise ServerBug("internal error of the rendezvous server while serving %s: %s"
                        % (who, printable(repr(exc))))

    def _drain_wake(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._calls:
            self._calls.popleft()()

    def _shutdown(self):
        self._stopped.set()

    def _close_all(self):
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                self._close(conn, None)
        for sock in (self._lsock, self._wake_r, self._wake_w):
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            with contextlib.suppress(OSError):
                sock.close()
        self._sel.close()


    # -- each connection: accepting under limits, framing, the handshake, heartbeats, closing --
    def _accept(self):
        for _ in range(256):  # bounded: a connection flood must not starve the other sockets
            try:
                sock, peer = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in ACCEPT_ERRORS:
                    self._pause_accept(exc)
                    return
                raise
            self._accept_backoff = ACCEPT_BACKOFF[0]
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:  # one bad connection is that connection's problem only
                self._log_reject("dropped a new connection: %s" % printable(str(exc)))
                with contextlib.suppress(OSError):
                    sock.close()
                continue
            conn = Conn(sock, "%s:%d" % peer[:2])
            self._conns.add(conn)
            try:
                self._admit(conn)
            except Exception as exc:
                self._contain(conn, exc)

    def _pause_accept(self, exc):
        """Out of file descriptors (or kernel memory): stop polling the listening socket for a
        while instead of spinning on it; connections wait in the kernel's backlog meanwhile."""
        delay = self._accept_backoff
        self._accept_backoff = min(delay * 2, ACCEPT_BACKOFF[1])
        self._log_accept("cannot accept connections (%s): pausing accept for %gs"
                         % (exc.strerror or exc, delay))
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(self._lsock)
        self._accept_paused_until = time.monotonic() + delay
        if exc.errno in (errno.EMFILE, errno.ENFILE) and self._pending:
            # Idle unauthenticated connections may be what holds the descriptors: free the
            # oldest (not one still mid-handshake) so a real child in the backlog can get in.
            oldest = next(iter(self._pending))
            if time.monotonic() - oldest.opened > PENDING_GRACE:
                self._reject(oldest, "out of file descriptors; dropped the oldest connection "
                             "waiting for authentication")

    def _maybe_resume_accept(self, now):
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            try:
                self._sel.register(self._lsock, selectors.EVENT_READ, "listen")
            except OSError as exc:  # e.g. ENOMEM from epoll_ctl: still out of resources
                self._pause_accept(exc)

    def _admit(self, conn):
        self._sel.register(conn.sock, selectors.EVENT_READ, conn)
        if not self._accepting():
            self._log_reject("refused a connection from %s: the job has already started"
                             % conn.peer)
            self._send(conn, {"t": "reject", "reason": "the job has already started"})
            self._close(conn, None, after_flush=True)
            return
        if len(self._pending) >= self.max_pending:
            oldest = next(iter(self._pending))
            self._reject(oldest, "more than %d connections waiting for authentication; "
                         "dropped the oldest" % self.max_pending)
        self._pending[conn] = None
        self._send(conn, {"t": "hello", "v": protocol.VERSION, "sn": conn.sn}, raw=True)

    def _send(self, conn, message, raw=False):
        if conn.state is NodeState.CLOSED or conn.closing_since is not None:
            return
        plain = raw or conn.session is None
        conn.out += protocol.encode(message) if plain else conn.session.seal(message)
        self._flush(conn)

    def _flush(self, conn):
        try:
            while conn.out:
                sent = conn.sock.send(conn.out)
                conn.out = conn.out[sent:]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self._close(conn, "send failed: %s" % exc)
            return
        if conn.state is NodeState.CLOSED:
            return
        if not conn.out and conn.closing_since is not None:
            self._close(conn, None)
            return
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.modify(conn.sock, mask, conn)

    def _read(self, conn):
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(conn, "connection error: %s" % exc)
            return
        if not chunk:
            self._close(conn, "connection closed")
            return
        if conn.closing_since is not None:
            return  # a rejected peer still talking: ignore it until our reply is out
        conn.last_rx = time.monotonic()
        try:
            lines = conn.buf.feed(chunk)
        except protocol.ProtocolError as exc:
            self._reject(conn, str(exc))
            return
        for line in lines:
            if conn.state is NodeState.CLOSED or conn.closing_since is not None:
                return
            try:
                max_line = protocol.MAX_LINE if conn.session else protocol.MAX_HELLO_LINE
                self._handle(conn, protocol.decode(line, max_line))
            except protocol.ProtocolError as exc:
                self._reject(conn, str(exc))
                return

    def _reject(self, conn, reason):
        self.rejected_count += 1
        if conn.index is not None:
            log("dropped node %d from %s: %s" % (conn.index, conn.peer, printable(reason)))
        else:
            claim = "" if conn.claim is None else " (claims node %s)" % conn.claim
            self._log_reject("rejected registration from %s%s: %s"
                             % (conn.peer, claim, printable(reason)))
            self.rejected.append((conn.peer, reason))
        self._send(conn, {"t": "reject", "reason": reason.split(":")[0][:200]})
        self._close(conn, reason, after_flush=True)

    def _handle(self, conn, msg):
        if conn.state is NodeState.HELLO:
            self._handle_hello(conn, msg)
            return
        conn.session.open(msg)
        self._on_message(conn, msg)

    def _handle_hello(self, conn, msg):
        """The first message: a ``register`` that must authenticate; then ``_on_register``."""
        kind = msg.get("t")
        if kind != "register":
            raise protocol.ProtocolError("expected register, got %s" % printable(kind, 40))
        conn.claim = printable(msg.get("index"), 40)
        if not self._accepting():  # connected before ``go``, registering after it
            raise protocol.ProtocolError("the job has already started")
        session = protocol.Session(self.secret, conn.sn, msg.get("cn"), protocol.S2C)
        try:
            session.open(msg)
        except protocol.AuthError as exc:
            raise protocol.AuthError(
                "authentication failed (%s; is MNP_SECRET the same on every node?)" % exc
            ) from None
        conn.session = session
        conn.buf.max_line = protocol.MAX_LINE
        self._on_register(conn, msg)

    def _admitted(self, conn):
        """``conn`` registered: it no longer counts as waiting for authentication."""
        self._pending.pop(conn, None)

    def _heartbeat(self, now):
        for conn in list(self._conns):
            try:
                self._check_peer(conn, now)
            except Exception as exc:
                self._contain(conn, exc)

    def _check_peer(self, conn, now):
        if conn.closing_since is not None:
            if now - conn.closing_since > CLOSING_GRACE:
                self._close(conn, None)  # the peer does not read our reply: stop trying
        elif conn.state in (NodeState.HELLO, NodeState.REGISTERED):
            if now - conn.opened > self.handshake_timeout:
                self._close(conn, "handshake not completed within %gs" % self.handshake_timeout)
        elif conn.state in CONNECTED:
            if now - conn.last_rx > self.hb_timeout:
                self._close(conn, "no heartbeat for %gs" % self.hb_timeout)
            else:
                self._send(conn, {"t": "hb"})

    def _emit(self, event):
        self.events.put(event)

    def _close(self, conn, reason, after_flush=False, quiet=False):
        if conn.state is NodeState.CLOSED:
            return
        self._pending.pop(conn, None)
        if after_flush and conn.out:
            if conn.closing_since is None:
                conn.closing_since = time.monotonic()
                self._closing_reason[conn] = reason
            return
        reason = self._closing_reason.pop(conn, reason)
        was = conn.state
        advance(conn, NodeState.CLOSED)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()
        self._conns.discard(conn)
        self._on_closed(conn, was, reason, quiet)


def _log_traceback(what):
    """``what``, then the traceback being handled, each line in the log."""
    log(what + ":")
    for line in traceback.format_exc().rstrip().splitlines():
        log("  " + line)
