"""Where the project's files are, the user's cache folder, and the one setting every download
reads from the environment.

Every room reads these: the model finds each component's options schema under ``images/``, the
image room renders and builds from it, and both ``invoke pin`` and the build trust the CA bundle
named by ``PIP_CERT``, ``REQUESTS_CA_BUNDLE`` or ``SSL_CERT_FILE`` (pip's and requests' own
variables, in the order pip reads them).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
IMAGES = ROOT / "images"
GENERATED = IMAGES / "generated"



def user_cache(name: str) -> Path:
    """``$XDG_CACHE_HOME/mnp-stacks/<name>`` (``~/.cache`` without it): what one run learns and
    the next can reuse (layer-test passes, schema passes, compiled templates), kept out of the
    checkout so that every clone shares it. Read at each call, so a changed environment counts."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mnp-stacks" / name


def passed_before(folder: str, digest: str) -> bool:
    """Whether a check keyed by ``digest`` passed before (an empty file in ``user_cache(folder)``)."""
    return (user_cache(folder) / digest).is_file()


def remember_pass(folder: str, digest: str) -> None:
    """Record a pass; a cache that cannot be written (read-only home, disk full) only means the
    next command checks again."""
    try:
        (user_cache(folder)).mkdir(parents=True, exist_ok=True)
        (user_cache(folder) / digest).touch()
    except OSError:
        pass


CA_ENV_VARS = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")


def default_ca_bundle() -> Path | None:
    """The CA bundle named by PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE, if any."""
    for var in CA_ENV_VARS:
        value = os.environ.get(var)
        if value:
            return Path(value)
    return None


def cached_json(folder: str, name: str) -> Any:
    """The JSON value :func:`remember_text` wrote under ``name`` in ``user_cache(folder)``;
    None when there is none or it cannot be read or parsed (the caller computes it again)."""
    try:
        return json.loads((user_cache(folder) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a temporary file beside it, renamed into
    place, so a concurrent reader never sees half of it; the folder is made when missing. Raises
    :class:`OSError` (each caller says what an unwritable place means for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def remember_text(folder: str, name: str, text: str) -> None:
    """Keep ``text`` as ``user_cache(folder)/name`` (:func:`write_atomically`). A cache that
    cannot be written (read-only home, disk full) is skipped: the next command computes it
    again."""
    with contextlib.suppress(OSError):
        write_atomically(user_cache(folder) / name, text)
