"""What the benches that compare the project's way with a baseline share: the CPU of one child
process, and two measurements taken in turn, so that the machine's load falls on both alike."""

from __future__ import annotations

import resource
import statistics
import subprocess
from collections.abc import Callable
from typing import Any


def child_cpu(command: list[str], **run: Any) -> tuple[float, subprocess.CompletedProcess]:
    """User + system CPU seconds of ``subprocess.run(command, **run)``, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(command, check=True, **run)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def alternate(runs: int, first: Callable[[], float], second: Callable[[], float]
              ) -> tuple[float, float]:
    """The medians of ``runs`` calls of each, called first, second, first, second ..."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        times[0].append(first())
        times[1].append(second())
    return statistics.median(times[0]), statistics.median(times[1])
