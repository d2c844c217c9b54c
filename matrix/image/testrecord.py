"""Which image IDs passed their tests.

``invoke test`` calls :func:`record_pass` after a stack's tests pass; ``invoke push`` asks
:func:`has_passed` before publishing. The record is keyed by the image ID (the digest of the
image's config, ``sha256:...``), so rebuilding a stack into a different image invalidates it:
only the exact image that was tested can be pushed without ``--force``.

One JSON file per image ID lives under ``state_dir`` (by default ``.mnp/test-results/`` in the
project root), named after the ID's hex digest, e.g.::

    .mnp/test-results/3f1c...e9.json   {"image_id": "sha256:3f1c...e9", "stack": "cpu-tcp", ...}
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from matrix.errors import UserError
from matrix.model.settings import ROOT

PROJECT_ROOT = ROOT
DEFAULT_STATE_DIR = PROJECT_ROOT / ".mnp" / "test-results"

_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class TestRecord:
    """One passed test run: which image, which stack, when (UTC, ISO 8601)."""

    __test__ = False  # not a pytest test class

    image_id: str
    stack: str
    passed_at: str


def _record_path(image_id: str, state_dir: Path) -> Path:
    """The file that records ``image_id``; rejects anything that is not ``sha256:<64 hex>``."""
    if not _IMAGE_ID.match(image_id):
        raise UserError(f"image ID {image_id!r} is not of the form sha256:<64 hex digits>")
    return Path(state_dir) / f"{image_id.split(':', 1)[1]}.json"


def record_pass(image_id: str, stack: str, state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """Record that the image ``image_id`` (built for ``stack``) passed its tests.

    The file is written atomically (temporary file + rename), so a concurrent reader never sees
    a half-written record.
    """
    path = _record_path(image_id, state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = TestRecord(
        image_id=image_id,
        stack=stack,
        passed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(record), handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_record(image_id: str, state_dir: Path = DEFAULT_STATE_DIR) -> TestRecord | None:
    """The record for ``image_id``, or None when there is none (or it is unreadable)."""
    path = _record_path(image_id, state_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = TestRecord(**data)
    except (OSError, ValueError, TypeError):
        return None
    return record if record.image_id == image_id else None


def has_passed(image_id: str, state_dir: Path = DEFAULT_STATE_DIR) -> bool:
    """True when the exact image ``image_id`` has a recorded test pass."""
    return read_record(image_id, state_dir) is not None
