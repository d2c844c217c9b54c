"""Build a plan's layers in parallel: a layer starts as soon as its parent is done.

Stacks share a base and their first layers, then branch (cpu-mpi, cpu-tcp's PyTorch branch,
cuda13.2-tcp's CUDA branch). Built one after another, a branch's downloads wait for another
branch's compiles; here up to ``jobs`` layers build side by side, each on a worker thread that
streams its own build. After a layer fails, no new layer starts: the running ones finish, the
rest are skipped, and the caller ends the run with one line naming the failed layer and its log.

Workers are daemon threads, so Ctrl-C ends the process at once; the engine cancels a build
whose client went away (the classic builder stops when its connection closes), and the build
lock (:mod:`matrix.image.lock`) is released by the kernel with the process.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

from matrix.image.plan import Layer
from matrix.image.progress import LayerResult

# Layers build mostly on the network and on one or two cores (pip, apt, a make); more than four
# at once rarely helps (the plan's widest point is a few branches) and crowds the disk.
MAX_DEFAULT_JOBS = 4


def default_jobs() -> int:
    """Layers to build at once by default: the machine's cores, at least 2, at most 4."""
    return max(2, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))


Work = Callable[[Layer, "LayerResult | None"], LayerResult]


def run(layers: list[Layer], work: Work, jobs: int,
        on_done: Callable[[LayerResult], None]) -> dict[str, LayerResult]:
    """Run ``work`` for every layer, parents first, up to ``jobs`` at once; results by ref.

    ``work(layer, parent_result)`` builds one layer (``parent_result`` is None for a layer on the
    base). An exception from ``work`` stops new starts like a failure and is re-raised once the
    running layers are done.
    """
    jobs = max(1, jobs)
    refs = {layer.ref for layer in layers}
    results: dict[str, LayerResult] = {}
    finished: queue.Queue[tuple[Layer, LayerResult | None, BaseException | None]] = queue.Queue()
    waiting = list(layers)
    running = 0
    stopped = ""
    error: BaseException | None = None

    def worker(layer: Layer, parent: LayerResult | None) -> None:
        try:
            finished.put((layer, work(layer, parent), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, re-raised there
            finished.put((layer, None, exc))

    while waiting or running:
        for layer in list(waiting):
            if stopped or running >= jobs:
                break
            parent = results.get(layer.parent) if layer.parent in refs else None
            if layer.parent in refs and parent is None:
                continue  # its parent is not done yet
            waiting.remove(layer)
            if parent is not None and parent.status in ("failed", "skipped"):
                _skip(results, on_done, layer, "a parent failed")
                continue
            running += 1
            threading.Thread(target=worker, args=(layer, parent), daemon=True,
                             name=f"build {layer.name}").start()
        if stopped and not running:
            for layer in waiting:
                failed_parent = layer.parent in results and results[layer.parent].status in (
                    "failed", "skipped")
                _skip(results, on_done, layer, "a parent failed" if failed_parent else stopped)
            waiting.clear()
            break
        if not running:
            continue  # only skips happened; look at the waiting layers again
        layer, result, exc = _next(finished)
        running -= 1
        if exc is not None:
            error = error or exc
            stopped = stopped or f"stopped: {layer.name} did not finish"
            continue
        assert result is not None
        results[layer.ref] = result
        on_done(result)
        if result.status == "failed" and not stopped:
            stopped = f"stopped after {layer.name} failed"
    if error is not None:
        raise error
    return results


def _next(finished: queue.Queue) -> tuple:
    # A timeout keeps the main thread responsive to Ctrl-C while workers stream builds.
    while True:
        try:
            return finished.get(timeout=0.5)
        except queue.Empty:
            continue


def _skip(results: dict[str, LayerResult], on_done: Callable[[LayerResult], None],
          layer: Layer, why: str) -> None:
    result = LayerResult(layer, "skipped", why=why)
    results[layer.ref] = result
    on_done(result)
