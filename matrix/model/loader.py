"""Load ``stacks.yaml``: parse with positions, check the schema, resolve references.

Every problem is a :class:`~matrix.errors.UserError` naming ``file:line`` and the key at fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier

from matrix.errors import UserError, did_you_mean, excerpt
from matrix.model import reference, yamlsrc
from matrix.model.entities import (
    DEFAULT_PLATFORM,
    Base,
    ComponentVersion,
    Matrix,
    Stack,
    comparable,
    specifier,
)
from matrix.model.instances import INSTANCE_TYPES, TABLE
from matrix.model.schema import check_options, check_schema, key_text, layer_entry
from matrix.model.settings import ROOT


def load_matrix(path: Path) -> Matrix:
    """Read, schema-check and resolve a stacks file."""
    located = yamlsrc.load(path)
    if not isinstance(located.data, dict):
        raise UserError(f"{path}: expected a mapping with repository, bases, components, stacks")
    check_schema(located, "stacks")
    check_options(located)
    data = located.data
    _check_base_references(located)
    bases = {name: _base(name, spec) for name, spec in data["bases"].items()}
    _check_versions(located)
    _check_cuda_ranges(located)
    stacks = {
        name: _stack(name, spec, bases, data["components"], located)
        for name, spec in data["stacks"].items()
    }
    if "default_stack" in data and data["default_stack"] not in stacks:
        raise UserError(f"{located.where(('default_stack',))}: default_stack: no stack named "
                        f"{data['default_stack']!r}{did_you_mean(data['default_stack'], stacks)}")
    return Matrix(path=path, repository=data["repository"], source=data.get("source", ""),
                  bases=bases, stacks=stacks, located=located)


def _base(name: str, spec: dict[str, Any]) -> Base:
    return Base(name=name, image=spec["image"], os=spec["os"], provides=dict(spec["provides"]),
                bootstrap=spec.get("bootstrap"), provide_hint=spec.get("provide_hint", ""))


def _check_base_references(located: yamlsrc.Located) -> None:
    """Each base's ``image`` must be a reference the Docker engine accepts (its own grammar),
    so a base may live in any registry, one with a port too; a digest must be sha256."""
    for name, base in located.data["bases"].items():
        here = ("bases", name, "image")
        try:
            parsed = reference.parse(base["image"])
        except ValueError as exc:
            raise UserError(f"{located.where(here)}: bases/{name}/image: {exc}") from None
        if parsed.digest and not parsed.digest.startswith("sha256:"):
            raise UserError(f"{located.where(here)}: bases/{name}/image: digest "
                            f"{excerpt(parsed.digest)} is not sha256:<64 hex digits>")


def _check_versions(located: yamlsrc.Located) -> None:
    """Every version string must carry a numeric release so rules can compare it."""
    data = located.data
    places: list[tuple[tuple[Any, ...], str]] = []
    for name, base in data["bases"].items():
        places += [(("bases", name, "provides", k), v) for k, v in base["provides"].items()]
    for comp, cspec in data["components"].items():
        for ver, vspec in cspec["versions"].items():
            places.append((("components", comp, "versions", ver), ver))
            places += [(("components", comp, "versions", ver, "provides", k), v)
                       for k, v in vspec.get("provides", {}).items()]
    for json_path, version in places:
        try:
            comparable(version)
        except ValueError:
            raise UserError(f"{located.where(json_path)}: {'/'.join(map(key_text, json_path))}: "
                            f"version {excerpt(version)} has no numeric release") from None


def _check_cuda_ranges(located: yamlsrc.Located) -> None:
    """A component's ``cuda`` fact and each pip pin's ``requires_python`` are version ranges the
    rules evaluate: each must parse as one."""
    for comp, cspec in located.data["components"].items():
        for ver, vspec in cspec["versions"].items():
            here = ("components", comp, "versions", ver)
            ranges = [(here + ("cuda",), vspec["cuda"], '"==11.7.*" or ">=12.8"')] \
                if "cuda" in vspec else []
            ranges += [(here + ("pip", package, "requires_python"), pin["requires_python"],
                        '">=3.8" or ">=2.7, !=3.0.*"')
                       for package, pin in (vspec.get("pip") or {}).items()
                       if isinstance(pin, dict) and "requires_python" in pin]
            for json_path, value, example in ranges:
                try:
                    specifier(value)
                except InvalidSpecifier:
                    raise UserError(f"{located.where(json_path)}: "
                                    f"{'/'.join(map(key_text, json_path))}: {excerpt(value)} is "
                                    f"not a version range (e.g. {example})") from None


def _check_instances(name: str, spec: dict[str, Any], located: yamlsrc.Located) -> None:
    """Every instance type a stack names must be a row of the one instance table."""
    for index, instance in enumerate(spec["instances"]):
        if instance not in INSTANCE_TYPES:
            at = located.where(("stacks", name, "instances", index))
            raise UserError(f"{at}: stacks/{name}/instances/{index}: instance type {instance!r} "
                            f"is not in the instance table {TABLE.relative_to(ROOT)}"
                            f"{did_you_mean(instance, INSTANCE_TYPES)} "
                            f"(known: {', '.join(sorted(INSTANCE_TYPES))})")


def _check_ci_runner(name: str, spec: dict[str, Any], located: yamlsrc.Located) -> None:
    """A stack's ci.runner must be a runner label the rules know the architecture of (rule
    class ci-runner-platform's ``runners``), so that the class can compare it with the stack's
    platform; a label nobody checked is refused here, not let through."""
    from matrix.model.rules import CI_RUNNER_CLASS, RULES_FILE, known_runners

    runner = (spec.get("ci") or {}).get("runner")
    if runner is None:
        return
    runners = known_runners()
    if runner not in runners:
        at = located.where(("stacks", name, "ci", "runner"))
        raise UserError(f"{at}: stacks/{name}/ci/runner: runner label {excerpt(runner)} is not "
                        f"one rule class {CI_RUNNER_CLASS} knows the architecture of"
                        f"{did_you_mean(runner, runners)} (known: {', '.join(sorted(runners))}; "
                        f"a new one goes in {RULES_FILE.relative_to(ROOT)} with its source)")


def _stack(name: str, spec: dict[str, Any], bases: dict[str, Base],
           components: dict[str, Any], located: yamlsrc.Located) -> Stack:
    here = ("stacks", name)
    if spec["base"] not in bases:
        raise UserError(f"{located.where(here + ('base',))}: stacks/{name}/base: unknown base "
                        f"{spec['base']!r} (bases: {', '.join(sorted(bases))})")
    layers: list[ComponentVersion] = []
    for index, entry in enumerate(spec["layers"]):
        component, version, options = layer_entry(entry)
        at = located.where(here + ("layers", index))
        if component not in components:
            raise UserError(f"{at}: stacks/{name}/layers/{index}: unknown component "
                            f"{component!r} (components: {', '.join(sorted(components))})")
        versions = components[component]["versions"]
        if version not in versions:
            raise UserError(f"{at}: stacks/{name}/layers/{index}: {component} has no version "
                            f"{excerpt(version)} (declared: {', '.join(map(key_text, versions))})")
        if any(layer.component == component for layer in layers):
            raise UserError(f"{at}: stacks/{name}/layers/{index}: {component} appears twice")
        layers.append(ComponentVersion(component, version,
                                       _with_options(versions[version], options), options))
    _check_instances(name, spec, located)
    _check_ci_runner(name, spec, located)
    return Stack(
        name=name, description=spec["description"], base=bases[spec["base"]],
        layers=tuple(layers), instances=tuple(spec["instances"]), fabric=spec["fabric"],
        where=located.where(here), ci_runner=(spec.get("ci") or {}).get("runner"),
        platform=spec.get("platform", DEFAULT_PLATFORM),
        size_budget_mb=spec.get("size_budget_mb"),
        layer_budget_mb=_layer_budget(spec.get("layer_budget_mb")),
    )


def _with_options(vspec: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A version's spec with a stack's options over its own (the version's entry is shared by
    every stack that names it, so it is copied, never changed)."""
    if not options:
        return vspec
    return {**vspec, "options": {**(vspec.get("options") or {}), **options}}


def _layer_budget(value: int | dict[str, int] | None) -> tuple[tuple[str, int], ...]:
    """``layer_budget_mb`` as pairs (an integer is the default for every layer)."""
    if value is None:
        return ()
    return tuple(sorted(value.items())) if isinstance(value, dict) else (("default", value),)
