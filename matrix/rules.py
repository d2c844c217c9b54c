"""Compatibility rules: data in ``rules.yaml``, evaluated with ``packaging`` specifiers.

A violation names the stack, both components and their versions, the rule and its source, and
points at the stack's line in the stacks file. :func:`require_valid` is the gate every command
that renders or builds goes through.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from matrix import yamlsrc
from matrix.errors import UserError
from matrix.loader import check_schema
from matrix.model import Matrix, Stack, comparable

RULES_FILE = Path(__file__).parent / "rules.yaml"


@dataclass(frozen=True)
class Rule:
    id: str
    when: dict[str, str]
    require: dict[str, tuple[str, ...]]
    source: str
    why: str = ""
    present: bool = False


@dataclass(frozen=True)
class Violation:
    stack: Stack
    rule: Rule
    trigger: str
    component: str
    found: str | None
    wanted: tuple[str, ...]

    def __str__(self) -> str:
        wanted = " or ".join(self.wanted)
        found = f"found {self.found}" if self.found else "it is missing"
        why = f" ({self.rule.why})" if self.rule.why else ""
        return (f"{self.stack.where}: stack {self.stack.name}: {self.trigger} needs "
                f"{self.component} {wanted}, {found}{why} "
                f"[rule {self.rule.id}; source: {self.rule.source}]")


@cache
def load_rules(path: Path = RULES_FILE) -> tuple[Rule, ...]:
    located = yamlsrc.load(path)
    check_schema(located, "rules")
    rules = []
    for index, raw in enumerate(located.data["rules"]):
        require = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in raw["require"].items()}
        specs = [s for k, s in raw["when"].items() if k != "instance" and "." not in k]
        for spec in specs + [s for alts in require.values() for s in alts]:
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                where = located.where(("rules", index))
                raise UserError(f"{where}: rule {raw['id']}: invalid specifier {spec!r}") from None
        rules.append(Rule(id=raw["id"], when=raw["when"], require=require,
                          source=raw["source"], why=raw.get("why", ""),
                          present=raw.get("present", False)))
    return tuple(rules)


def _matches(version: str, spec: str) -> bool:
    return SpecifierSet(spec).contains(comparable(version), prereleases=True)


def _applies(rule: Rule, stack: Stack, versions: dict[str, str]) -> str | None:
    """The triggering condition as text when ``rule`` applies to ``stack``, else None."""
    reasons = []
    for key, wanted in rule.when.items():
        if key == "instance":
            hits = [i for i in stack.instances if fnmatch(i, wanted)]
            if not hits:
                return None
            reasons.append(f"instance {hits[0]}")
        elif "." in key:
            component, field = key.split(".", 1)
            layer = stack.layer(component)
            if layer is None or str(layer.spec.get(field, "")) != wanted:
                return None
        else:
            if key not in versions or not _matches(versions[key], wanted):
                return None
            reasons.append(f"{key} {versions[key]}")
    return " with ".join(reasons)


def check_stack(stack: Stack, rules: tuple[Rule, ...] | None = None) -> list[Violation]:
    """All rule violations of one stack."""
    versions = stack.versions()
    violations = []
    for rule in rules if rules is not None else load_rules():
        trigger = _applies(rule, stack, versions)
        if trigger is None:
            continue
        for component, alternatives in rule.require.items():
            found = versions.get(component)
            if found is None:
                if rule.present:
                    violations.append(Violation(stack, rule, trigger, component, None,
                                                alternatives))
                continue
            if not any(_matches(found, spec) for spec in alternatives):
                violations.append(Violation(stack, rule, trigger, component, found,
                                            alternatives))
    return violations


def check_matrix(matrix: Matrix) -> dict[str, list[Violation]]:
    return {name: check_stack(stack) for name, stack in matrix.stacks.items()}


def require_valid(matrix: Matrix, names: list[str]) -> None:
    """Refuse to go on when any named stack breaks a rule: every violation, on one line."""
    for name in names:
        violations = check_stack(matrix.stack(name))
        if violations:
            raise UserError(" | ".join(str(v) for v in violations))
