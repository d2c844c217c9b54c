"""A compatibility rule and a stack's violation of it, shared by :mod:`matrix.model.rules` (pairwise
rules and the first rule classes) and :mod:`matrix.model.layer_classes` (the classes over what
each layer needs below it, its distribution and its declared facts)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from matrix.errors import UserError
from matrix.model.entities import Stack

_REQUIREMENT = re.compile(r"^([a-z0-9][a-z0-9.-]*)\s*(.*)$")
# How rules.yaml says "any version of it" (every release compares >= 0).
ANY_VERSION = ">=0"


@dataclass(frozen=True)
class Rule:
    id: str
    when: dict[str, Any]
    require: dict[str, tuple[str, ...]]
    source: str
    why: str = ""
    present: bool = False
    level: str = "required"
    kind: str = "pairwise"
    # A rule class's own data from rules.yaml (what it checks against), beside id/why/source.
    data: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Violation:
    stack: Stack
    rule: Rule
    trigger: str
    component: str
    found: str | None
    wanted: tuple[str, ...]
    detail: str = ""
    fact_source: str = ""

    @property
    def sentence(self) -> str:
        if self.detail:
            return self.detail
        wanted = " or ".join(self.wanted)
        found = f"found {self.found}" if self.found else "it is missing"
        if wanted == ANY_VERSION:
            return f"{self.trigger} needs {self.component}, {found}"
        return f"{self.trigger} needs {self.component} {wanted}, {found}"

    @property
    def blocking(self) -> bool:
        return self.rule.level == "required"

    @property
    def named(self) -> str:
        """Which rule fired, as ``invoke stacks`` shows it: a rule class says so."""
        return f"rule class {self.rule.id}" if self.rule.kind == "class" else f"rule {self.rule.id}"

    def __str__(self) -> str:
        why = f" ({self.rule.why})" if self.rule.why else ""
        level = "" if self.blocking else " [recommended, not required]"
        source = self.rule.source + (f"; fact: {self.fact_source}" if self.fact_source else "")
        return (f"{self.stack.where}: stack {self.stack.name}: {self.sentence}{why}{level} "
                f"[rule {self.rule.id}; source: {source}]")


def fact_source(spec: dict[str, Any], fact: str) -> str:
    """Where a component version's ``fact`` comes from (its ``sources.<fact>``), or ''."""
    return str((spec.get("sources") or {}).get(fact, ""))


def requirement(entry: str) -> tuple[str, str]:
    """A ``requires`` entry split into name and specifier (``libfabric>=1.11.0``)."""
    match = _REQUIREMENT.match(entry)
    if not match:  # the schema's pattern keeps this from happening
        raise UserError(f"requires entry {entry!r} is not `name` or `name<specifier>`")
    return match.group(1), match.group(2).strip()
