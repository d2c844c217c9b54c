"""The rendezvous server's side of each connection: accepting under limits, framing, the
authenticated handshake, heartbeats and closing (``Peers``, a part of ``connection.Connections``,
whose loop calls these). Every peer-supplied byte is checked here before anything else sees it.
"""

import contextlib
import errno
import selectors
import socket
import time

from ..core.log import log, printable
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


class Peers(object):
    """Per-connection handling for ``connection.Connections`` (which owns the selector, the
    listening socket, the pending set and the hooks these call)."""

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
