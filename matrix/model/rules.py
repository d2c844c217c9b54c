"""Compatibility rules: data in ``rules.yaml``, evaluated with ``packaging`` specifiers.

Two kinds of rule, both with their source:

* pairwise rules (``rules:``): when a stack has component X at a matching version (or a fabric,
  or targets an instance matching a glob, with a given GPU model or with accelerators), it
  needs component Y at a matching version, or its instances need a capability from the
  instance table; both ways round, so a stacks file declares no target that every writer
  would refuse (a CPU stack on a GPU instance);
* rule classes (``classes:``): checks over the facts every component version carries in
  ``stacks.yaml`` (``requires``, ``os``, ``cuda``, ``cxx_std``/``header_cxx_std``, and each pip
  pin's ``requires_python`` and wheel ``tag``) and over the instance table (every target GPU
  must be one the stack's CUDA can compile for), so whole classes of incompatibility are caught,
  not just the pairs someone wrote down;
* rule classes over what a component needs below it, the distribution its template installs
  from and the facts a CUDA 13 stack's versions must declare (:mod:`matrix.model.layer_classes`),
  with their data in the class's entry in ``rules.yaml``.

A violation names the stack, what needs what, what was found, the rule and its source (plus the
source of the component fact it used), and points at the stack's line in the stacks file.
:func:`require_valid` is the gate every command that renders or builds goes through; rules of
level ``recommended`` are reported by :func:`check_stack` but never block.
"""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatch
from functools import cache
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier
from packaging.tags import parse_tag

from matrix.errors import UserError
from matrix.model import layer_classes, yamlsrc
from matrix.model.entities import Matrix, Stack, comparable, matches, specifier
from matrix.model.schema import check_schema
from matrix.model.violation import Rule, Violation, fact_source, requirement

RULES_FILE = Path(__file__).parent / "rules.yaml"
PYPI_SIMPLE = "https://pypi.org/simple"


# --- loading -------------------------------------------------------------------------------

@cache
def load_rules(path: Path = RULES_FILE) -> tuple[Rule, ...]:
    """Pairwise rules, then rule classes, from ``path`` (schema-checked, specifiers parsed)."""
    located = yamlsrc.load(path)
    check_schema(located, "rules")
    rules = [_pairwise(raw, located.where(("rules", index)))
             for index, raw in enumerate(located.data["rules"])]
    for index, raw in enumerate(located.data.get("classes", [])):
        if raw["id"] not in CLASS_CHECKS:
            raise UserError(f"{located.where(('classes', index))}: rule class {raw['id']!r} has "
                            f"no check in matrix/model/rules.py ({', '.join(sorted(CLASS_CHECKS))})")
        data = {k: v for k, v in raw.items() if k not in ("id", "why", "source")}
        rules.append(Rule(id=raw["id"], when={}, require={}, source=raw["source"],
                          why=raw.get("why", ""), kind="class", data=data))
        layer_classes.check_data(rules[-1], located.where(("classes", index)))
    missing = set(CLASS_CHECKS) - {r.id for r in rules if r.kind == "class"}
    if missing:
        raise UserError(f"{path}: classes: no entry (with its source) for {', '.join(sorted(missing))}")
    return tuple(rules)


def _pairwise(raw: dict[str, Any], where: str) -> Rule:
    require = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in raw["require"].items()}
    specs = [s for k, s in raw["when"].items() if not _is_keyword(k) and "." not in k]
    specs += [s for k, alts in raw["when"].items() if k.startswith("instance.")
              for s in ([alts] if isinstance(alts, str) else alts) if _is_specifier(s)]
    specs += [s for k, alts in require.items() if k != "instance.efa_rdma_read" for s in alts]
    for spec in specs:
        try:
            specifier(spec)
        except (InvalidSpecifier, ValueError):
            raise UserError(f"{where}: rule {raw['id']}: invalid specifier {spec!r}") from None
    return Rule(id=raw["id"], when=raw["when"], require=require, source=raw["source"],
                why=raw.get("why", ""), present=raw.get("present", False),
                level=raw.get("level", "required"))


def _is_keyword(key: str) -> bool:
    return key in ("instance", "fabric") or key.startswith("instance.")


def _is_specifier(text: str) -> bool:
    """Whether a condition's value compares (``>=1``) rather than names a value (``H100``)."""
    return text[:1] in ("<", ">", "=", "!", "~")


# --- pairwise rules --------------------------------------------------------------------------

def _instance_rows(stack: Stack) -> list[Any]:
    from matrix.model.instances import INSTANCE_TYPES

    return [INSTANCE_TYPES[name] for name in stack.instances if name in INSTANCE_TYPES]


def _field_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def instance_has(row: Any, attr: str, wanted: str | list[str]) -> bool:
    """Whether instance-table ``row``'s field ``attr`` is one of ``wanted``: a value as the table
    writes it (``H100``, ``true``) or, for a count, a specifier (``>=1``)."""
    value = getattr(row, attr)
    for alternative in [wanted] if isinstance(wanted, str) else wanted:
        if _is_specifier(alternative):
            if isinstance(value, int) and not isinstance(value, bool) and \
                    matches(str(value), alternative):
                return True
        elif _field_text(value) == alternative:
            return True
    return False


def _applies(rule: Rule, stack: Stack, versions: dict[str, str]) -> str | None:
    """The triggering condition as text when ``rule`` applies to ``stack``, else None."""
    reasons = []
    for key, wanted in rule.when.items():
        if key == "instance":
            hits = [i for i in stack.instances if fnmatch(i, wanted)]
            if not hits:
                return None
            reasons.append(f"instance {hits[0]}")
        elif key == "fabric":
            if stack.fabric != wanted:
                return None
            reasons.append(f"fabric {wanted}")
        elif key.startswith("instance."):
            attr = key.split(".", 1)[1]
            hits = [row for row in _instance_rows(stack) if instance_has(row, attr, wanted)]
            if not hits:
                return None
            reasons.append(f"instance {hits[0].name} ({attr} {_field_text(getattr(hits[0], attr))})")
        elif "." in key:
            component, attr = key.split(".", 1)
            layer = stack.layer(component)
            if layer is None or str(layer.spec.get(attr, "")) != wanted:
                return None
        else:
            if key not in versions or not matches(versions[key], wanted):
                return None
            reasons.append(f"{key} {versions[key]}")
    return " with ".join(reasons) or f"stack {stack.name}"


def _instancerequirement(stack: Stack, rule: Rule, trigger: str, key: str,
                          alternatives: tuple[str, ...]) -> list[Violation]:
    attr = key.split(".", 1)[1]
    problems = []
    for row in _instance_rows(stack):
        value = getattr(row, attr)
        if isinstance(value, bool):
            ok = _field_text(value) in alternatives
        else:
            ok = any(matches(str(value), spec) for spec in alternatives)
        if not ok:
            problems.append(Violation(stack, rule, trigger, f"instance {row.name} {attr}",
                                      _field_text(value), alternatives,
                                      fact_source=f"matrix/model/instances.yaml {row.name}"))
    return problems


def _check_pairwise(stack: Stack, rule: Rule, versions: dict[str, str]) -> list[Violation]:
    trigger = _applies(rule, stack, versions)
    if trigger is None:
        return []
    violations = []
    for component, alternatives in rule.require.items():
        if component.startswith("instance."):
            violations += _instancerequirement(stack, rule, trigger, component, alternatives)
            continue
        found = versions.get(component)
        if found is None:
            if rule.present:
                violations.append(Violation(stack, rule, trigger, component, None, alternatives))
            continue
        if not any(matches(found, spec) for spec in alternatives):
            violations.append(Violation(stack, rule, trigger, component, found, alternatives))
    return violations


# --- rule classes over component facts --------------------------------------------------------

def check_build_requires(stack: Stack, rule: Rule) -> list[Violation]:
    """What a layer compiles or links against must come from the base or an earlier layer."""
    have = dict(stack.base.provides)
    violations = []
    for layer in stack.layers:
        for entry in layer.spec.get("requires", []):
            name, spec = requirement(entry)
            found = have.get(name)
            source = fact_source(layer.spec, "requires")
            if found is None:
                detail = (f"{layer.label} builds against {name}, but neither the base "
                          f"{stack.base.name} nor a layer before it provides {name}")
                violations.append(Violation(stack, rule, layer.label, name, None, (spec or "*",),
                                            detail, source))
            elif spec and not matches(found, spec):
                detail = (f"{layer.label} builds against {name}{spec}; the base or an earlier "
                          f"layer provides {name} {found}")
                violations.append(Violation(stack, rule, layer.label, name, found, (spec,),
                                            detail, source))
        have[layer.component] = layer.version
        have.update(layer.spec.get("provides", {}))
    return violations


def check_os(stack: Stack, rule: Rule) -> list[Violation]:
    """Each component's supported OS releases must include the base's."""
    violations = []
    for layer in stack.layers:
        supported = layer.spec.get("os")
        if supported and stack.base.os not in supported:
            detail = (f"{layer.label} supports {', '.join(supported)}; the base "
                      f"{stack.base.name} is {stack.base.os}")
            violations.append(Violation(stack, rule, layer.label, "os", stack.base.os,
                                        tuple(supported), detail, fact_source(layer.spec, "os")))
    return violations


def check_cuda(stack: Stack, rule: Rule) -> list[Violation]:
    """A component built for given CUDA versions needs the stack's CUDA to be one of them."""
    cuda = stack.versions().get("cuda")
    violations = []
    for layer in stack.layers:
        built_for = layer.spec.get("cuda")
        if not built_for:
            continue
        if cuda is None or not matches(cuda, built_for):
            found = f"CUDA {cuda}" if cuda else "no CUDA"
            detail = f"{layer.label} is built for CUDA {built_for}; the stack has {found}"
            violations.append(Violation(stack, rule, layer.label, "cuda", cuda, (built_for,),
                                        detail, fact_source(layer.spec, "cuda")))
    return violations


def check_cxx_standard(stack: Stack, rule: Rule) -> list[Violation]:
    """A layer compiled against another's headers must use at least the C++ standard they need."""
    violations = []
    for layer in stack.layers:
        standard = layer.spec.get("cxx_std")
        if standard is None:
            continue
        for entry in layer.spec.get("requires", []):
            provider = stack.layer(requirement(entry)[0])
            needed = provider.spec.get("header_cxx_std") if provider else None
            if needed is not None and int(needed) > int(standard):
                detail = (f"{layer.label} compiles with C++{standard} against "
                          f"{provider.label}, whose headers need C++{needed}")
                source = "; ".join(s for s in (fact_source(layer.spec, "cxx_std"),
                                               fact_source(provider.spec, "header_cxx_std")) if s)
                violations.append(Violation(stack, rule, layer.label, provider.component,
                                            f"C++{standard}", (f"C++{needed}",), detail, source))
    return violations


def _pip_pins(stack: Stack):
    for layer in stack.layers:
        for name, pin in (layer.spec.get("pip") or {}).items():
            yield layer, name, pin


def check_requires_python(stack: Stack, rule: Rule) -> list[Violation]:
    """Every pinned distribution's Requires-Python must admit the stack's Python."""
    python = stack.versions().get("python")
    violations = []
    for layer, name, pin in _pip_pins(stack):
        wanted = pin.get("requires_python")
        if python and wanted and not matches(python, wanted):
            detail = (f"{layer.label} pins {name} {pin['version']}, whose Requires-Python is "
                      f"{wanted!r}; the stack's Python is {python}")
            violations.append(Violation(stack, rule, layer.label, "python", python, (wanted,),
                                        detail, f"{PYPI_SIMPLE}/{name}/"))
    return violations


# A platform's architecture (GOARCH) as wheel platform tags end (manylinux_2_28_aarch64).
WHEEL_MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}


def wheel_fits(tag: str, python: str, arch: str = "amd64") -> bool:
    """Whether a wheel with compatibility ``tag`` installs on CPython ``python`` on Linux on
    ``arch`` (GOARCH: amd64 is x86_64 in a wheel tag, arm64 is aarch64)."""
    machine = WHEEL_MACHINE[arch]
    release = comparable(python).release
    major, minor = release[0], release[1] if len(release) > 1 else 0
    for item in parse_tag(tag):
        interpreter, abi, platform = item.interpreter, item.abi, item.platform
        fits_python = interpreter in (f"cp{major}{minor}", f"py{major}", f"py{major}{minor}") or (
            abi == "abi3" and interpreter.startswith(f"cp{major}")
            and int(interpreter[3:] or 0) <= minor)
        fits_platform = platform == "any" or platform.endswith(machine)
        if fits_python and fits_platform:
            return True
    return False


def check_wheel_tags(stack: Stack, rule: Rule) -> list[Violation]:
    """Every pinned wheel's tags must fit the stack's Python (an sdist has none to check)."""
    python = stack.versions().get("python")
    violations = []
    for layer, name, pin in _pip_pins(stack):
        tag = pin.get("tag")
        if python and tag and tag != "sdist" and not wheel_fits(tag, python, stack.arch):
            detail = (f"{layer.label} pins the {name} {pin['version']} wheel tagged {tag}, "
                      f"which does not install on Python {python} "
                      f"({WHEEL_MACHINE[stack.arch]} Linux, the stack's {stack.platform})")
            violations.append(Violation(stack, rule, layer.label, "python", python, (tag,),
                                        detail, f"{PYPI_SIMPLE}/{name}/"))
    return violations


def check_gpu_arch(stack: Stack, rule: Rule) -> list[Violation]:
    """Every target instance's GPU must be one the stack's CUDA release can compile for."""
    from matrix.model import cuda_arch

    cuda = cuda_arch.stack_cuda(stack)
    if not cuda:
        return []
    violations = []
    for instance in stack.instances:
        model = cuda_arch.gpu_model(instance)
        if not model:
            continue  # no NVIDIA GPU: the pairwise rule cuda-stack-needs-gpu-instance speaks
        cc = cuda_arch.compute_capability(model)
        reason = cuda_arch.unsupported_reason(cc, cuda)
        if reason:
            detail = (f"instance {instance} has {model} GPUs (compute capability {cc}), which "
                      f"CUDA {cuda} cannot compile for: {reason}")
            violations.append(Violation(stack, rule, f"instance {instance}", "cuda", cuda,
                                        (f"a CUDA release that targets {model}",), detail,
                                        cuda_arch.ARCH_SUPPORT[cc].source))
    return violations


def check_instance_platform(stack: Stack, rule: Rule) -> list[Violation]:
    """Every target instance type's CPU architecture must be the stack's platform's."""
    violations = []
    for row in _instance_rows(stack):
        if row.arch != stack.arch:
            detail = (f"instance {row.name} is {row.arch}; the stack is built for "
                      f"{stack.platform}")
            violations.append(Violation(stack, rule, f"instance {row.name}", "platform",
                                        stack.platform, (f"linux/{row.arch}",), detail,
                                        f"matrix/model/instances.yaml {row.name} arch"))
    return violations


CI_RUNNER_CLASS = "ci-runner-platform"


def known_runners(rules: tuple[Rule, ...] | None = None) -> dict[str, str]:
    """Every GitHub Actions runner label a stack's ``ci.runner`` may name, with the architecture
    (GOARCH) GitHub runs its jobs on: the ci-runner-platform class's data in rules.yaml."""
    rule = next(r for r in (rules if rules is not None else load_rules())
                if r.id == CI_RUNNER_CLASS)
    return dict(rule.data["runners"])


def check_ci_runner_platform(stack: Stack, rule: Rule) -> list[Violation]:
    """The runner that builds and tests a stack natively (publish.yml runs each stack on its
    ``ci.runner``) must be of the stack's platform's architecture."""
    runners: dict[str, str] = rule.data["runners"]
    if stack.ci_runner is None:
        return []
    arch = runners.get(stack.ci_runner)
    if arch == stack.arch:
        return []
    fitting = sorted(label for label, other in runners.items() if other == stack.arch)
    what = f"runs jobs on {arch}" if arch else "is not a runner label the class knows"
    detail = (f"ci.runner {stack.ci_runner} {what}; the stack is built for {stack.platform} "
              f"(runners of {stack.platform}: {', '.join(fitting) or 'none known'})")
    return [Violation(stack, rule, f"ci.runner {stack.ci_runner}", "platform", stack.platform,
                      (f"linux/{arch}",) if arch else (), detail,
                      f"matrix/model/rules.yaml {CI_RUNNER_CLASS} runners")]


CLASS_CHECKS: dict[str, Callable[[Stack, Rule], list[Violation]]] = {
    "build-requires": check_build_requires,
    "os-release": check_os,
    "cuda-build": check_cuda,
    "cxx-standard": check_cxx_standard,
    "pip-requires-python": check_requires_python,
    "pip-wheel-tags": check_wheel_tags,
    "gpu-arch": check_gpu_arch,
    "instance-platform": check_instance_platform,
    CI_RUNNER_CLASS: check_ci_runner_platform,
    **layer_classes.CHECKS,
}


# --- entry points ------------------------------------------------------------------------------

def check_stack(stack: Stack, rules: tuple[Rule, ...] | None = None) -> list[Violation]:
    """All rule violations of one stack, recommended ones included (see :attr:`Violation.blocking`)."""
    versions = stack.versions()
    violations: list[Violation] = []
    for rule in rules if rules is not None else load_rules():
        if rule.kind == "class":
            violations += CLASS_CHECKS[rule.id](stack, rule)
        else:
            violations += _check_pairwise(stack, rule, versions)
    return violations


def blocking(violations: list[Violation]) -> list[Violation]:
    return [v for v in violations if v.blocking]


def check_matrix(matrix: Matrix) -> dict[str, list[Violation]]:
    """Blocking violations of every stack in ``matrix``."""
    return {name: blocking(check_stack(stack)) for name, stack in matrix.stacks.items()}


def require_valid(matrix: Matrix, names: list[str]) -> None:
    """Refuse to go on when any named stack breaks a rule: every violation, on one line."""
    for name in names:
        violations = blocking(check_stack(matrix.stack(name)))
        if violations:
            raise UserError(" | ".join(str(v) for v in violations))


__all__ = ["Rule", "Violation", "check_matrix", "check_stack", "instance_has", "known_runners",
           "load_rules", "require_valid", "wheel_fits"]
