"""One-line log messages on stderr, prefixed with this node's role (CloudWatch, ``docker logs``).

Every line starts with ``mnp-entrypoint[<role>]:`` so the entrypoint's own lines are easy to tell
from the user's program output. ``set_role`` is called once the role is known.
"""

import sys
import threading

_state = {"role": "starting"}
_lock = threading.Lock()


def set_role(role):
    """Set the prefix used by later lines, e.g. ``main 0/3`` or ``child 2/3``."""
    _state["role"] = role


def log(message):
    """Write one line (or several, each prefixed) to stderr and flush it."""
    prefix = "mnp-entrypoint[%s]: " % _state["role"]
    text = "".join(prefix + line + "\n" for line in str(message).splitlines() or [""])
    with _lock:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: nothing more we can do
            pass


def out(message):
    """Write plain text to stdout (used for the dry-run plan) and flush it."""
    with _lock:
        sys.stdout.write(str(message) + "\n")
        sys.stdout.flush()
