"""One-line log messages on stderr, prefixed with this node's role (CloudWatch, ``docker logs``).

Every line starts with ``mnp-entrypoint[<role>]:`` so the entrypoint's own lines are easy to tell
from the user's program output. ``set_role`` is called once the role is known.
"""

import contextlib
import os
import select
import sys
import threading
import time

_state = {"role": "starting"}
_lock = threading.Lock()


def set_role(role):
    """Set the prefix used by later lines, e.g. ``main 0/3`` or ``child 2/3``."""
    _state["role"] = role


def _write(stream, text):
    """Write ``text`` whatever the stream's encoding: a variable with bytes that are not UTF-8
    reaches Python as lone surrogates, which an ASCII stdout (Python 3.6 in the C locale) or a
    strict UTF-8 one cannot encode; such characters are written as backslash escapes."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        data = text.encode(encoding, "backslashreplace")
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            stream.flush()
            buffer.write(data)
        else:
            stream.write(data.decode(encoding, "replace"))
    stream.flush()


def write_err(text):
    """``text`` to stderr as is (before the role is known), whatever stderr's encoding."""
    with _lock, contextlib.suppress(OSError, ValueError):
        _write(sys.stderr, text)


def log(message):
    """Write one line (or several, each prefixed) to stderr and flush it."""
    prefix = "mnp-entrypoint[%s]: " % _state["role"]
    text = "".join(prefix + line + "\n" for line in str(message).splitlines() or [""])
    with _lock, contextlib.suppress(OSError, ValueError):  # stderr closed: nothing to do
        _write(sys.stderr, text)


def write_raw(fd, data):
    """Write the bytes ``data`` to the file descriptor ``fd`` whole, as they are (another
    process's output passed through), never between the bytes of one of ``log``'s lines. False
    when ``fd`` can no longer be written (closed, a broken pipe): the caller stops writing."""
    with _lock:
        view = memoryview(data)
        while view:
            try:
                written = os.write(fd, view)
            except InterruptedError:
                continue
            except BlockingIOError:  # a non-blocking stream that is full: wait until it drains
                select.select([], [fd], [], 1.0)
                continue
            except OSError:
                return False
            view = view[written:]
    return True


def out(message):
    """Write plain text to stdout (used for the dry-run plan) and flush it."""
    with _lock:
        _write(sys.stdout, str(message) + "\n")


def printable(value, limit=200):
    """``value`` as one printable line for a log message, at most ``limit`` characters.

    Anything a peer sent (a node index, a reason, an address) goes through this before it is
    logged: a newline or a terminal escape in it would otherwise start a line that looks like
    the entrypoint's own (a forged log line). Non-strings are shown with ``repr``."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = "%s...(%d more characters)" % (text[:limit], len(text) - limit)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


class Throttle(object):
    """At most ``limit`` log lines per ``interval`` seconds; the rest are counted and summed up.

    Used for lines a remote peer can cause at will (rejected connections, failed accepts), so a
    flood of bad packets cannot flood the log. ``flush`` (called periodically) reports how many
    lines were suppressed in the interval that ended. Monotonic clock: wall-clock jumps neither
    open the gate early nor keep it shut."""

    def __init__(self, what, limit=10, interval=10.0, clock=time.monotonic, write=None):
        self.what = what
        self.limit = limit
        self.interval = interval
        self.clock = clock
        self.write = write or log
        self.window_start = None
        self.in_window = 0
        self.suppressed = 0
        self.total = 0

    def __call__(self, message):
        """Log ``message`` unless this interval's budget is spent; True if it was logged."""
        self.total += 1
        self.flush()
        if self.window_start is None:
            self.window_start = self.clock()
        if self.in_window < self.limit:
            self.in_window += 1
            self.write(message)
            return True
        self.suppressed += 1
        return False

    def flush(self):
        """Close the interval if it is over: log the count of suppressed lines, if any."""
        if self.window_start is None or self.clock() - self.window_start < self.interval:
            return
        if self.suppressed:
            self.write("%d more %s in the last %gs not logged"
                       % (self.suppressed, self.what, self.clock() - self.window_start))
        self.window_start = None
        self.in_window = 0
        self.suppressed = 0
