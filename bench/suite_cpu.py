"""Where the suite's CPU goes: seconds of CPU per xdist group, per container, and the machine's.

On the 2-core machine ``invoke check`` is CPU-bound (a few per cent idle), so its wall time
follows the CPU its tests use, wherever it is spent, more than any one group's wall time. This
runs pytest (``invoke check``'s arguments unless others follow ``--``) with itself loaded as a
plugin, and reports:

- per group, the CPU of the xdist worker while it ran the group's tests, and of every process
  the worker started and waited for (``os.times()``: invoke commands, inner pytest runs, docker
  CLI calls);
- per container, the CPU its cgroup used (``cpuacct.usage`` under the engine's cgroup parent,
  sampled each second), summed by name with the random suffix dropped;
- the machine's CPU over the run (``/proc/stat``) and the Docker engine's own (``dockerd``):
  what neither of the above counts (the engine, containerd, image builds' short-lived steps,
  the kernel) is the difference.

Usage: ``python bench/suite_cpu.py [--top N] [-- PYTEST ARGS]``, as root on the machine whose
engine runs the containers (the cgroup files are read directly).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import group_of  # noqa: E402 - the suite's own grouping

CGROUP = Path("/sys/fs/cgroup/cpuacct/docker")  # cgroup v1, dockerd's default cgroup parent
RECORDS = "SUITE_CPU_RECORDS"  # the folder the plugin writes to (set by main)
SUFFIX = re.compile(r"([-_][0-9a-f]{6,}.*|-\d+)$")


# --- the plugin, in each xdist worker ---------------------------------------------------------

def pytest_configure(config) -> None:
    config._suite_cpu = os.environ.get(RECORDS) if hasattr(config, "workerinput") else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001 - pytest's signature
    folder = item.config._suite_cpu
    before = os.times()
    yield
    if folder:
        after = os.times()
        group = group_of(item)
        used = {"self": after.user + after.system - before.user - before.system,
                "children": (after.children_user + after.children_system
                             - before.children_user - before.children_system)}
        with open(Path(folder) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"group": group, "test": item.nodeid, **used}) + "\n")


# --- the report, in the process that runs pytest ----------------------------------------------

class ContainerSampler(threading.Thread):
    """Each second, every container's cgroup CPU; a container's last reading counts once it
    has gone."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.names: dict[str, str] = {}
        self.last: dict[str, int] = {}
        self.done: dict[str, float] = defaultdict(float)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.sample()
        self.sample()
        for cid in list(self.last):
            self._finish(cid)

    def sample(self) -> None:
        ids = [p.name for p in CGROUP.glob("*") if len(p.name) == 64] if CGROUP.is_dir() else []
        unknown = [cid for cid in ids if cid not in self.names]
        if unknown:
            proc = subprocess.run(["docker", "inspect", "--format", "{{.Id}} {{.Name}}", *unknown],
                                  capture_output=True, text=True, check=False)
            for line in proc.stdout.splitlines():
                cid, _, name = line.partition(" ")
                if name:  # a container gone since the listing has no line (or a blank one)
                    self.names[cid] = SUFFIX.sub("", name.lstrip("/"))
        for cid in ids:
            with contextlib.suppress(OSError, ValueError):
                self.last[cid] = int((CGROUP / cid / "cpuacct.usage").read_text())
        for cid in [c for c in self.last if c not in ids]:
            self._finish(cid)

    def _finish(self, cid: str) -> None:
        self.done[self.names.get(cid, "(unnamed)")] += self.last.pop(cid) / 1e9


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / ticks, idle / ticks


def dockerd_cpu() -> float:
    proc = subprocess.run(["pgrep", "-xo", "dockerd"], capture_output=True, text=True, check=False)
    if not proc.stdout.strip():
        return 0.0
    fields = Path(f"/proc/{proc.stdout.split()[0]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def totals_by(folder: Path, key: str) -> dict[str, list[float]]:
    """Each ``key`` (a group or a test): [worker CPU, its children's CPU, tests]."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for path in folder.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            row = totals[record[key]]
            row[0] += record["self"]
            row[1] += record["children"]
            row[2] += 1
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args(argv)
    from matrix.cli import suite

    pytest_args = args.pytest_args or suite.suite_args(suite.workers())
    with tempfile.TemporaryDirectory(prefix="mnp-suite-cpu-") as folder:
        env = dict(os.environ, **{RECORDS: folder},
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "bench"),
                                                            os.environ.get("PYTHONPATH")])))
        suite.prepare_environment(env)
        sampler = ContainerSampler()
        busy0, idle0 = machine_cpu()
        dockerd0, started = dockerd_cpu(), time.monotonic()
        sampler.start()
        code = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu", *pytest_args],
                              cwd=ROOT, env=env, check=False).returncode
        sampler.stop.set()
        sampler.join()
        wall = time.monotonic() - started
        busy, idle = (a - b for a, b in zip(machine_cpu(), (busy0, idle0)))
        tests = totals_by(Path(folder), "group")
        single = totals_by(Path(folder), "test")
    print(f"\nwall {wall:.0f} s; machine CPU busy {busy:.0f} s, idle {idle:.0f} s; "
          f"dockerd {dockerd_cpu() - dockerd0:.0f} s; tests' processes "
          f"{sum(r[0] + r[1] for r in tests.values()):.0f} s; containers "
          f"{sum(sampler.done.values()):.0f} s")
    print(f"per group (CPU of the worker and its children; top {args.top}):")
    for name, (own, children, count) in sorted(tests.items(),
                                               key=lambda kv: -(kv[1][0] + kv[1][1]))[:args.top]:
        print(f"  {own + children:7.1f} s  (worker {own:6.1f}, children {children:6.1f})  "
              f"{count:4d} tests  {name}")
    print(f"per test (top {args.top}):")
    for name, (own, children, _) in sorted(single.items(),
                                           key=lambda kv: -(kv[1][0] + kv[1][1]))[:args.top]:
        print(f"  {own + children:7.1f} s  (worker {own:6.1f}, children {children:6.1f})  {name}")
    print(f"per container name (top {args.top}):")
    for name, seconds in sorted(sampler.done.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {seconds:7.1f} s  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main())
