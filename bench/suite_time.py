"""Where the suite's time goes: seconds per test file and per xdist group, slowest first.

``invoke check`` writes pytest's junit report to ``.mnp/check/junit.xml`` and its output to
``.mnp/check/pytest.log`` (matrix/cli/suite.py). This reads them and prints, for each test file
and each xdist group (a test's file unless it is marked with another ``xdist_group``), the
summed time of its tests (setup, call and teardown, as the junit report counts them) and how
many there are, then the run's wall time from pytest's closing line. A group runs in one worker
from start to end, so the longest group is the shortest the run can take with enough workers;
the summed time over the workers is what they share.

Usage: ``python bench/suite_time.py [--junit FILE] [--log FILE] [--top N]``
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / ".mnp" / "check"
WALL = re.compile(r" in ([\d.]+)s(?: \(\d+:\d\d:\d\d\))?(?: =+)?$")


@dataclass
class Case:
    file: str
    group: str
    seconds: float


def file_of(classname: str) -> str:
    """``tests.sub.test_x.TestClass`` -> ``tests/sub/test_x.py`` (the longest prefix on disk)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (ROOT / candidate).exists():
            return candidate
    return "/".join(parts) + ".py"


def cases(junit: Path) -> list[Case]:
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = file_of(case.get("classname", ""))
        name = case.get("name", "")
        head, at, group = name.rpartition("@")  # --dist loadgroup appends "@<group>"
        group = group if at and "]" not in group else path
        found.append(Case(path, group, float(case.get("time") or 0)))
    return found


def table(title: str, totals: dict[str, list[float]], top: int) -> list[str]:
    rows = sorted(totals.items(), key=lambda item: -sum(item[1]))
    lines = [f"{title} (slowest {min(top, len(rows))} of {len(rows)}):",
             f"  {'seconds':>8}  {'tests':>5}  name"]
    lines += [f"  {sum(times):8.1f}  {len(times):5d}  {name}" for name, times in rows[:top]]
    return lines


def report(junit: Path, log: Path | None, top: int) -> str:
    found = cases(junit)
    by_file: dict[str, list[float]] = defaultdict(list)
    by_group: dict[str, list[float]] = defaultdict(list)
    for case in found:
        by_file[case.file].append(case.seconds)
        by_group[case.group].append(case.seconds)
    lines = table("per file", by_file, top) + [""] + table("per xdist group", by_group, top)
    total = sum(case.seconds for case in found)
    lines += ["", f"{len(found)} tests, {total:.0f} s summed over the workers"]
    if log is not None and log.exists():
        text = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        closing = next((line for line in reversed(text) if WALL.search(line)), "")
        match = WALL.search(closing)
        if match:
            lines.append(f"pytest's wall time: {float(match[1]):.0f} s ({closing.strip('= ')})")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--junit", type=Path, default=CHECK / "junit.xml")
    parser.add_argument("--log", type=Path, default=CHECK / "pytest.log")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if not args.junit.exists():
        print(f"bench/suite_time.py: {args.junit} not found: run ./dev invoke check first "
              "(it writes the junit report)", file=sys.stderr)
        return 2
    try:
        print(report(args.junit, args.log, args.top))
    except ET.ParseError as exc:
        print(f"bench/suite_time.py: {args.junit}: not a junit report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
