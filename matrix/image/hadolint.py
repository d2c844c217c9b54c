"""hadolint over the rendered Dockerfiles, each exact file linted once.

A file whose text passed before, with the same hadolint binary and the same configuration, is
not linted again: the pass is remembered in the user's cache (``user_cache("lint-passes")``,
one empty file per digest of the three). hadolint took about 6 s of CPU for the 100 rendered
files on the 2-core machine, and ``invoke lint`` runs after every render; a run after an edit
lints only what changed. A failing run remembers nothing, so its files are all linted again.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from matrix.errors import UserError
from matrix.model.settings import passed_before, remember_pass

PASSES = "lint-passes"  # the user_cache folder


def binary() -> str:
    """The dev extra's hadolint beside this Python, else the one on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else "hadolint"


def _identity(program: str, config: Path) -> bytes | None:
    """What a verdict depends on besides the file: the binary (its path, size and modification
    time: a reinstall is a new one) and the configuration's text; None for a binary found on
    PATH only when it runs (nothing to remember it by)."""
    try:
        stat = Path(program).stat()
    except OSError:
        return None
    return f"{Path(program).resolve()}:{stat.st_size}:{stat.st_mtime_ns}\0".encode() \
        + config.read_bytes()


def check(files: list[Path], config: Path) -> None:
    """Lint ``files``; one :class:`UserError` when hadolint finds a problem (its findings are
    printed first) or is missing."""
    program = binary()
    identity = _identity(program, config)
    digests = {path: hashlib.sha256(identity + b"\0" + path.read_bytes()).hexdigest()
               if identity else None for path in files}
    todo = [path for path, digest in digests.items()
            if digest is None or not passed_before(PASSES, digest)]
    if not todo:
        return
    command = [program, "--no-color", "-c", str(config), *map(str, todo)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise UserError("hadolint not found; install the dev extra: pip install -e '.[dev]'") from None
    if proc.returncode:
        sys.stdout.write(proc.stdout)  # findings only matter when they fail the check
        raise UserError(f"hadolint found problems in the rendered Dockerfiles (exit {proc.returncode})")
    for path in todo:
        if digests[path]:
            remember_pass(PASSES, digests[path])
