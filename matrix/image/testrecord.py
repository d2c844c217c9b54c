"""The latest test run of each image ID: started, passed or failed.

``invoke test`` records a run as ``started`` before its first layer test, then ``passed`` or
``failed`` when it ends; ``invoke push`` asks :func:`has_passed` before publishing. The record is
keyed by the image ID (the digest of the image's config, ``sha256:...``), so rebuilding a stack
into a different image invalidates it, and it keeps only the *latest* run: a failed (or
interrupted) run withdraws an earlier pass of the same image, so the gate follows the latest
result, never the best one.

One JSON file per image ID lives under ``state_dir`` (by default ``.mnp/test-results/`` in the
project root), named after the ID's hex digest, e.g.::

    .mnp/test-results/3f1c...e9.json
    {"image_id": "sha256:3f1c...e9", "stack": "cpu-tcp", "result": "failed", "at": "..."}

It also keeps each layer's *passing* test runs, keyed by a digest of everything the run depends
on (:func:`layer_key`: the layer image's ID, what the tests are told about the layer, the test
files, the code they import, the versions of the tools and the engine that run them), as
``go test`` caches a passing package: the same inputs give the same result, so ``invoke test``
reports such a layer from its record instead of running it again (``--again`` runs it anyway). A
failure is never kept, so a failing layer always runs again. Like Go's build cache, these live in
the user's cache folder (``LAYER_CACHE_DIR``: ``$XDG_CACHE_HOME/mnp-stacks/layer-passes``,
``~/.cache`` without it), not in a checkout: an image's layer tests that passed in one clone need
not run again in the next clone on the same machine when none of their inputs changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from matrix.errors import UserError
from matrix.model.settings import ROOT, user_cache, write_atomically

PROJECT_ROOT = ROOT
DEFAULT_STATE_DIR = PROJECT_ROOT / ".mnp" / "test-results"

_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


RESULTS = ("started", "passed", "failed")


@dataclass(frozen=True)
class TestRecord:
    """The latest test run of one image: which stack, its result, when (UTC, ISO 8601)."""

    __test__ = False  # not a pytest test class

    image_id: str
    stack: str
    result: str
    at: str

    @property
    def passed(self) -> bool:
        return self.result == "passed"


def _record_path(image_id: str, state_dir: Path) -> Path:
    """The file that records ``image_id``; rejects anything that is not ``sha256:<64 hex>``."""
    if not _IMAGE_ID.match(image_id):
        raise UserError(f"image ID {image_id!r} is not of the form sha256:<64 hex digits>")
    return Path(state_dir) / f"{image_id.split(':', 1)[1]}.json"


def record_run(image_id: str, stack: str, result: str,
               state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """Record that the latest test run of ``image_id`` (built for ``stack``) is ``result``.

    The file is written atomically (temporary file + rename), so a concurrent reader never sees
    a half-written record. A state folder that cannot be written (a file in its place, no
    permission) is one :class:`UserError` naming it.
    """
    if result not in RESULTS:
        raise ValueError(f"test result {result!r} is not one of {RESULTS}")
    record = TestRecord(image_id=image_id, stack=stack, result=result, at=_now())
    _write(_record_path(image_id, state_dir), asdict(record), state_dir)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write(path: Path, data: dict, state_dir: Path) -> None:
    """Write ``data`` as JSON whole or not at all (``write_atomically``), so a concurrent reader
    never sees a half-written record; a state folder that cannot be written is one UserError."""
    try:
        write_atomically(path, json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise UserError(f"cannot write test records to {state_dir}: {exc.strerror or exc} "
                        "(it must be a folder; move away what is there)") from None


def record_start(image_id: str, stack: str, state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """A test run of ``image_id`` begins: any earlier pass no longer counts."""
    record_run(image_id, stack, "started", state_dir)


def record_pass(image_id: str, stack: str, state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """The latest test run of ``image_id`` passed."""
    record_run(image_id, stack, "passed", state_dir)


def record_failure(image_id: str, stack: str, state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """The latest test run of ``image_id`` failed: the image may not be pushed."""
    record_run(image_id, stack, "failed", state_dir)


def read_record(image_id: str, state_dir: Path = DEFAULT_STATE_DIR) -> TestRecord | None:
    """The latest run of ``image_id``, or None when there is none (or it is unreadable).

    A record written before runs were kept (``passed_at``, no ``result``) reads as a pass.
    """
    path = _record_path(image_id, state_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if "passed_at" in data and "result" not in data:
            at = data.pop("passed_at")
            data.update(result="passed", at=at)
        record = TestRecord(**data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if record.image_id != image_id or record.result not in RESULTS:
        return None
    return record


def has_passed(image_id: str, state_dir: Path = DEFAULT_STATE_DIR) -> bool:
    """True when the latest recorded test run of the exact image ``image_id`` passed."""
    record = read_record(image_id, state_dir)
    return record is not None and record.passed


# --- layer passes ---------------------------------------------------------------------------------

LAYER_CACHE_DIR = user_cache("layer-passes")


@dataclass(frozen=True)
class LayerPass:
    """A passing run of one layer's tests: its counts and when it ran."""

    layer: str
    passed: int
    skipped: int
    seconds: float
    at: str


def layer_key(image_id: str, description: dict, files: Iterable[Path], tools: dict) -> str:
    """The digest of everything a layer's test run depends on: the image ID of the layer's own
    image, the description its tests are given, the bytes of ``files`` (its test files, their
    conftest, the project code they import) and ``tools`` (the versions that run them)."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"image": image_id, "layer": description, "tools": tools},
                             sort_keys=True).encode())
    for path in sorted(files):
        digest.update(f"\0{path.name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def record_layer_pass(key: str, result: LayerPass, cache_dir: Path = LAYER_CACHE_DIR) -> None:
    _write(Path(cache_dir) / f"{key}.json", asdict(result), cache_dir)


def read_layer_pass(key: str, cache_dir: Path = LAYER_CACHE_DIR) -> LayerPass | None:
    """The recorded pass for ``key``, or None (none, or unreadable: the layer then runs)."""
    try:
        data = json.loads((Path(cache_dir) / f"{key}.json").read_text(encoding="utf-8"))
        return LayerPass(**data)
    except (OSError, ValueError, TypeError):
        return None


def layer_pass_now(layer: str, passed: int, skipped: int, seconds: float) -> LayerPass:
    return LayerPass(layer=layer, passed=passed, skipped=skipped, seconds=round(seconds, 1),
                     at=_now())
