"""What reading checked YAML from the user's cache saves a command: ``invoke stacks`` with the
cache as a second run finds it (stacks.yaml, rules.yaml and the instance table parsed, as JSON,
in ``parsed-yaml``), against the same command with that folder emptied before each run, so it
composes the three files in Python as every command did before ``matrix.model.yamlsrc.PARSED``.

Both runs get a copy of the user's cache with every other entry (schema passes, compiled
templates), so the only difference is the parsed files. They run alternately, ``--runs`` times
each, with bytecode caching on; the CPU time of each child (user + system) is measured, and the
medians and their ratio are printed.

Usage: ``python bench/yaml_cache.py [--runs N] [--command "plan --json"]``
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from matrix.model.settings import user_cache  # noqa: E402
from matrix.model.yamlsrc import PARSED  # noqa: E402


def child_cpu(command: list[str], cache_home: Path) -> float:
    """User + system CPU seconds of one run of ``command`` with ``XDG_CACHE_HOME=cache_home``."""
    environment = {name: value for name, value in os.environ.items()
                   if name != "PYTHONDONTWRITEBYTECODE"}
    environment["XDG_CACHE_HOME"] = str(cache_home)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, cwd=ROOT, env=environment, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--command", default="stacks", help="invoke's arguments")
    args = parser.parse_args()
    command = [sys.executable, "-m", "invoke", *shlex.split(args.command)]
    with tempfile.TemporaryDirectory(prefix="bench-yaml-cache-") as tmp:
        cached, parsing = Path(tmp) / "cached", Path(tmp) / "parsing"
        for home in (cached, parsing):
            if user_cache("").is_dir():
                shutil.copytree(user_cache(""), home / "mnp-stacks")
            child_cpu(command, home)  # every other entry written, bytecode and page cache warm
        times: dict[str, list[float]] = {"cached": [], "parsing": []}
        for _ in range(args.runs):
            times["cached"].append(child_cpu(command, cached))
            shutil.rmtree(parsing / "mnp-stacks" / PARSED, ignore_errors=True)
            times["parsing"].append(child_cpu(command, parsing))
    cached_s, parsing_s = (statistics.median(times[k]) for k in ("cached", "parsing"))
    print(f"invoke {args.command}: {cached_s:.3f} s of CPU with the checked YAML read from the "
          f"cache, {parsing_s:.3f} s parsing it (medians of {args.runs}); ratio "
          f"{cached_s / parsing_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
