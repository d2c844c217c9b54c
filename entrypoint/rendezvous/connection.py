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
import selectors
import socket
import threading
import time
import traceback
from typing import Any, Dict, Optional

from ..core.log import Throttle, log, printable
from .peers import ACCEPT_BACKOFF, LOOP_TICK, Conn, Peers
from .states import NodeState


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


class Connections(Peers):
    """The listening socket and the loop thread; ``start``, ``stop``. Subclasses say what an
    authenticated connection means (``_accepting``, ``_on_register``, ``_on_message``,
    ``_on_closed``)."""

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


def _log_traceback(what):
    """``what``, then the traceback being handled, each line in the log."""
    log(what + ":")
    for line in traceback.format_exc().rstrip().splitlines():
        log("  " + line)
