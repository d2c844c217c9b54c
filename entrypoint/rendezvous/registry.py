"""The rendezvous's node registry: who registered, one entry per index, who is ready, and go/stop.

Pure bookkeeping, no sockets (``connection`` owns those): the registration checks
(``validate_registration``, ``check_go``) and ``Registry``, the main node's table of children.

- A node that registers again (a restarted container) replaces its old entry: the table is keyed
  by node index, the old connection is closed. A node whose connection drops before the job
  starts is removed and waited for again.
- After ``go`` (phase ``running``), registrations are refused, and a lost connection is a
  ``lost`` event: the main node fails the job instead of hanging.
"""

import ipaddress
import re
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ..core.limits import MAX_SLOTS
from ..core.log import log, printable
from ..core.nodes import NodeInfo
from . import protocol
from .states import NodeState, advance

CAUSE_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}\Z")
# What a child may say of its ranks' failure with its status (``run.attribution``); the values
# are checked again where they are read (``Failure.from_wire``: numbers, one printable line).
FAILURE_FIELDS = ("rank", "local_rank", "error", "at")
MAX_ERROR = 1000
HOST_KEY_RE = re.compile(r"^(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/]+=*\Z")


def job_base(job_id):
    """Batch node job ids look like ``<job id>#<node index>``; compare the job part only."""
    return (job_id or "").split("#", 1)[0]


def validate_registration(msg, num_nodes, main_index, job_id, need_host_key):
    """Return a ``NodeInfo`` from a register message, or raise ``ProtocolError`` saying why.

    Every field's type is checked before its value is used (the message comes off the network)."""
    if not protocol.is_int(msg.get("v")) or msg["v"] != protocol.VERSION:
        raise protocol.ProtocolError("protocol version %s, expected %d"
                                     % (printable(msg.get("v"), 40), protocol.VERSION))
    job = msg.get("job")
    if job is not None and not isinstance(job, str):
        raise protocol.ProtocolError("job id %s is not a string" % printable(job, 40))
    if job_base(job) != job_base(job_id):
        raise protocol.ProtocolError("job id %s is not this job's (%s)"
                                     % (printable(job, 80), printable(job_id, 80)))
    index = msg.get("index")
    if not protocol.is_int(index) or not 0 <= index < num_nodes:
        raise protocol.ProtocolError("node index %s out of range 0..%d"
                                     % (printable(index, 40), num_nodes - 1))
    if index == main_index:
        raise protocol.ProtocolError("node index %d is the main node's" % index)
    addr = msg.get("addr")
    try:
        if not isinstance(addr, str):
            raise TypeError(addr)
        ip = ipaddress.IPv4Address(addr)
    except (ValueError, TypeError):
        raise protocol.ProtocolError("address %s is not IPv4" % printable(addr, 60)) from None
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_link_local:
        raise protocol.ProtocolError("address %s is not usable" % ip)
    slots = msg.get("slots")
    if not protocol.is_int(slots) or not 1 <= slots <= MAX_SLOTS:
        raise protocol.ProtocolError("slots %s out of range 1..%d"
                                     % (printable(slots, 40), MAX_SLOTS))
    key = msg.get("host_key") or ""
    if not isinstance(key, str) or (key and not HOST_KEY_RE.match(key)):
        raise protocol.ProtocolError("host key is not an OpenSSH public key")
    if need_host_key and not key:
        raise protocol.ProtocolError("no SSH host key (the launcher needs SSH)")
    return NodeInfo(index, str(ip), slots, key)


def check_go(msg):
    """A ``go`` message's node table, if it has one, is ``[[index, IPv4 address, slots], ...]``
    (what the child turns into ``NodeInfo``); other fields are the caller's to check."""
    nodes = msg.get("nodes", [])
    if not isinstance(nodes, list) or len(nodes) > 100000:
        raise protocol.ProtocolError("go: nodes is not a list")
    for node in nodes:
        if not (isinstance(node, list) and len(node) == 3 and protocol.is_int(node[0])
                and isinstance(node[1], str) and len(node[1]) <= 64
                and protocol.is_int(node[2])):
            raise protocol.ProtocolError("go: node entry %s is not [index, address, slots]"
                                         % printable(node, 80))


class Registry(object):
    """The main node's table of children, keyed by node index, and the job's phase:
    ``waiting`` (registrations welcome) | ``running`` (after ``go``) | ``stopping`` (after
    ``done``) | ``stopped``. The connection objects it holds are ``connection.Conn``."""

    def __init__(self, num_nodes: int, main_index: int) -> None:
        self.num_nodes = num_nodes
        self.main_index = main_index
        self.phase = "waiting"  # waiting | running | stopping | stopped
        self.ready = {}  # index -> NodeInfo, only of connections in state READY
        self.failed = {}  # index -> status: nodes that failed their checks; never ready again
        self.causes = {}  # index -> the cause a failed node reported (``run.gate``'s words)
        # index -> what a node whose launcher failed reported of its ranks' first failure
        # (``run.attribution.Failure.to_wire``: rank, local rank, exception line, when seen)
        self.failures = {}
        self.by_index = {}  # index -> Conn (registered or ready)
        self.all_ready = threading.Event()
        self.last_ready_time = None
        if num_nodes - 1 == 0:
            self.all_ready.set()

    def missing(self) -> List[int]:
        want = set(range(self.num_nodes)) - {self.main_index}
        return sorted(want - set(self.ready))

    def can_go(self) -> bool:
        """Every child is ready and none failed its checks: the only state ``go`` starts from."""
        return not self.missing() and not self.failed and all(
            self.by_index.get(index) is not None
            and self.by_index[index].state is NodeState.READY for index in self.ready)

    def table(self, main_info: NodeInfo) -> List[NodeInfo]:
        """All nodes, the main node included, sorted by index."""
        nodes = dict(self.ready)
        nodes[main_info.index] = main_info
        return [nodes[i] for i in sorted(nodes)]

    def connections(self, *states: str) -> List[Any]:
        """The registered connections in one of ``states``."""
        return [conn for conn in list(self.by_index.values()) if conn.state in states]

    def replaced(self, conn: Any, info: NodeInfo) -> Optional[Any]:
        """The old connection that ``conn``'s registration replaces (the caller closes it
        quietly), after taking its node out of the ready set; ``None`` for a first one."""
        old = self.by_index.get(info.index)
        if old is None or old is conn:
            return None
        where = old.info.address if old.info else old.peer
        log("node %d registered again from %s (was %s): replacing the old entry"
            % (info.index, info.address, where))
        self.ready.pop(info.index, None)
        self.all_ready.clear()
        return old

    def add(self, conn: Any, info: NodeInfo) -> None:
        advance(conn, NodeState.REGISTERED)
        conn.index = info.index
        conn.info = info
        self.by_index[info.index] = conn

    def mark_ready(self, conn: Any) -> None:
        if conn.index in self.failed:  # a restarted container of a node that failed: still failed
            raise protocol.ProtocolError("node %d already failed its start-up checks (status %d)"
                                         % (conn.index, self.failed[conn.index]))
        advance(conn, NodeState.READY)
        self.ready[conn.index] = conn.info
        total = self.num_nodes - 1
        log("node %d ready: %s, %d slot(s) (%d/%d children)"
            % (conn.index, conn.info.address, conn.info.slots, len(self.ready), total))
        if len(self.ready) == total:
            self.last_ready_time = time.monotonic()
            self.all_ready.set()

    def mark_exited(self, conn: Any, msg: Dict[str, Any]) -> int:
        """The status of a child's ``exit`` message (checked). From ``READY`` (its launcher
        ended) ``conn`` is then ``EXITED``; from ``REGISTERED`` (it failed its start-up checks,
        a non-zero status) ``FAILED``, and its index can never be counted ready."""
        status = msg.get("status")
        if not protocol.is_int(status) or not -(2 ** 31) <= status < 2 ** 31:
            raise protocol.ProtocolError("exit without an integer status")
        if conn.state is NodeState.REGISTERED:
            if status == 0:
                raise protocol.ProtocolError("exit status 0 before ready")
            cause = msg.get("cause")
            if cause is not None and not (isinstance(cause, str) and CAUSE_RE.match(cause)):
                raise protocol.ProtocolError("exit with a cause that is not a short word")
            advance(conn, NodeState.FAILED)
            self.failed[conn.index] = status
            if cause is not None:
                self.causes[conn.index] = cause
            log("node %d failed its start-up checks (exit code %d)" % (conn.index, status))
            return status
        failure = msg.get("failure")
        if failure is not None:
            if not isinstance(failure, dict) or len(failure) > len(FAILURE_FIELDS) or \
                    set(failure) - set(FAILURE_FIELDS):
                raise protocol.ProtocolError("exit with a failure that is not a record of %s"
                                             % ", ".join(FAILURE_FIELDS))
            error = failure.get("error")
            if error is not None and not (isinstance(error, str) and len(error) <= MAX_ERROR):
                raise protocol.ProtocolError("exit with an error longer than %d characters"
                                             % MAX_ERROR)
            self.failures[conn.index] = failure
        advance(conn, NodeState.EXITED)
        return status

    def remove(self, conn: Any, was: str) -> bool:
        """Forget a closed connection (in state ``was``); ``False`` when it was no entry."""
        if conn.index is None or self.by_index.get(conn.index) is not conn:
            return False
        del self.by_index[conn.index]
        if was is NodeState.READY and self.ready.get(conn.index) is conn.info:
            del self.ready[conn.index]
            self.all_ready.clear()
        return True

    def lost(self, conn: Any, was: str, reason: str) -> Optional[Tuple[str, int, str]]:
        """What a removed entry's unexpected close means: waited for again before the job
        starts (logged), a ``lost`` event while it runs, nothing after."""
        if self.phase == "waiting":
            log("node %d (%s) went away before the job started (%s); waiting for it again"
                % (conn.index, conn.peer, printable(reason)))
        elif self.phase == "running" and was in (NodeState.READY, NodeState.REGISTERED):
            return ("lost", conn.index, reason)
        return None
