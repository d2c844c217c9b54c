"""What one command costs before it does its work: ``invoke stacks`` as the project runs it, and
the same command in a process that first imports jsonschema the plain way (rfc3987-syntax's 38
lark grammars compiled, as every command did before ``matrix.model.schema.jsonschema_library``).

The two run alternately, ``--runs`` times each, with bytecode caching on, so the machine's load
falls on both alike; the medians and their ratio are printed. The suite starts a few hundred
commands, so the difference counts there as much as at a user's prompt.

Usage: ``python bench/cli_start.py [--runs N] [--command "stacks --names"]``
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from alternate import alternate

ROOT = Path(__file__).resolve().parent.parent
# The baseline: jsonschema imported with every format module it finds, then the same command.
PLAIN_IMPORT = ("import sys, runpy, jsonschema; sys.argv = ['invoke', *sys.argv[1:]]; "
                "runpy.run_module('invoke', run_name='__main__')")


def timed(command: list[str]) -> float:
    environment = {name: value for name, value in os.environ.items()
                   if name != "PYTHONDONTWRITEBYTECODE"}
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=environment, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--command", default="stacks", help="invoke's arguments")
    args = parser.parse_args()
    task = shlex.split(args.command)
    project = [sys.executable, "-m", "invoke", *task]
    baseline = [sys.executable, "-c", PLAIN_IMPORT, *task]
    timed(project), timed(baseline)  # bytecode written, files in the page cache
    project_s, baseline_s = alternate(args.runs, lambda: timed(project), lambda: timed(baseline))
    print(f"invoke {args.command}: {project_s:.2f} s (median of {args.runs}); with jsonschema "
          f"imported the plain way first: {baseline_s:.2f} s; ratio {baseline_s / project_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
