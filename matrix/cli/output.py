"""``--output FILE`` of the writers' tasks (each names its file: ``Writer.file_name``): checked
before anything is built, then written whole or not at all.

Only a new file or an existing regular file is written: a device node, a FIFO, a socket, a
folder or a symlink at the path is refused (renaming over it would replace the node or the link
itself, not write through it). A new file gets the mode the user's umask gives (0666 & ~umask,
as ``open(..., "w")`` would: none of these files holds a secret, a job definition names its
secret by ARN only); a replaced regular file keeps its own mode.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from matrix.errors import UsageError, UserError

_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


def _not_a_file(mode: int) -> str:
    """What a path that exists but is no regular file is ('' for a regular file)."""
    if stat.S_ISREG(mode):
        return ""
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def output_path(output: str, example: str) -> Path:
    """``--output`` as a file whose folder exists and that is new or a regular file (checked
    before anything is built); ``example`` is the file name a folder is answered with."""
    path = Path(output)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot look at it: {exc.strerror}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"--output {output}: a folder; give a file name, e.g. --output "
                         f"{path / example}")
    if mode is not None and _not_a_file(mode):
        raise UsageError(f"--output {output}: exists and is {_not_a_file(mode)}, not a regular "
                         "file; give a new file name (nothing is written through or over it)")
    if not path.parent.is_dir():
        raise UsageError(f"--output {output}: no folder {path.parent}; create it first or "
                         "write somewhere else")
    return path


def _new_file_mode(path: Path) -> int:
    """A replaced regular file's own permissions, else what the umask leaves of 0666."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_whole(path: Path, text: str, option: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``: a
    reader never sees half a file, and a failed write leaves the old one."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"--output {option}: cannot write in {path.parent}: "
                        f"{exc.strerror}") from None
    try:
        os.fchmod(fd, _new_file_mode(path))
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        output_path(str(path), path.name)  # nothing odd appeared there while we built
        os.replace(tmp, path)
    except (OSError, UsageError) as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, UsageError):
            raise
        raise UserError(f"--output {option}: cannot write it: {exc.strerror}") from None
