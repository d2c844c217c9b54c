"""Where the suite's time goes: seconds per test file and per xdist group, slowest first.

``invoke check`` writes pytest's junit report to ``.mnp/check/junit.xml`` and its output to
``.mnp/check/pytest.log`` (matrix/cli/suite.py). This reads them and prints, for each test file
and each xdist group (a test's file unless it is marked with another ``xdist_group``), the
summed time of its tests (setup, call and teardown, as the junit report counts them) and how
many there are, then the run's wall time from pytest's closing line. A group runs in one worker
from start to end, so the longest group is the shortest the run can take with enough workers;
the summed time over the workers is what they share.

With ``--write-groups`` it also records each group's seconds in ``tests/group_seconds.json``,
the order a clean clone hands the groups out in (tests/suite_groups.py); record a whole warm run.

Usage: ``python bench/suite_time.py [--junit FILE] [--log FILE] [--top N] [--write-groups RUN]``
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.suite_groups import RECORDED, cases, record  # noqa: E402

CHECK = ROOT / ".mnp" / "check"
WALL = re.compile(r" in ([\d.]+)s(?: \(\d+:\d\d:\d\d\))?(?: =+)?$")


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
    parser.add_argument("--write-groups", metavar="RUN",
                        help=f"record each group's seconds in {RECORDED.relative_to(ROOT)}, "
                        "with RUN saying which run they are from")
    args = parser.parse_args(argv)
    if not args.junit.exists():
        print(f"bench/suite_time.py: {args.junit} not found: run ./dev invoke check first "
              "(it writes the junit report)", file=sys.stderr)
        return 2
    try:
        print(report(args.junit, args.log, args.top))
        if args.write_groups:
            record(cases(args.junit), args.write_groups)
    except ET.ParseError as exc:
        print(f"bench/suite_time.py: {args.junit}: not a junit report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
