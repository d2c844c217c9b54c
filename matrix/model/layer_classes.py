"""Rule classes over what each layer needs from the rest of its stack, with their data in the
class's entry in ``rules.yaml`` (each with its source):

* ``component-needs``: a component whose build compiles against, imports or links another needs
  that one below it in the same stack (DeepSpeed needs PyTorch; nccl-tests needs CUDA, NCCL and,
  unless built without it, an MPI). Read from the component's name, so a version entry that
  declares no ``requires`` is still checked; needs its ``requires`` names are left to the
  ``build-requires`` class, which checks them with their version specifiers.
* ``distribution-family``: what a layer's template installs from the base's distribution (apt
  pins, apt repositories; ``templates`` in the data, derived from images/<component>/Dockerfile.j2
  and re-derived by the tests) must be made for the base's distribution: a Debian revision
  (``+b1``, ``+deb12u1``) on an Ubuntu base, or an Ubuntu one (``ubuntu1``, ``build1``,
  ``~22.04``) on a Debian base, is a package apt cannot find.
* ``pip-needs-pip``: a layer with pip pins runs ``python3 -m pip``, so a stack's python layer
  below it cannot leave pip out (``options.pip: false``).
* ``cuda13-facts``: in a CUDA 13 stack every layer declares the facts the classes read (``os``
  for apt pins, ``requires`` for what is built or pip-installed, ``cuda`` for GPU components, a
  ``tag`` per pip pin), so none of them passes a class by leaving its fact out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from matrix.errors import UserError
from matrix.model.entities import ComponentVersion, Stack, matches
from matrix.model.violation import Rule, Violation, requirement

# --- component-needs ---------------------------------------------------------------------------


def _members(need: str, groups: dict[str, list[str]]) -> list[str]:
    """The components that satisfy ``need``: the members of its group (mpi: openmpi, ...) or it."""
    return list(groups.get(need, [need]))


def _declared(layer: ComponentVersion) -> set[str]:
    return {requirement(entry)[0] for entry in layer.spec.get("requires", [])}


def _wanted(layer: ComponentVersion, entry: dict[str, Any]) -> list[str]:
    """The needs of ``entry`` that apply to ``layer``: one its options switch off (nccl-tests'
    ``mpi: false``) does not."""
    options = layer.spec.get("options") or {}
    switches = entry.get("unless_off", {})
    return [need for need in entry["below"]
            if need not in switches or options.get(switches[need], True) is not False]


def check_component_needs(stack: Stack, rule: Rule) -> list[Violation]:
    """Each layer's component needs (from ``rule.data['needs']``) must come from the base or a
    layer below it."""
    needs, groups = rule.data["needs"], rule.data.get("groups", {})
    have = set(stack.base.provides)
    violations = []
    for layer in stack.layers:
        entry = needs.get(layer.component)
        for need in _wanted(layer, entry) if entry else []:
            members = _members(need, groups)
            if set(members) & _declared(layer) or set(members) & have:
                continue
            above = [x.label for x in stack.layers[stack.layers.index(layer) + 1:]
                     if x.component in members or set(members) & set(x.spec.get("provides", {}))]
            where = (f"{above[0]} comes after it (a layer sees only what is below it)" if above
                     else f"neither the base {stack.base.name} nor a layer provides it")
            kind = f"{need} ({', '.join(members)})" if len(members) > 1 else need
            detail = f"{layer.label} needs {kind} below it in the stack, but {where}"
            violations.append(Violation(stack, rule, layer.label, need, None, (need,), detail,
                                        entry["source"]))
        have.add(layer.component)
        have.update(layer.spec.get("provides", {}))
    return violations


# --- distribution-family -------------------------------------------------------------------


def _spec_field(spec: dict[str, Any], dotted: str) -> Any:
    value: Any = spec
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def base_family(os_release: str) -> str:
    """``debian`` of ``debian12``, ``ubuntu`` of ``ubuntu22.04``."""
    return re.sub(r"[0-9.]+$", "", os_release)


def pin_family(version: str, markers: dict[str, list[str]]) -> str | None:
    """The distribution whose archive alone can hold a package at ``version`` (its revision's
    marker), or None where the version could be in either."""
    return next((family for family, patterns in markers.items()
                 if any(re.search(pattern, version) for pattern in patterns)), None)


def _assumptions(layer: ComponentVersion, data: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(family, evidence) for every pin and repository the layer's template takes from its
    spec, where the version or URL names one distribution."""
    template = data["templates"].get(layer.component, {"pins": ["apt"]})
    for dotted in template.get("pins", []):
        for name, version in (_spec_field(layer.spec, dotted) or {}).items():
            family = pin_family(str(version), data["markers"])
            if family:
                yield family, f"{dotted} {name}={version}"
    for dotted in template.get("repos", []):
        for url in _spec_field(layer.spec, dotted) or []:
            family = next((f for f, pattern in data["repos"].items() if re.search(pattern, url)),
                          None)
            if family:
                yield family, f"{dotted} {url}"


def check_distribution_family(stack: Stack, rule: Rule) -> list[Violation]:
    """What each layer's template installs from the distribution must be the base's."""
    family = base_family(stack.base.os)
    violations = []
    for layer in stack.layers:
        foreign = [(f, why) for f, why in _assumptions(layer, rule.data) if f != family]
        if foreign:
            other, evidence = foreign[0]
            detail = (f"{layer.label} installs {other.capitalize()} packages through "
                      f"images/{layer.component}/Dockerfile.j2 ({evidence}); the base "
                      f"{stack.base.name} is {family.capitalize()} ({stack.base.os})")
            violations.append(Violation(stack, rule, layer.label, "distribution", family,
                                        (other,), detail))
    return violations


# --- cuda13-facts ------------------------------------------------------------------------------


def _facts_wanted(layer: ComponentVersion, data: dict[str, Any]) -> list[str]:
    by_component, by_source = data["components"], data["sources"]
    wanted = list(by_component.get(layer.component, by_source.get(layer.source, [])))
    if layer.spec.get("apt") and "os" not in wanted:
        wanted.insert(0, "os")  # apt pins are one release's packages
    return wanted


def _has(layer: ComponentVersion, fact: str) -> bool:
    if fact == "cuda":  # built for a CUDA elsewhere, or compiled here against the stack's
        return bool(layer.spec.get("cuda")) or "cuda" in _declared(layer)
    return layer.spec.get(fact) not in (None, [], "")


def check_cuda13_facts(stack: Stack, rule: Rule) -> list[Violation]:
    """In a stack whose CUDA matches ``rule.data['cuda']``, every layer declares its facts."""
    cuda = stack.versions().get("cuda")
    if not cuda or not matches(cuda, rule.data["cuda"]):
        return []
    violations = []
    for layer in stack.layers:
        missing = [fact for fact in _facts_wanted(layer, rule.data) if not _has(layer, fact)]
        pins = layer.spec.get("pip") or {}
        missing += [f"pip.{name}.{key}" for name, pin in pins.items()
                    for key in rule.data.get("pin_facts", []) if key not in pin]
        if missing:
            detail = (f"{layer.label} is in a CUDA {cuda} stack but its entry in the stacks "
                      f"file declares no {', '.join(missing)} (components.{layer.component}."
                      f"versions.{layer.version})")
            violations.append(Violation(stack, rule, layer.label, missing[0], None,
                                        tuple(missing), detail))
    return violations


# --- pip-needs-pip -------------------------------------------------------------------------------


def check_pip_needs_pip(stack: Stack, rule: Rule) -> list[Violation]:
    """A layer with pip pins runs pip (images/_macros.j2 ``pip_install``: ``python3 -m pip``), so
    the stack's ``rule.data['provider']`` layer below it must not leave pip out (its
    ``options.pip`` false)."""
    provider = rule.data["provider"]
    dropped = next((index for index, layer in enumerate(stack.layers) if layer.component == provider
                    and (layer.spec.get("options") or {}).get("pip", True) is False), None)
    if dropped is None:
        return []
    without = stack.layers[dropped].label
    return [Violation(stack, rule, layer.label, "pip", "options.pip: false", ("pip",),
                      f"{layer.label} installs pip pins with python3 -m pip, but {without} below "
                      f"it leaves pip out (its options.pip is false in stacks/{stack.name}/layers)")
            for layer in stack.layers[dropped + 1:] if layer.spec.get("pip")]


def check_data(rule: Rule, where: str) -> None:
    """Refuse a class entry whose regular expressions do not compile, in one line."""
    patterns = [(f"markers.{family}", p) for family, ps in rule.data.get("markers", {}).items()
                for p in ps]
    patterns += [(f"repos.{family}", p) for family, p in rule.data.get("repos", {}).items()]
    for key, pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UserError(f"{where}: rule class {rule.id}: {key} {pattern!r} is not a "
                            f"regular expression ({exc})") from None


CHECKS: dict[str, Callable[[Stack, Rule], list[Violation]]] = {
    "component-needs": check_component_needs,
    "distribution-family": check_distribution_family,
    "cuda13-facts": check_cuda13_facts,
    "pip-needs-pip": check_pip_needs_pip,
}
