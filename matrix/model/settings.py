"""Where the project's files are, the user's cache folder, and the one setting every download
reads from the environment.

Every room reads these: the model finds each component's options schema under ``images/``, the
image room renders and builds from it, and both ``invoke pin`` and the build trust the CA bundle
named by ``PIP_CERT``, ``REQUESTS_CA_BUNDLE`` or ``SSL_CERT_FILE`` (pip's and requests' own
variables, in the order pip reads them).
"""

from __future__ import annotations

import os
from pathlib import Path

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
