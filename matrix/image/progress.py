"""Per-layer progress for builds that may run several layers at once.

On a terminal one live status shows a line per layer being built (its step); in CI logs (no
terminal) every line names its layer, so interleaved layers stay readable. Each layer's full
build output goes to its own log under ``.mnp/logs/`` either way. Safe to call from the
scheduler's worker threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from matrix.image.plan import Layer


@dataclass
class LayerResult:
    layer: Layer
    status: str  # built, cached, pulled, failed, skipped
    seconds: float = 0.0
    size: int = 0
    added: int = 0
    image_id: str = ""
    log: Path | None = None
    why: str = ""  # for skipped: what stopped it


class Reporter:
    """Per-layer status lines; a live status on a terminal, plain named lines in CI logs."""

    def __init__(self, console: Console, layers: list[Layer]) -> None:
        self.console = console
        self.live = console.is_terminal
        self.total = len(layers)
        self.index = {layer.ref: i for i, layer in enumerate(layers, start=1)}
        self._active: dict[str, str] = {}  # ref -> its current line
        self._status: Any = None
        self._lock = threading.RLock()

    def prefix(self, layer: Layer) -> str:
        return f"[{self.index[layer.ref]}/{self.total}] {layer.name}"

    def say(self, text: str) -> None:
        with self._lock:
            self.console.print(text, markup=False, highlight=False)

    def start(self, layer: Layer) -> None:
        with self._lock:
            if self.live:
                self._active[layer.ref] = f"{self.prefix(layer)}: starting"
                self._refresh()
            else:
                self.say(f"{self.prefix(layer)}: building {layer.tag}")

    def step(self, layer: Layer, step: int, steps: int, text: str) -> None:
        with self._lock:
            if self.live:
                self._active[layer.ref] = f"{self.prefix(layer)}: step {step}/{steps} {text[:90]}"
                self._refresh()
            else:
                self.say(f"  [{layer.name}] step {step}/{steps} {text[:110]}")

    def _refresh(self) -> None:
        text = "\n".join(self._active.values())
        if not text:
            self.stop()
        elif self._status is None:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def stop(self) -> None:
        with self._lock:
            if self._status is not None:
                self._status.stop()
                self._status = None

    def done(self, result: LayerResult) -> None:
        with self._lock:
            if self._active.pop(result.layer.ref, None) is not None:
                self._refresh()
            detail = {"cached": "cached (tag exists)", "pulled": "pulled from registry",
                      "built": f"done in {result.seconds:.0f} s",
                      "failed": f"FAILED after {result.seconds:.0f} s",
                      "skipped": f"skipped ({result.why or 'a parent failed'})"}[result.status]
            size = f", {mb(result.size)} MB (+{mb(result.added)})" if result.size else ""
            self.say(f"{self.prefix(result.layer)}: {detail}{size}")


def mb(size: int) -> int:
    return round(size / 1_000_000)
