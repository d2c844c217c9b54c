"""Compatibility rules: every rule has a passing and a failing case; violations explain themselves."""

from __future__ import annotations

import copy
import itertools
import re
import subprocess
import sys
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from packaging.version import Version

from matrix.errors import UserError
from matrix.model.entities import Base, ComponentVersion, Stack, comparable, matches, specifier
from matrix.model.instances import INSTANCE_TYPES
from matrix.model.loader import load_matrix
from matrix.model.rules import (
    Rule,
    check_matrix,
    check_stack,
    instance_has,
    load_rules,
    require_valid,
)
from matrix.model.violation import ANY_VERSION
from tests.helpers import make_stack, project_matrix

ROOT = Path(__file__).resolve().parent.parent
RULES = load_rules()


_AMZN = re.compile(r"(\d+(?:\.\d+)*)amzn(\d+)\.(\d+)")


def candidates(specs: list[str]) -> list[str]:
    """Versions around every boundary the specifiers mention, to pick examples from."""
    found: set[str] = set()
    for spec in specs:
        for release, major, _minor in _AMZN.findall(spec):  # AWS libfabric builds
            found.update(f"{release}amzn{max(int(major) + d, 0)}.0" for d in (-1, 0, 1))
        for single in specifier(spec):
            if "." in single.version and single.version.count(".") >= 5:
                continue  # an amzn version mapped by model.specifier, covered above
            base = Version(single.version.replace(".*", ""))
            parts = list(base.release) + [0] * (3 - len(base.release))
            for i, delta in itertools.product(range(3), (-1, 0, 1)):
                bumped = parts.copy()
                bumped[i] = max(bumped[i] + delta, 0)
                found.add(".".join(map(str, bumped)))
    return sorted(found, key=comparable)


def pick(inside: list[str], outside: tuple[str, ...] = ()) -> str:
    """A version matching every spec in ``inside`` and none of the ``outside`` alternatives."""
    for version in candidates(inside + list(outside)):
        if all(matches(version, s) for s in inside) and \
                not any(matches(version, s) for s in outside):
            return version
    raise AssertionError(f"no version inside {inside} and outside {outside}")


def _row_meets(row, key: str, alternatives: tuple[str, ...]) -> bool:
    value = getattr(row, key.split(".", 1)[1])
    if isinstance(value, bool):
        return str(value).lower() in alternatives
    return any(matches(str(value), spec) for spec in alternatives)


def _instance_for(rule: Rule, satisfy: bool) -> str:
    """A table instance the rule's instance conditions select, meeting (or failing) its
    instance requirements."""
    rows = list(INSTANCE_TYPES.values())
    for key, wanted in rule.when.items():
        if key == "instance":
            rows = [r for r in rows if fnmatch(r.name, wanted)]
        elif key.startswith("instance."):
            rows = [r for r in rows if instance_has(r, key.split(".", 1)[1], wanted)]
    needs = {k: v for k, v in rule.require.items() if k.startswith("instance.")}
    if needs:
        rows = [r for r in rows
                if all(_row_meets(r, k, v) for k, v in needs.items()) == satisfy]
    assert rows, f"{rule.id}: no instance in the table fits"
    return rows[0].name


def stack_for(rule: Rule, satisfy: bool):
    layers: dict[str, str] = {}
    sources: dict[str, str] = {}
    fabric = rule.when.get("fabric", "tcp")
    fail_instance = any(k.startswith("instance.") for k in rule.require)
    instances = (_instance_for(rule, satisfy or not fail_instance),)
    for key, wanted in rule.when.items():
        if key in ("instance", "fabric") or key.startswith("instance."):
            continue
        if "." in key:
            sources[key.split(".")[0]] = wanted
        elif key not in rule.require:
            layers[key] = pick([wanted])
    for component, alternatives in rule.require.items():
        if component.startswith("instance."):
            continue
        trigger = [rule.when[component]] if component in rule.when else []
        if satisfy or fail_instance:
            layers[component] = pick(trigger + [alternatives[0]])
        elif rule.present and alternatives == (ANY_VERSION,):
            continue  # any version meets it: only its absence fails the rule
        else:
            layers[component] = pick(trigger, alternatives)
    for component in sources:
        layers.setdefault(component, "1.0")
    return replace(make_stack(layers, instances=instances, sources=sources), fabric=fabric)


PAIRWISE = [r for r in RULES if r.kind == "pairwise"]
CLASSES = [r for r in RULES if r.kind == "class"]


@pytest.mark.parametrize("rule", PAIRWISE, ids=[r.id for r in PAIRWISE])
def test_rule_has_passing_case(rule):
    stack = stack_for(rule, satisfy=True)
    assert [v for v in check_stack(stack, (rule,))] == []


@pytest.mark.parametrize("rule", PAIRWISE, ids=[r.id for r in PAIRWISE])
def test_rule_has_failing_case(rule):
    stack = stack_for(rule, satisfy=False)
    violations = check_stack(stack, (rule,))
    assert violations, f"{rule.id} did not fire for {stack.versions()}"
    text = str(violations[0])
    assert rule.id in text and rule.source in text and "stack s" in text


def test_every_rule_names_a_source():
    assert all(len(rule.source) > 10 for rule in RULES)


def test_ofi_nccl_1_10_with_nccl_2_4_8_is_rejected():
    stack = make_stack({"nccl": "2.4.8", "aws-ofi-nccl": "1.10.0", "efa": "1.32.0",
                        "libfabric": "1.20.1amzn1.0"})
    messages = [str(v) for v in check_stack(stack)]
    assert any("aws-ofi-nccl 1.10.0 needs nccl >=2.17.1, found 2.4.8" in m
               and "ofi-nccl-nccl-floor-1.10" in m and "RELEASENOTES" in m for m in messages)


def test_horovod_0_28_1_with_pytorch_2_2_is_rejected():
    stack = make_stack({"pytorch": "2.2.2", "horovod": "0.28.1"}, provides={"cuda": "12.1.1",
                                                                               "python": "3.10.12"})
    messages = [str(v) for v in check_stack(stack)]
    assert any("horovod 0.28.1 needs pytorch <2.1, found 2.2.2" in m and "horovod/issues/3996" in m
               for m in messages)


def test_p5_minimum_missing_component_is_a_violation():
    stack = replace(make_stack({"nccl": "2.21.5"}, provides={"cuda": "12.1.1"},
                               instances=("p5.48xlarge",)), fabric="efa")
    missing = {v.component for v in check_stack(stack) if v.found is None}
    assert {"aws-ofi-nccl", "efa"} <= missing


def test_vendor_versions_compare_by_release():
    stack = make_stack({"nccl": "2.21.5", "aws-ofi-nccl": "1.9.2-aws", "efa": "1.32.0"},
                       provides={"libfabric": "1.18.0amzn1.0"})
    assert check_stack(stack) == []
    older = make_stack({"nccl": "2.21.5", "aws-ofi-nccl": "1.9.2-aws", "efa": "1.32.0"},
                       provides={"libfabric": "1.17.0amzn2.0"})
    assert [v.rule.id for v in check_stack(older)] == ["ofi-nccl-libfabric-1.8"]


def test_debian_torch_is_exempt_from_wheel_python_rule():
    debian = make_stack({"pytorch": "1.13.1"}, provides={"python": "3.11.2"},
                        sources={"pytorch": "apt"})
    wheel = make_stack({"pytorch": "1.13.1"}, provides={"python": "3.11.2"},
                       sources={"pytorch": "pip"})
    assert check_stack(debian) == []
    assert [v.rule.id for v in check_stack(wheel)] == ["pytorch-1.12-1.13-python"]


def test_project_stacks_are_all_valid():
    matrix = load_matrix(ROOT / "stacks.yaml")
    assert {name: [str(v) for v in vs] for name, vs in check_matrix(matrix).items() if vs} == {}


def variant(tmp_path: Path, component: str, new_version: str, like: str, stack: str,
            name: str) -> Path:
    """The project's stacks file plus a copy of ``stack`` that uses ``component`` at a new
    version (its entry copied from version ``like``)."""
    data = yaml.safe_load((ROOT / "stacks.yaml").read_text(encoding="utf-8"))
    versions = data["components"][component]["versions"]
    versions[new_version] = copy.deepcopy(versions[like])
    clone = copy.deepcopy(data["stacks"][stack])
    clone["layers"] = [{k: (new_version if k == component else v) for k, v in layer.items()}
                       for layer in clone["layers"]]
    data["stacks"][name] = clone
    path = tmp_path / "stacks.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def render_fails(tmp_path: Path, stacks: Path) -> str:
    """Run `invoke render --all` on ``stacks``: it must fail with one line and write nothing."""
    proc = subprocess.run([sys.executable, "-m", "invoke", "render", "--all", "--stacks",
                           str(stacks)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "generated").exists()
    return lines[0]


def test_ofi_1_10_with_nccl_2_4_8_is_rejected_before_rendering(tmp_path):
    stacks = variant(tmp_path, "aws-ofi-nccl", "1.10.0", "1.6.0", "cuda10.1-efa", "bad-ofi")
    line = render_fails(tmp_path, stacks)
    assert "stack bad-ofi: aws-ofi-nccl 1.10.0 needs nccl >=2.17.1, found 2.4.8" in line
    assert ("[rule ofi-nccl-nccl-floor-1.10; source: "
            "https://github.com/aws/aws-ofi-nccl/blob/v1.14.0/RELEASENOTES.md") in line


def test_horovod_0_28_1_with_pytorch_2_2_is_rejected_before_rendering(tmp_path):
    stacks = variant(tmp_path, "pytorch", "2.2.2", "2.0.1", "cuda11.7-efa", "bad-hvd")
    line = render_fails(tmp_path, stacks)
    assert "stack bad-hvd: horovod 0.28.1 needs pytorch <2.1, found 2.2.2" in line
    assert "[rule horovod-0.28.1-pytorch-2.1; source: https://github.com/horovod/horovod/issues/3996" in line


def test_require_valid_raises_one_line():
    stack = make_stack({"pytorch": "2.2.2", "horovod": "0.28.1"})
    matrix = SimpleNamespace(stacks={"s": stack}, stack=lambda name: stack)
    with pytest.raises(UserError) as info:
        require_valid(matrix, ["s"])
    assert "\n" not in str(info.value)


# --- rule classes over component facts ---------------------------------------------------------

def fact_stack(layers: list[tuple[str, str, dict]], provides: dict[str, str] | None = None,
               os: str = "ubuntu22.04", name: str = "s",
               instances: tuple[str, ...] = ("c5n.18xlarge",)) -> Stack:
    """A stack whose layers carry the given facts (spec dicts as stacks.yaml writes them)."""
    base = Base(name="b", image="example/base:1", os=os, provides=provides or {})
    cvs = tuple(ComponentVersion(c, v, {"source": "download", **spec}) for c, v, spec in layers)
    return Stack(name=name, description="test", base=base, layers=cvs, instances=instances,
                 fabric="tcp", where=f"stacks.yaml:{name}")


def _pin(**facts: str) -> dict:
    return {"pip": {"example": {"version": "1.0", "sha256": "0" * 64, **facts}}}


# One passing and one failing stack per class, built from the class's fact.
CLASS_CASES = {
    "build-requires": (
        fact_stack([("nccl", "2.16.2", {"requires": ["cuda"]})], {"cuda": "11.7.1"}),
        fact_stack([("nccl", "2.16.2", {"requires": ["cuda"]}), ("cuda", "11.7.1", {})]),
    ),
    "os-release": (
        fact_stack([("efa", "1.23.0", {"os": ["ubuntu20.04", "ubuntu22.04"]})], os="ubuntu22.04"),
        fact_stack([("efa", "1.23.0", {"os": ["ubuntu20.04", "ubuntu22.04"]})], os="ubuntu18.04"),
    ),
    "cuda-build": (
        fact_stack([("pytorch", "2.0.1", {"cuda": "==11.7.*"})], {"cuda": "11.7.1"}),
        fact_stack([("pytorch", "2.0.1", {"cuda": "==11.7.*"})], {"cuda": "12.1.1"}),
    ),
    "cxx-standard": (
        fact_stack([("pytorch", "2.0.1", {"header_cxx_std": 14}),
                    ("horovod", "0.28.1", {"requires": ["pytorch"], "cxx_std": 14})]),
        fact_stack([("pytorch", "2.3.1", {"header_cxx_std": 17}),
                    ("horovod", "0.28.1", {"requires": ["pytorch"], "cxx_std": 14})]),
    ),
    "pip-requires-python": (
        fact_stack([("deepspeed", "0.14.5", _pin(requires_python=">=3.8"))], {"python": "3.10.12"}),
        fact_stack([("deepspeed", "0.14.5", _pin(requires_python=">=3.8"))], {"python": "3.6.9"}),
    ),
    "pip-wheel-tags": (
        fact_stack([("pytorch", "2.0.1", _pin(tag="cp310-cp310-manylinux1_x86_64"))],
                   {"python": "3.10.12"}),
        fact_stack([("pytorch", "2.0.1", _pin(tag="cp310-cp310-manylinux1_x86_64"))],
                   {"python": "3.11.2"}),
    ),
    "gpu-arch": (
        fact_stack([], {"cuda": "11.7.1"}, instances=("p4d.24xlarge",)),
        fact_stack([], {"cuda": "10.1.243"}, instances=("p4d.24xlarge",)),
    ),
    # Versions with no `requires`: the component's own needs, in stack order.
    "component-needs": (
        fact_stack([("pytorch", "2.0.1", {}), ("deepspeed", "0.14.5", {})], {"python": "3.10"}),
        fact_stack([("deepspeed", "0.14.5", {}), ("pytorch", "2.0.1", {})], {"python": "3.10"}),
    ),
    "distribution-family": (
        fact_stack([("pdsh", "2.31", {"apt": {"pdsh": "2.31-3build2"}})], os="ubuntu22.04"),
        fact_stack([("pdsh", "2.31", {"apt": {"pdsh": "2.31-3build2"}})], os="debian12"),
    ),
    "cuda13-facts": (
        fact_stack([("nccl-tests", "2.17.6", {"requires": ["cuda"]})], {"cuda": "13.2.86"}),
        fact_stack([("nccl-tests", "2.17.6", {})], {"cuda": "13.2.86"}),
    ),
    # pip pins above a python layer with pip, and above one a stack gave options.pip false
    "pip-needs-pip": (
        fact_stack([("python", "3.11.2", {}), ("deepspeed", "0.14.5", _pin())]),
        fact_stack([("python", "3.11.2", {"options": {"pip": False}}),
                    ("deepspeed", "0.14.5", _pin())]),
    ),
    # an amd64 stack (the default platform) on an x86 type, and on a Graviton one
    "instance-platform": (
        fact_stack([], instances=("c5n.18xlarge",)),
        fact_stack([], instances=("c7gn.16xlarge",)),
    ),
    # an amd64 stack built by the x64 runner, and by GitHub's arm64 one
    "ci-runner-platform": (
        replace(fact_stack([]), ci_runner="ubuntu-24.04"),
        replace(fact_stack([]), ci_runner="ubuntu-24.04-arm"),
    ),
}


def test_every_class_has_cases():
    assert {rule.id for rule in CLASSES} == set(CLASS_CASES)


@pytest.mark.parametrize("rule", CLASSES, ids=[r.id for r in CLASSES])
def test_class_has_passing_and_failing_case(rule):
    passing, failing = CLASS_CASES[rule.id]
    assert check_stack(passing, (rule,)) == []
    violations = check_stack(failing, (rule,))
    assert violations, rule.id
    text = str(violations[0])
    assert rule.id in text and rule.source in text and "stack s" in text


def test_missing_build_requirement_names_what_is_missing():
    (violation,) = check_stack(CLASS_CASES["build-requires"][1], (_class("build-requires"),))
    assert "nccl 2.16.2 builds against cuda, but neither the base b nor a layer before it " \
           "provides cuda" in str(violation)


def test_build_requirement_version_is_checked():
    stack = fact_stack([("aws-ofi-nccl", "1.6.0", {"requires": ["libfabric>=1.11.0"]})],
                       {"libfabric": "1.9.0"})
    (violation,) = check_stack(stack, (_class("build-requires"),))
    assert "libfabric>=1.11.0" in str(violation) and "1.9.0" in str(violation)


def _class(rule_id: str) -> Rule:
    return next(rule for rule in CLASSES if rule.id == rule_id)


# Failing cases generated from every fact the project's stacks.yaml declares.
MATRIX = project_matrix()
LAYERS = {(layer.component, layer.version): (stack, layer)
          for stack in MATRIX.stacks.values() for layer in stack.layers}


def _with_base(stack: Stack, **changes) -> Stack:
    return replace(stack, base=replace(stack.base, **changes))


def _generated_failures():
    for (component, version), (stack, layer) in sorted(LAYERS.items()):
        label = f"{component}-{version}"
        if layer.spec.get("os"):
            yield f"os:{label}", _with_base(stack, os="ubuntu12.04"), "os-release"
        if layer.spec.get("cuda"):
            cuda = pick([">=0"], (layer.spec["cuda"],))
            provides = {k: v for k, v in stack.base.provides.items() if k != "cuda"}
            layers = tuple(replace(other, spec={**other.spec, "provides": {**other.spec.get("provides", {}),
                                                                   "cuda": cuda}})
                           if other.component == "cuda" else other for other in stack.layers)
            yield (f"cuda:{label}", replace(_with_base(stack, provides={**provides, "cuda": cuda}),
                                            layers=layers), "cuda-build")
        for entry in layer.spec.get("requires", []):
            name = re.match(r"[a-z0-9.-]+", entry).group(0)
            index = stack.layers.index(layer)
            kept = tuple(other for i, other in enumerate(stack.layers)
                         if i >= index or (other.component != name
                                           and name not in other.spec.get("provides", {})))
            provides = {k: v for k, v in stack.base.provides.items() if k != name}
            yield (f"requires:{label}:{name}", replace(_with_base(stack, provides=provides),
                                                       layers=kept), "build-requires")
        for pin_name, pin in (layer.spec.get("pip") or {}).items():
            if pin.get("requires_python"):
                python = pick([">=2.7"], (pin["requires_python"],))
                yield (f"python:{label}:{pin_name}",
                       _python(stack, python), "pip-requires-python")
            if pin.get("tag", "sdist") != "sdist" and "py3-none" not in pin["tag"] \
                    and "abi3" not in pin["tag"]:
                yield f"tag:{label}:{pin_name}", _python(stack, "3.99.0"), "pip-wheel-tags"


def _python(stack: Stack, python: str) -> Stack:
    layers = tuple(replace(other, version=python) if other.component == "python" else other
                   for other in stack.layers)
    return replace(_with_base(stack, provides={**stack.base.provides, "python": python}),
                   layers=layers)


GENERATED_FAILURES = list(_generated_failures())


@pytest.mark.parametrize(("case", "stack", "rule_id"), GENERATED_FAILURES,
                         ids=[case for case, _, _ in GENERATED_FAILURES])
def test_every_declared_fact_can_fail(case, stack, rule_id):
    assert rule_id in {v.rule.id for v in check_stack(stack)}, case


def test_generated_failures_cover_every_fact_class():
    assert {rule_id for _, _, rule_id in GENERATED_FAILURES} >= {
        "os-release", "cuda-build", "build-requires", "pip-requires-python", "pip-wheel-tags"}


@pytest.mark.parametrize(("lower", "higher"), [
    ("1.22.0", "1.22.0amzn1.0"), ("1.22.0amzn3.0", "1.22.0amzn4.0"), ("1.22.0amzn4.0", "1.22.1"),
    ("1.16.0~amzn4.0", "1.16.0"), ("1.15.1amzn1.0", "1.16.0~amzn1.0"), ("1.7.3-aws", "1.7.4"),
])
def test_aws_libfabric_versions_order(lower, higher):
    assert comparable(lower) < comparable(higher)


def test_rules_can_name_amzn_versions():
    assert not matches("1.22.0amzn3.0", ">=1.22.0amzn4.0")
    assert matches("2.1.0amzn3.0", ">=1.22.0amzn4.0")


# --- issue 16 item 9: impossible stacks the rules used to let through -------------------------

def _ids_of(stack: Stack) -> set[str]:
    return {v.rule.id for v in check_stack(stack) if v.blocking}


@pytest.mark.parametrize(("cuda", "instance", "gpu", "reason"), [
    ("10.1.243", "p4d.24xlarge", "A100", "sm_80 needs CUDA 11.0 or newer"),
    ("13.2.86", "p3dn.24xlarge", "V100", "CUDA 13.0 dropped sm_70"),
    ("13.2.86", "p3.16xlarge", "V100", "CUDA 13.0 dropped sm_70"),
    ("12.1.1", "p6-b200.48xlarge", "B200", "sm_100 needs CUDA 12.8 or newer"),
    ("11.7.1", "p5.48xlarge", "H100", "sm_90 needs CUDA 11.8 or newer"),
    ("11.0.3", "g5.48xlarge", "A10G", "sm_86 needs CUDA 11.1 or newer"),
])
def test_a_gpu_the_cuda_cannot_target_is_a_violation(cuda, instance, gpu, reason):
    stack = fact_stack([], {"cuda": cuda}, instances=(instance,))
    (violation,) = [v for v in check_stack(stack, (_class("gpu-arch"),))]
    text = str(violation)
    assert f"instance {instance} has {gpu} GPUs" in text and reason in text
    assert "docs.nvidia.com/cuda/archive/" in text and "[rule gpu-arch;" in text


def test_every_gpu_the_cuda_can_target_passes():
    # 12.9: the first CUDA whose nvcc targets every GPU of the table (B300's sm_103 is new in it,
    # V100's sm_70 is dropped only in 13.0)
    for instance, row in INSTANCE_TYPES.items():
        if row.gpus and row.gpu_model:
            assert check_stack(fact_stack([], {"cuda": "12.9.0"}, instances=(instance,)),
                               (_class("gpu-arch"),)) == [], instance


def retarget(tmp_path: Path, stack: str, instances: list[str], name: str,
             drop: tuple[str, ...] = ()) -> Path:
    """The project's stacks file plus a copy of ``stack`` aimed at other instances (and without
    the ``drop`` layers)."""
    data = yaml.safe_load((ROOT / "stacks.yaml").read_text(encoding="utf-8"))
    clone = copy.deepcopy(data["stacks"][stack])
    clone["instances"] = instances
    clone["layers"] = [layer for layer in clone["layers"] if not set(layer) & set(drop)]
    clone.pop("ci", None)
    data["stacks"][name] = clone
    path = tmp_path / "stacks.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_cuda10_1_on_p4d_is_rejected_before_rendering(tmp_path):
    line = render_fails(tmp_path, retarget(tmp_path, "cuda10.1-tcp", ["p4d.24xlarge"], "old-p4d"))
    assert "stack old-p4d: instance p4d.24xlarge has A100 GPUs" in line
    assert "CUDA 10.1.243 cannot compile for: sm_80 needs CUDA 11.0 or newer" in line
    assert "[rule gpu-arch;" in line and "archive/11.0/cuda-toolkit-release-notes" in line


def test_cuda13_2_on_p3dn_is_a_rule_not_a_template_error(tmp_path):
    """Issue 16 items 6 and 9: it used to pass the rules and crash in a template."""
    line = render_fails(tmp_path, retarget(tmp_path, "cuda13.2-tcp", ["p3dn.24xlarge"], "v100"))
    assert "stack v100: instance p3dn.24xlarge has V100 GPUs" in line
    assert "CUDA 13.0 dropped sm_70" in line and "no element" not in line


def test_planning_a_sibling_of_an_impossible_stack_fails_in_one_line(tmp_path):
    """The family's GPUs decide what shared layers compile for: a sibling's V100 that CUDA 13
    cannot target is named, not silently dropped."""
    from matrix.model.cuda_arch import family_archs

    matrix = load_matrix(retarget(tmp_path, "cuda13.2-tcp", ["p3.16xlarge"], "v100"))
    with pytest.raises(UserError) as info:
        family_archs(matrix, matrix.stack("cuda13.2-tcp"))
    message = str(info.value)
    assert "\n" not in message and "stack cuda13.2-tcp" in message
    assert "instance p3.16xlarge (stack v100" in message and "CUDA 13.0 dropped sm_70" in message


def test_cuda13_2_deepspeed_without_pytorch_is_rejected(tmp_path):
    line = render_fails(tmp_path, retarget(tmp_path, "cuda13.2-tcp", ["g5.48xlarge"], "nopt",
                                           drop=("pytorch", "nccl")))
    assert "stack nopt: deepspeed 0.19.8 builds against pytorch, but neither the base" in line
    assert "[rule build-requires;" in line and "DeepSpeed/blob/v0.19.8/setup.py" in line


def test_nccl_tests_without_mpi_is_rejected():
    matrix = load_matrix(ROOT / "stacks.yaml")
    efa = matrix.stack("cuda13.2-efa")
    no_mpi = replace(efa, layers=tuple(
        replace(x, spec={**x.spec, "provides": {k: v for k, v in x.spec["provides"].items()
                                                if k != "openmpi"}})
        if x.component == "efa" else x for x in efa.layers))
    messages = [str(v) for v in blocking_of(no_mpi)]
    assert any("nccl-tests 2.17.6 builds against openmpi" in m for m in messages), messages


def test_nccl_tests_before_mpi_is_rejected():
    matrix = load_matrix(ROOT / "stacks.yaml")
    efa = matrix.stack("cuda13.2-efa")
    tests_layer = efa.layer("nccl-tests")
    others = [x for x in efa.layers if x.component != "nccl-tests"]
    early = replace(efa, layers=tuple(others[:3] + [tests_layer] + others[3:]))
    ids = {v.rule.id for v in blocking_of(early)}
    assert "build-requires" in ids
    assert any("nccl-tests 2.17.6 builds against" in str(v) for v in blocking_of(early))


def blocking_of(stack: Stack):
    return [v for v in check_stack(stack) if v.blocking]


def test_cuda13_2_facts_are_declared():
    """Every cuda13.2 component carries the facts the rule classes read."""
    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack("cuda13.2-efa")
    facts = {x.component: x.spec for x in stack.layers}
    assert {"pytorch", "python", "cuda"} <= set(facts["deepspeed"]["requires"])
    assert {"cuda", "nccl", "openmpi"} <= set(facts["nccl-tests"]["requires"])
    assert facts["nccl"]["requires"] and facts["nccl"]["cuda"]
    assert facts["cuda"]["os"] == ["debian12"]
    assert facts["pytorch"]["cuda"] == "==13.2.*" and facts["pytorch"]["header_cxx_std"] == 20
    assert facts["pytorch"]["requires"] == ["python"]


def test_cuda13_2_components_on_another_cuda_or_os_are_rejected():
    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack("cuda13.2-tcp")
    ubuntu = replace(stack, base=replace(stack.base, os="ubuntu22.04"))
    assert any("cuda 13.2.86 supports debian12" in str(v) for v in blocking_of(ubuntu))
    older = replace(stack, layers=tuple(
        replace(x, spec={**x.spec, "provides": {"cuda": "12.8.0"}}) if x.component == "cuda" else x
        for x in stack.layers))
    found = " ".join(str(v) for v in blocking_of(older))
    assert "pytorch 2.15.0 is built for CUDA ==13.2.*; the stack has CUDA 12.8.0" in found


@pytest.mark.parametrize(("plugin", "cuda", "rejected"), [
    ("1.7.1", "11.2.2", True), ("1.7.1", "11.3.0", False), ("1.7.2", "11.2.2", False),
    ("1.7.0", "11.2.2", False),
])
def test_ofi_nccl_1_7_1_needs_cuda_11_3(plugin, cuda, rejected):
    stack = make_stack({"aws-ofi-nccl": plugin}, provides={"cuda": cuda})
    assert ("ofi-nccl-1.7.1-cuda-floor" in _ids_of(stack)) == rejected
