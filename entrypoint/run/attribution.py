"""Which rank failed first, on which node, with which status and which error: read from what the
launcher and the ranks print and leave behind, as each launcher gives it.

``Scan`` reads the launcher's output as ``tee`` copies it through (the bytes themselves are passed
on unchanged; the scan sees at most ``SCAN_LINE_BYTES`` of each line) and keeps what these say:

- Python's tracebacks: ``Traceback (most recent call last):``, the indented frames, then the
  exception line (``ValueError: boom``); a chain (``During handling of the above exception ...``)
  ends with the exception that was raised last. A rank's fatal traceback is the last one it
  prints; several ranks failing together print theirs within a moment of each other, so the error
  named is the first traceback of the last burst (``BURST_S``).
- Open MPI's abort messages (``help-orterun.txt`` of Open MPI 4: ``orterun:non-zero-exit``
  "Process name: [[job,1],rank] / Exit code: N", ``orterun:proc-aborted-strsignal`` "process rank
  R with PID P on node H exited on signal N", ``orterun:proc-ordered-abort`` and
  ``orterun:proc-exit-no-sync`` "process rank R with PID P on / node H ...", and
  ``help-mpi-api.txt`` ``mpi-abort`` "MPI_ABORT was invoked on rank R ... with errorcode N").
  Lines ``--tag-output`` prefixed with ``[job,rank]<stream>:`` are the rank's own.
- torch.distributed.elastic's ``ChildFailedError`` (torchrun's last words): the "Root Cause (first
  observed failure)" record with ``host``, ``rank (local_rank: L)`` and ``exitcode`` (negative for
  a signal); and the error file torchrun writes to ``TORCHELASTIC_ERROR_FILE`` when the failed
  worker left one (``@record``): its ``message`` and ``errorCode``.
- DeepSpeed's pdsh runner: every line comes as ``host: line``; the per-node launcher
  (``deepspeed.launcher.launch``) says ``[...'--local_rank=L'] exits with return code = N`` and pdsh
  ``pdsh@...: host: ssh exited with exit code N``.

``conclude`` turns what was seen into the node's ``Failure``. Nothing here starts or stops
anything, and nothing read is trusted beyond one printable line.
"""

import json
import re
import threading
import time

from ..core.errors import SIGNAL_BASE
from ..core.log import printable

SCAN_LINE_BYTES = 4096  # what the scan reads of a line: the messages it looks for are short
ERROR_CHARS = 300  # an exception line in the final line, at most
BURST_S = 10.0  # tracebacks this close to the last one are one failure and its consequences

TRACEBACK = "Traceback (most recent call last):"
# Launchers' own tracebacks, which report the ranks' failure rather than being one: torchrun's
# ChildFailedError and SignalException, torch.distributed.launch's CalledProcessError (< 1.9).
LAUNCHER_EXCEPTIONS = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
                       "torch.distributed.elastic.multiprocessing.api.SignalException",
                       "subprocess.CalledProcessError")
CHAIN_MARKERS = ("During handling of the above exception, another exception occurred:",
                 "The above exception was the direct cause of the following exception:")
MPI_TAG = re.compile(r"^\[(\d+),(\d+)\]<(?:stdout|stderr|stddiag)>:(.*)$")
PDSH_OWN = re.compile(r"^pdsh@[^:]*: ([^:\s]+): ssh exited with exit code (-?\d+)")
PDSH_LINE = re.compile(r"^([^:\s]+): (.*)$")
MPI_NON_ZERO = re.compile(r"^\s*Process name: \[\[\d+,\d+\],(\d+)\]")
MPI_EXIT_CODE = re.compile(r"^\s*Exit code:\s+(-?\d+)")
MPI_SIGNAL = re.compile(r"noticed that process rank (\d+) with PID \d+ on node (\S+) exited on "
                        r"signal (\d+)")
MPI_RANK_ON = re.compile(r"has exited due to process rank (\d+) with PID \d+ on$")
MPI_NODE_ABORT = re.compile(r"^node (\S+) (calling \"abort\"|exiting improperly)")
MPI_ABORT = re.compile(r"^MPI_ABORT was invoked on rank (\d+) in communicator")
MPI_ABORT_CODE = re.compile(r"^with errorcode (-?\d+)\.")
ELASTIC_ROOT = "Root Cause (first observed failure):"
ELASTIC_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
ELASTIC_RANK = re.compile(r"^(\d+) \(local_rank: (\d+)\)")
ELASTIC_CODE = re.compile(r"^(-?\d+)")
DEEPSPEED_EXIT = re.compile(r"\] (\[.*\]) exits with return code = (-?\d+)")
LOCAL_RANK_ARG = re.compile(r"--local_rank=(\d+)")


def status_of(code):
    """A launcher's or a rank's reported code as an exit status: a negative code (Python's
    ``returncode`` for a signal, torchelastic's ``exitcode``) is 128+N."""
    if code < 0:
        return SIGNAL_BASE - code
    return code & 0xFF if code > 255 else code


class Failure(object):
    """The first failure one node saw: ``code`` (its exit status, 128+N for signal N),
    ``rank``/``local_rank`` (None when unknown), ``node`` (an index; None: the node that saw it),
    ``host`` (as the launcher named it), ``address`` (the node's, from the node table),
    ``error`` (the exception line, or None), ``at`` (the
    wall-clock time it was first seen, to order failures across nodes) and ``how`` (what said
    so, for the log)."""

    def __init__(self, code, rank=None, local_rank=None, node=None, host=None, error=None,
                 at=None, how="", address=None):
        self.code = code
        self.address = address
        self.rank = rank
        self.local_rank = local_rank
        self.node = node
        self.host = host
        self.error = error
        self.at = at
        self.how = how

    @classmethod
    def from_wire(cls, code, data):
        """A child's report, checked (a peer's words: bounded, printable)."""
        data = data if isinstance(data, dict) else {}

        def number(name, kind):
            value = data.get(name)
            return value if isinstance(value, kind) and not isinstance(value, bool) and \
                0 <= value < 2 ** 31 else None

        error = data.get("error")
        at = data.get("at")
        return cls(code, rank=number("rank", int), local_rank=number("local_rank", int),
                   error=printable(error, ERROR_CHARS) if isinstance(error, str) and error
                   else None, at=float(at) if isinstance(at, (int, float)) and
                   not isinstance(at, bool) else None, how="the node's report")

    def __repr__(self):
        return "Failure(%r)" % self.__dict__


class _Tracebacks(object):
    """Python tracebacks per writer (``key``: an Open MPI rank, a pdsh host, or None)."""

    def __init__(self):
        self.state = {}  # key -> [phase, start, last exception line]
        self.groups = []  # (start, key, exception line), in the order they ended

    def feed(self, key, line, now):
        entry = self.state.get(key)
        phase = entry[0] if entry else None
        if line.startswith(TRACEBACK):
            if phase == "chain":
                entry[0] = "frames"
            else:
                self._close(key)
                self.state[key] = ["frames", now, None]
            return
        if phase == "frames":
            if not line.strip() or line[0].isspace():
                return
            entry[0], entry[2] = "after", line.strip()
        elif phase in ("after", "chain"):
            if not line.strip():
                return
            if line.strip() in CHAIN_MARKERS:
                entry[0] = "chain"
                return
            self._close(key)

    def _close(self, key):
        entry = self.state.pop(key, None)
        if entry and entry[2] and not entry[2].startswith(LAUNCHER_EXCEPTIONS):
            self.groups.append((entry[1], key, entry[2]))

    def finish(self):
        for key in list(self.state):
            self._close(key)

    def error(self, key=None, any_key=True):
        """The first exception line of the last burst, of ``key``'s tracebacks (all writers'
        when ``any_key``); ``(at, line)`` or None."""
        groups = [g for g in self.groups if any_key or g[1] == key]
        if not groups:
            return None
        last = max(g[0] for g in groups)
        first = min((g for g in groups if g[0] >= last - BURST_S), key=lambda g: g[0])
        return first[0], printable(first[2], ERROR_CHARS)

    def keys_in_order(self):
        """The writers, by when their last burst began."""
        firsts = {}
        for start, key, _line in self.groups:
            if key not in firsts:
                firsts[key] = start
        return sorted(firsts, key=lambda k: firsts[k])


class Scan(object):
    """What the launcher's output said, fed as it passes (``feed``, from ``tee``'s threads)."""

    def __init__(self, pdsh=False):
        self.pdsh = pdsh
        self.lock = threading.Lock()
        self.partial = {}  # stream -> bytes of the line being read (at most SCAN_LINE_BYTES)
        self.overlong = {}  # stream -> True while the rest of an overlong line passes
        self.tracebacks = _Tracebacks()
        self.mpi = None  # {"rank", "host", "code"} of Open MPI's first abort message
        self.elastic = None  # torchelastic's root cause {"rank", "local_rank", "host", "code"}
        self.deepspeed = []  # (at, host, local_rank, code) of the node launchers' exits
        self.pdsh_exits = []  # (at, host, code) of pdsh's own lines
        self.first_seen = None  # wall time of the first sign of a failure
        self._previous = {}  # stream -> the previous untagged line (messages over two lines)
        self._elastic_open = None  # the root cause record being read

    # -- feeding ---------------------------------------------------------------------------
    def feed(self, stream, data, now=None):
        """``data`` as it arrived on ``stream``; complete lines are read."""
        now = time.time() if now is None else now
        with self.lock:
            buffer = self.partial.get(stream, b"")
            start = 0
            while True:
                cut = data.find(b"\n", start)
                if cut < 0:
                    rest = data[start:]
                    if not self.overlong.get(stream):
                        buffer += rest[:max(0, SCAN_LINE_BYTES - len(buffer))]
                        if len(rest) + len(buffer) > SCAN_LINE_BYTES:
                            self.overlong[stream] = True
                    break
                if not self.overlong.get(stream):
                    buffer += data[start:cut][:max(0, SCAN_LINE_BYTES - len(buffer))]
                self._line(stream, buffer, now)
                buffer, self.overlong[stream] = b"", False
                start = cut + 1
            self.partial[stream] = buffer

    def finish(self, now=None):
        """The end of the output: a last line without a newline, open tracebacks."""
        with self.lock:
            for stream, buffer in list(self.partial.items()):
                if buffer:
                    self._line(stream, buffer, time.time() if now is None else now)
            self.partial = {}
            self.tracebacks.finish()

    def _line(self, stream, raw, now):
        line = raw.decode("utf-8", "replace").rstrip("\r")
        key = None
        tagged = MPI_TAG.match(line)
        if tagged:
            key, line = ("rank", int(tagged.group(2))), tagged.group(3)
        elif self.pdsh:
            own = PDSH_OWN.match(line)
            if own:
                self.pdsh_exits.append((now, own.group(1), int(own.group(2))))
                self._seen(now)
                return
            prefixed = PDSH_LINE.match(line)
            if prefixed:
                key, line = ("host", prefixed.group(1)), prefixed.group(2)
        self.tracebacks.feed(key, line, now)
        if line.startswith(TRACEBACK):
            self._seen(now)
        self._messages(stream, key, line, now)

    def _seen(self, now):
        if self.first_seen is None:
            self.first_seen = now

    def _messages(self, stream, key, line, now):
        previous = self._previous.get((stream, key), "")
        self._previous[(stream, key)] = line
        if key is None or key[0] == "rank":
            self._open_mpi(key, line, previous, now)
        self._elastic(line, now)
        found = DEEPSPEED_EXIT.search(line)
        if found:
            local = LOCAL_RANK_ARG.search(found.group(1))
            host = key[1] if key is not None and key[0] == "host" else None
            self.deepspeed.append((now, host, int(local.group(1)) if local else None,
                                   int(found.group(2))))
            self._seen(now)

    def _open_mpi(self, key, line, previous, now):
        if self.mpi is not None and self.mpi.get("code") is not None:
            return  # the first message names the first failure
        found = None
        match = MPI_SIGNAL.search(line)
        if match:
            found = {"rank": int(match.group(1)), "host": match.group(2),
                     "code": SIGNAL_BASE + int(match.group(3))}
        elif MPI_EXIT_CODE.match(line) and MPI_NON_ZERO.match(previous):
            found = {"rank": int(MPI_NON_ZERO.match(previous).group(1)), "host": None,
                     "code": int(MPI_EXIT_CODE.match(line).group(1))}
        elif MPI_NODE_ABORT.match(line) and MPI_RANK_ON.search(previous):
            found = {"rank": int(MPI_RANK_ON.search(previous).group(1)),
                     "host": MPI_NODE_ABORT.match(line).group(1), "code": None}
        elif MPI_ABORT_CODE.match(line) and MPI_ABORT.match(previous):
            found = {"rank": int(MPI_ABORT.match(previous).group(1)), "host": None,
                     "code": int(MPI_ABORT_CODE.match(line).group(1))}
        if found is None:
            return
        found["code"] = None if found["code"] is None else status_of(found["code"])
        if self.mpi is None:
            self.mpi = found
        elif self.mpi["rank"] == found["rank"]:  # the same rank, more said: fill what lacked
            for name in ("host", "code"):
                if self.mpi.get(name) is None:
                    self.mpi[name] = found[name]
        self._seen(now)

    def _elastic(self, line, now):
        if line.strip() == ELASTIC_ROOT:
            self._elastic_open = {}
            self._seen(now)
            return
        record = self._elastic_open
        if record is None:
            return
        field = ELASTIC_FIELD.match(line)
        if field is None:
            if record and not line.startswith("["):  # "[0]:" starts it; anything else ends it
                self._elastic_open = None
            return
        name, value = field.group(1), field.group(2).strip()
        if name == "host":
            record["host"] = value
        elif name == "rank" and ELASTIC_RANK.match(value):
            record["rank"] = int(ELASTIC_RANK.match(value).group(1))
            record["local_rank"] = int(ELASTIC_RANK.match(value).group(2))
        elif name == "exitcode" and ELASTIC_CODE.match(value):
            record["code"] = status_of(int(ELASTIC_CODE.match(value).group(1)))
        elif name == "traceback" and value and not value.startswith("To enable traceback"):
            record["traceback"] = value
        if self.elastic is None and "code" in record:
            self.elastic = record

    # -- reading ---------------------------------------------------------------------------
    def error(self, key=None, any_key=True):
        with self.lock:
            return self.tracebacks.error(key, any_key)

    def first_failure_at(self):
        """When this node first saw a failure (a traceback, a launcher's message), or None."""
        with self.lock:
            return self.first_seen


class JobShape(object):
    """What mapping a rank or a host to a node needs: the node table (``NodeInfo`` rows, in
    hostfile order), this node's index, whether ranks fill the nodes in hostfile order, slot by
    slot (``by_slot``: mpirun's ``--map-by slot`` and DeepSpeed's world info; not when the
    user's launcher arguments map the ranks themselves), and this host's own names."""

    def __init__(self, table, node_index, by_slot=True, own_names=()):
        self.table = list(table or [])
        self.node_index = node_index
        self.by_slot = by_slot
        self.own_names = set(own_names)

    def node_of_host(self, host):
        for row in self.table:
            if row.address == host:
                return row.index
        if host in self.own_names or host in ("localhost", "127.0.0.1"):
            return self.node_index
        return None

    def first_rank(self, index):
        """The first global rank on node ``index`` when ranks fill nodes slot by slot."""
        if not self.by_slot:
            return None
        rank = 0
        for row in self.table:
            if row.index == index:
                return rank
            rank += row.slots
        return None

    def node_of_rank(self, rank):
        if not self.by_slot:
            return None
        start = 0
        for row in self.table:
            if start <= rank < start + row.slots:
                return row.index
            start += row.slots
        return None

    def address(self, index):
        for row in self.table:
            if row.index == index:
                return row.address
        return None


def read_error_file(path):
    """torchelastic's error record at ``path`` (``TORCHELASTIC_ERROR_FILE``): ``(message line,
    errorCode or None)``, or None when there is none. torch/distributed/elastic/multiprocessing/
    errors/error_handler.py writes ``{"message": {"message": "ValueError: boom", "extraInfo":
    {...}, "errorCode": N}}`` (``errorCode`` only when torchrun copied a failed worker's record)."""
    if not path:
        return None
    try:
        with open(path) as handle:
            data = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        text, code = message.get("message"), message.get("errorCode")
    else:
        text, code = message, None
    line = None
    if isinstance(text, str) and text.strip():
        lines = [part for part in text.strip().splitlines() if part.strip()]
        line = printable(lines[0].strip(), ERROR_CHARS)
    return line, code if isinstance(code, int) and not isinstance(code, bool) else None


def conclude(scan, code, shape, error_file=None):
    """This node's ``Failure`` from what ``scan`` saw and the launcher's exit ``code`` (which
    ended non-zero), or None when the launcher succeeded."""
    if code == 0:
        return None
    scan.finish()
    if scan.mpi is not None:
        return _from_open_mpi(scan, code, shape)
    record = read_error_file(error_file)
    if scan.elastic is not None or record is not None:
        return _from_elastic(scan, code, record)
    if scan.deepspeed or scan.pdsh_exits:
        return _from_deepspeed(scan, code, shape)
    seen = scan.error()
    return Failure(code, error=seen[1] if seen else None,
                   at=seen[0] if seen else scan.first_failure_at() or time.time(),
                   how="the command's exit status")


def _from_open_mpi(scan, code, shape):
    info = scan.mpi
    rank = info["rank"]
    node = shape.node_of_host(info["host"]) if info["host"] else None
    if node is None:
        node = shape.node_of_rank(rank)
    first = shape.first_rank(node) if node is not None else None
    tagged = scan.error(("rank", rank), any_key=False)
    seen = tagged or scan.error()
    return Failure(info["code"] if info["code"] else code, rank=rank,
                   local_rank=rank - first if first is not None else None, node=node,
                   host=info["host"], error=seen[1] if seen else None,
                   at=seen[0] if seen else scan.first_failure_at(),
                   how="Open MPI's abort message",
                   address=shape.address(node) if node is not None else None)


def _from_elastic(scan, code, record):
    root = scan.elastic or {}
    status = root.get("code")
    if status is None and record is not None and record[1] is not None:
        status = status_of(record[1])
    seen = scan.error()
    error = record[0] if record is not None and record[0] else (seen[1] if seen else None)
    if error is None and root.get("traceback", "").startswith("Signal "):
        error = printable(root["traceback"], ERROR_CHARS)  # "Signal 9 (SIGKILL) received by PID"
    return Failure(status if status else code, rank=root.get("rank"),
                   local_rank=root.get("local_rank"), host=root.get("host"), error=error,
                   at=seen[0] if seen else scan.first_failure_at(),
                   how="torchelastic's root cause%s" % (" and error file" if record else ""))


def _from_deepspeed(scan, code, shape):
    """The node that failed first: the first whose ranks printed a traceback, else the first
    whose launcher reported an exit; its launcher's line gives the local rank and status."""
    hosts = [key[1] for key in scan.tracebacks.keys_in_order() if key and key[0] == "host"]
    exits = sorted(scan.deepspeed, key=lambda e: e[0])
    host = hosts[0] if hosts else (exits[0][1] if exits else sorted(scan.pdsh_exits)[0][1])
    mine = [e for e in exits if e[1] == host]
    local_rank = mine[0][2] if mine else None
    status = status_of(mine[0][3]) if mine else None
    if status is None:
        ssh = [e for e in scan.pdsh_exits if e[1] == host]
        status = status_of(ssh[0][2]) if ssh else code
    node = shape.node_of_host(host)
    first = shape.first_rank(node) if node is not None else None
    seen = scan.error(("host", host), any_key=False)
    return Failure(status or code, rank=first + local_rank if first is not None and
                   local_rank is not None else None, local_rank=local_rank, node=node,
                   host=host, error=seen[1] if seen else None,
                   at=seen[0] if seen else scan.first_failure_at(),
                   how="DeepSpeed's launcher on %s" % host,
                   address=shape.address(node) if node is not None else None)
