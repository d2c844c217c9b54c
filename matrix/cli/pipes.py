"""A reader that stops early (``invoke --list | head -1``) is not an error: exit quietly.

Python ignores SIGPIPE, so a write to a pipe whose reader has gone raises BrokenPipeError, and
invoke lets it through as a traceback; at exit the interpreter's own flush of stdout fails
again. The handling the Python documentation gives (signal module, "Note on SIGPIPE",
https://docs.python.org/3/library/signal.html#note-on-sigpipe): flush stdout inside
``try/except BrokenPipeError`` and, when it breaks, point stdout at /dev/null (``os.dup2``) so
nothing is written to the pipe again, then exit with status 1.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from types import TracebackType

_installed = False


def silence_stdout() -> None:
    """Point stdout at /dev/null: the reader is gone, later writes and the exit flush go nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def flush_stdout() -> bool:
    """Flush stdout; False (and stdout silenced) when its reader has gone."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        return False
    return True


def run_quietly(main: Callable[[], None]) -> None:
    """``main()`` then a flush of stdout; a broken pipe in either exits 1 without a traceback."""
    try:
        main()
        if flush_stdout():
            return
    except BrokenPipeError:
        silence_stdout()
    sys.exit(1)


def install() -> None:
    """For ``invoke``, whose own main we do not own: a BrokenPipeError nothing caught ends the
    program without a traceback (status 1, what an uncaught exception gives), and the exit
    flush cannot raise it again."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException,
             trace: TracebackType | None) -> None:
        if issubclass(kind, BrokenPipeError):
            silence_stdout()
            return
        previous(kind, value, trace)

    sys.excepthook = hook
    atexit.register(flush_stdout)
