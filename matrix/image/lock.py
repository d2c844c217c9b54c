"""Locks that keep concurrent builds of the same layers on one engine from crossing each other.

Two builds of the same stack on one engine (two CI jobs, two terminals) used to both build a
layer and both tag it; a child could then be built on the image the tag named before the other
build re-pointed it, so the parent's tag no longer named the image its children were built on.

Chosen: a lock per layer per engine, not build-then-tag. Layer builds are not reproducible (a RUN
that installs packages writes timestamps), so two builds of one layer never give an identical
result that a build-then-tag scheme could reuse: the loser would discard minutes of work. With a
lock, the second build waits for the first and then finds the layer under its tag (and trusted,
:func:`matrix.image.build._trusted`), so each layer is built once. Locking per layer rather than
the whole engine lets builds of unrelated stacks (or branches) on one engine run side by side.

A layer is built holding its own lock exclusively and its parent's lock shared, so the parent's
tag cannot be re-pointed (a rebuild takes the exclusive lock) while a child builds FROM it. Locks
are always taken ancestor first, so they cannot deadlock. They are ``flock`` locks on files under
``$MNP_LOCK_DIR`` (default: the system temporary folder), in a folder named after the engine's ID:
they order processes on one machine (the usual case of a local socket). Builds reaching one
remote engine from several machines are not ordered by them; give those machines one builder.
The kernel drops a lock when its process dies, so a killed build never leaves one behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import docker

from matrix.errors import UserError
from matrix.image import engine


def root() -> Path:
    return Path(os.environ.get("MNP_LOCK_DIR") or tempfile.gettempdir()) / "mnp-stacks-locks"


def engine_key(client: docker.DockerClient) -> str:
    """The engine's own ID (stable across restarts, distinct per engine), safe as a file name.

    An engine that does not answer ``/info`` is keyed by its address instead; the build's next
    call to it then fails with its own one-line message.
    """
    try:
        key = str(client.info().get("ID") or "")
    except engine.ENGINE_FAULTS:
        key = ""
    key = key or "addr-" + hashlib.sha256(engine.where(client).encode()).hexdigest()[:16]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", key)


def _file(folder: Path, ref: str) -> Path:
    return folder / f"{hashlib.sha256(ref.encode()).hexdigest()[:32]}.lock"


@contextlib.contextmanager
def _flock(path: Path, mode: int, on_wait: Callable[[], None] | None) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def layer(engine: str, ref: str, parent: str | None,
          on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold ``ref``'s lock exclusively (and ``parent``'s shared) on the engine keyed ``engine``."""
    folder = root() / engine
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # shared by every user of the machine's engine
            folder.parent.chmod(0o1777)
            folder.chmod(0o1777)
    except OSError as exc:
        raise UserError(f"cannot create the build lock folder {folder}: {exc.strerror or exc} "
                        "(set MNP_LOCK_DIR to a writable folder)") from None
    with contextlib.ExitStack() as stack:
        if parent:
            stack.enter_context(_flock(_file(folder, parent), fcntl.LOCK_SH, on_wait))
        stack.enter_context(_flock(_file(folder, ref), fcntl.LOCK_EX, on_wait))
        yield
