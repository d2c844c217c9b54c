"""The NVIDIA driver a stack needs on its hosts, before anything is submitted (issue 33).

The figures live in ``drivers.yaml`` next to this file (schema: ``schemas/drivers.schema.yaml``),
each with its source: per CUDA release the oldest driver that runs it (from CUDA 11 under
minor-version compatibility) and the toolkit's own driver, and the rules of CUDA's forward
compatibility. :func:`driver_floor` gives a stack's floor as a :class:`DriverFloor`, whose
:meth:`~DriverFloor.line` is what ``invoke stacks``, ``invoke explain`` and the job writers
(a Batch tag, a Slurm script comment, a Kubernetes annotation) print. The entrypoint checks the
same floor on every GPU node at start (``entrypoint/probe/driver.py``).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from datetime import date, datetime
from functools import cache
from pathlib import Path
from typing import Any

from matrix.errors import UserError
from matrix.model import yamlsrc
from matrix.model.entities import Stack
from matrix.model.schema import check_schema

TABLE = Path(__file__).parent / "drivers.yaml"
# Where the job writers put the floor (the integrator's hooks call these; see the README section
# "NVIDIA drivers and AMIs"). A Batch tag value: at most 256 characters of letters, digits,
# spaces and _ . : / = + - @ (https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html
# "Tag naming limits and requirements"; API_RegisterJobDefinition.html, tags).
BATCH_TAG = "mnp:nvidia-driver-min"
K8S_ANNOTATION = "mnp-stacks/nvidia-driver-min"
TAG_VALUE_RE = re.compile(r"^[\w\s_.:/=+\-@]{0,256}$")


@dataclass(frozen=True)
class DriverFloor:
    """The driver a CUDA stack needs: ``minimum`` runs it (``source`` says why), ``toolkit`` is
    the toolkit release's own driver (``None`` where not confirmed)."""

    cuda: str
    minimum: str
    source: str
    minor_compat: bool
    toolkit: str | None
    toolkit_source: str
    forward_compat: str

    def line(self) -> str:
        """One line: the floor, the toolkit's driver and forward compatibility, with sources."""
        how = "under minor-version compatibility" if self.minor_compat else (
            "no minor-version compatibility before CUDA 11")
        toolkit = (f"; the toolkit's own driver {self.toolkit} [{self.toolkit_source}]"
                   if self.toolkit else "")
        return (f"NVIDIA driver >= {self.minimum} for CUDA {self.cuda} ({how}) [{self.source}]"
                f"{toolkit}{self.forward_compat}")

    def short(self) -> str:
        """At most 256 characters (an AWS Batch tag value): the floor and its first source URL."""
        return f"NVIDIA driver >= {self.minimum} (CUDA {self.cuda}; {self.source.split()[0]})"[:256]

    def tag_value(self) -> str:
        """The floor as an AWS tag value (``BATCH_TAG``): only the characters tags allow."""
        return f"{self.minimum} for CUDA {self.cuda} - {self.source.split()[0]}"[:256]

    def comment_lines(self, width: int = 100, prefix: str = "# ") -> list[str]:
        """:meth:`line` as comment lines (a Slurm script), each at most ``width`` wide where the
        words allow."""
        return textwrap.wrap(self.line(), width, initial_indent=prefix,
                             subsequent_indent=prefix, break_long_words=False,
                             break_on_hyphens=False)

    def to_dict(self) -> dict[str, Any]:
        return {"cuda": self.cuda, "minimum": self.minimum, "source": self.source,
                "minor_compat": self.minor_compat, "toolkit": self.toolkit,
                "toolkit_source": self.toolkit_source, "forward_compat": self.forward_compat,
                "line": self.line()}


@cache
def load_drivers(path: Path = TABLE) -> dict[str, Any]:
    """Read and schema-check the driver table; problems name ``file:line``."""
    located = yamlsrc.load(path)
    if not isinstance(located.data, dict):
        raise UserError(f"{path}: expected a mapping with cuda, families, forward_compatibility")
    check_schema(located, "drivers")
    return located.data


def _release(cuda: str) -> tuple[int, int]:
    major, minor = (cuda.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def past_end_of_life(end_of_life: str, day: date) -> bool:
    """Whether a branch whose end of life is the month ``end_of_life`` (YYYY-MM) is past it on
    ``day`` (from the first day of the next month)."""
    year, month = (int(part) for part in end_of_life.split("-"))
    return (day.year, day.month) > (year, month)


def month_words(month: str) -> str:
    """``2026-06`` -> ``June 2026``."""
    return datetime.strptime(month, "%Y-%m").strftime("%B %Y")


def qualifying_branches(data: dict[str, Any], day: date) -> list[str]:
    """The driver branches forward compatibility is offered from on ``day``, newest first: a
    designation of ``forward_compatibility.designations``, not past its end of life."""
    designations = data["forward_compatibility"]["designations"]
    return [name for name, entry in sorted(data["branches"].items(), key=lambda b: -int(b[0]))
            if entry["designation"] in designations
            and not past_end_of_life(entry["end_of_life"], day)]


def forward_compat_text(data: dict[str, Any], minimum: str, day: date | None = None) -> str:
    """The forward-compatibility clause on ``day`` (today by default): the branches below
    ``minimum`` it is offered from, or, where the support matrix lists branches below it but
    none qualifies, that none does and why ("" where every listed branch meets ``minimum``)."""
    day = day or date.today()
    fc, branches = data["forward_compatibility"], data["branches"]
    floor = int(minimum.split(".")[0])
    below = [b for b in sorted(branches, key=lambda b: -int(b)) if int(b) < floor]
    if not below:
        return ""
    qualifying = qualifying_branches(data, day)
    matrix = next(word for word in data["branches_source"].split() if word.startswith("https://"))
    sources = (f"{fc['gpus_source'].split()[0]} section \"Forward Compatibility Support Across "
               f"Major Toolkit Versions\"; {matrix} Table 2")
    offered = [b for b in qualifying if int(b) < floor]
    if offered:
        return ("; " f"below it only CUDA forward compatibility runs it, and the entrypoint uses it "
                f"where it can: compat libraries in the image ({' or '.join(fc['dirs'])}), a data "
                f"center GPU, a host driver of branch {' or '.join(f'R{b}' for b in offered)} (the "
                f"branches below it not past their end of life on {day.isoformat()}) [{sources}]")
    ended = ", ".join(f"R{b} ({branches[b]['designation']}, end of life "
                      f"{month_words(branches[b]['end_of_life'])})" for b in below)
    meets = ", ".join(f"R{b}" for b in qualifying)
    return ("; " f"below it no forward compatibility on {day.isoformat()}: the branches below it, "
            f"{ended}, do not qualify, and every branch that does ({meets}) meets it [{sources}]")


def floor_for(cuda: str, path: Path = TABLE) -> DriverFloor | None:
    """The floor for CUDA release ``cuda`` (e.g. "13.2.86"); ``None`` when the table has none.
    A release without its own entry from CUDA 11 on takes its major release's family floor."""
    data = load_drivers(path)
    major, minor = _release(cuda)
    entry = data["cuda"].get(f"{major}.{minor}")
    if entry is not None:
        return DriverFloor(cuda, entry["minimum"], " ".join(entry["source"].split()),
                           entry["minor_compat"], entry.get("toolkit"),
                           " ".join(entry.get("toolkit_source", "").split()),
                           forward_compat_text(data, entry["minimum"]))
    family = data["families"].get(str(major)) if major >= 11 else None
    if family is None:
        return None
    return DriverFloor(cuda, family["minimum"], family["source"], True, None, "",
                       forward_compat_text(data, family["minimum"]))


def driver_floor(stack: Stack, path: Path = TABLE) -> DriverFloor | None:
    """The stack's driver floor; ``None`` for a stack without CUDA. A CUDA release the table
    lacks is an error naming the table (the floor must grow with the stacks)."""
    cuda = stack.versions().get("cuda")
    if not cuda:
        return None
    found = floor_for(cuda, path)
    if found is None:
        raise UserError(f"{path.name}: no driver floor for CUDA {cuda} (stack {stack.name}): add "
                        f"cuda.\"{'.'.join(map(str, _release(cuda)))}\" with its source")
    return found


def floor_named(stack_name: str, stacks_file: Path | None = None) -> DriverFloor | None:
    """:func:`driver_floor` of the stack named ``stack_name`` in ``stacks_file`` (the project's
    stacks.yaml by default), for writers that hold only the name; an unknown name is the
    loader's one-line error."""
    from matrix.model.loader import load_matrix
    from matrix.model.settings import ROOT

    return driver_floor(load_matrix(stacks_file or ROOT / "stacks.yaml").stack(stack_name))
