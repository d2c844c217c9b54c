"""How long each xdist group of the suite takes, read from pytest's junit report.

``invoke check`` writes the report to ``.mnp/check/junit.xml`` (matrix/cli/suite.py). Two readers:

- tests/conftest.py hands the groups out longest first, so that no long group starts last and
  runs on alone. A clean clone (CI) has no report of its own, so the seconds of a measured run
  are kept in the repository, in ``tests/group_seconds.json``; a later local run's report wins.
- bench/suite_time.py prints the seconds per file and per group, and with ``--write-groups``
  records them in that file.

A group is a test's ``xdist_group`` mark; tests/conftest.py gives an unmarked test its file.
``--dist loadgroup`` appends ``@<group>`` to the test's name in the report.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAST_JUNIT = ROOT / ".mnp" / "check" / "junit.xml"
RECORDED = ROOT / "tests" / "group_seconds.json"


@dataclass(frozen=True)
class Case:
    """One test of the report: its file, its group and its seconds (setup, call, teardown)."""

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
    """Every test of the report at ``junit``; raises OSError or ET.ParseError."""
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = file_of(case.get("classname", ""))
        head, at, group = case.get("name", "").rpartition("@")
        group = group if at and "]" not in group else path  # "@" inside a parameter's id
        found.append(Case(path, group, float(case.get("time") or 0)))
    return found


def seconds_by_group(found: list[Case]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for case in found:
        totals[case.group] = totals.get(case.group, 0.0) + case.seconds
    return totals


def last_run(junit: Path = LAST_JUNIT) -> dict[str, float]:
    """Each group's seconds in this checkout's last ``invoke check``; empty without one."""
    try:
        return seconds_by_group(cases(junit))
    except (OSError, ET.ParseError):
        return {}


def recorded(path: Path = RECORDED) -> dict[str, float]:
    """Each group's seconds as the repository records them; empty when the file is missing."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(group): float(seconds) for group, seconds in data.get("seconds", {}).items()}


def record(found: list[Case], source: str, path: Path = RECORDED) -> None:
    """Write each group's seconds to ``path``, rounded to whole seconds, longest first."""
    totals = sorted(seconds_by_group(found).items(), key=lambda item: (-item[1], item[0]))
    data = {"source": source, "seconds": {group: round(seconds) for group, seconds in totals}}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
