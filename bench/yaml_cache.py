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
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from alternate import alternate, child_cpu

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from matrix.model.settings import user_cache  # noqa: E402
from matrix.model.yamlsrc import PARSED  # noqa: E402


def command_cpu(command: list[str], cache_home: Path) -> float:
    """CPU seconds of one run of ``command`` with ``XDG_CACHE_HOME=cache_home``."""
    environment = {name: value for name, value in os.environ.items()
                   if name != "PYTHONDONTWRITEBYTECODE"}
    environment["XDG_CACHE_HOME"] = str(cache_home)
    return child_cpu(command, cwd=ROOT, env=environment, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)[0]


def parsing_cpu(command: list[str], cache_home: Path) -> float:
    """As :func:`command_cpu`, with no parsed file in the cache."""
    shutil.rmtree(cache_home / "mnp-stacks" / PARSED, ignore_errors=True)
    return command_cpu(command, cache_home)


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
            command_cpu(command, home)  # every other entry written, bytecode and page cache warm
        cached_s, parsing_s = alternate(args.runs, lambda: command_cpu(command, cached),
                                        lambda: parsing_cpu(command, parsing))
    print(f"invoke {args.command}: {cached_s:.3f} s of CPU with the checked YAML read from the "
          f"cache, {parsing_s:.3f} s parsing it (medians of {args.runs}); ratio "
          f"{cached_s / parsing_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
