"""The start-up health gate's cost: seconds it adds before the first rank starts, on 3 local nodes.

Each round is an ``invoke run``-style rehearsal (``matrix.jobs.rehearse``: 3 containers of a
built stack on one Docker bridge, Batch's variables, the real entrypoint) of a command that does
nothing (``true`` under mpirun). The clock is the main node's output as it streams: from the
rehearsal's start to the main node's ``running: mpirun ...`` line, i.e. every node probed,
checked, registered, and the launcher starting. Rounds run with ``MNP_HEALTH=off``, ``basic`` and
``full``, interleaved so the machine's load drifts over all three alike; the gate's cost is each
mode's median minus ``off``'s.

Run: ``python bench/health_gate.py [--image mnp-stacks:cpu-tcp] [--rounds 3]
[--mount-entrypoint]`` (``--mount-entrypoint`` runs this checkout's ``entrypoint/`` in the image).
Needs a Docker engine and the stack image built (``invoke build --stack cpu-tcp``).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from matrix.jobs.mounts import Mount  # noqa: E402
from matrix.jobs.rehearse import rehearse  # noqa: E402

MODES = ("off", "basic", "full")
NODES = 3


def one_round(client, image, mode, mounts):
    """Seconds from the rehearsal's start to the main node starting its launcher."""
    seen = {}
    start = time.monotonic()

    def log(line):
        if "]: running: " in line and "launcher" not in seen:
            seen["launcher"] = time.monotonic() - start

    with tempfile.TemporaryDirectory(prefix="mnp-bench-gate-") as logs:
        code = rehearse(client, image, NODES, ["true"], None, {"MNP_HEALTH": mode}, log,
                        log_dir=Path(logs), stop_timeout_s=2, mounts=mounts, timeout_s=300)
    if code != 0 or "launcher" not in seen:
        raise SystemExit(f"MNP_HEALTH={mode}: the job failed (exit {code}); see its logs")
    return seen["launcher"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="mnp-stacks:cpu-tcp")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mount-entrypoint", action="store_true")
    args = parser.parse_args()
    client = docker.from_env()
    mounts = [Mount(str(ROOT / "entrypoint"), "/opt/mnp/lib/entrypoint", True)] \
        if args.mount_entrypoint else []
    times = {mode: [] for mode in MODES}
    for number in range(args.rounds):
        for mode in MODES:
            seconds = one_round(client, args.image, mode, mounts)
            times[mode].append(seconds)
            print(f"round {number + 1} MNP_HEALTH={mode}: launcher after {seconds:.2f} s",
                  flush=True)
    base = statistics.median(times["off"])
    print(f"\n{NODES} nodes, median of {args.rounds} rounds, {os.cpu_count()} CPUs:")
    print("| MNP_HEALTH | rehearsal start → launcher | added by the gate |")
    print("|---|---:|---:|")
    for mode in MODES:
        median = statistics.median(times[mode])
        print(f"| {mode} | {median:.2f} s | {median - base:+.2f} s |")


if __name__ == "__main__":
    main()
