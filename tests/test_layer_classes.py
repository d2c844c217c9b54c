"""The rule classes over what a layer needs from its stack (matrix/model/layer_classes.py): each
rejects a stacks file that breaks it, through the command a user runs, in one line naming the
rule and the component; the declared stacks pass them (tests/test_rules.py,
test_project_stacks_are_all_valid); `invoke stacks` says which class fired."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from matrix.errors import UserError
from matrix.model.loader import load_matrix
from matrix.model.rules import check_stack, load_rules
from tests.test_rules import fact_stack, render_fails

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
CLASSES = {rule.id: rule for rule in load_rules() if rule.kind == "class"}


def project() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "stacks.yaml").read_text(encoding="utf-8"))


def add_version(data: dict[str, Any], component: str, like: str, new: str,
                drop: tuple[str, ...] = (), **changes: Any) -> None:
    """A copy of ``component`` ``like`` as version ``new``, without the facts in ``drop``."""
    entry = copy.deepcopy(data["components"][component]["versions"][like])
    for fact in drop:
        entry.pop(fact, None)
        entry.get("sources", {}).pop(fact, None)
    if entry.get("sources") == {}:
        del entry["sources"]
    entry.update(changes)
    data["components"][component]["versions"][new] = entry


def with_stack(tmp_path: Path, data: dict[str, Any], name: str, like: str,
               layers: list[dict[str, str]]) -> Path:
    """``data`` plus a stack ``name`` like ``like`` with ``layers``, written to a stacks file."""
    stack = copy.deepcopy(data["stacks"][like])
    stack["layers"] = layers
    stack.pop("ci", None)
    data["stacks"][name] = stack
    path = tmp_path / "stacks.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def layers_of(data: dict[str, Any], stack: str) -> list[dict[str, str]]:
    return copy.deepcopy(data["stacks"][stack]["layers"])


def swap(layers: list[dict[str, str]], component: str, version: str) -> list[dict[str, str]]:
    return [{component: version} if component in layer else layer for layer in layers]


# --- component-needs -------------------------------------------------------------------------

def test_deepspeed_in_a_stack_without_pytorch_is_rejected(tmp_path):
    """A DeepSpeed version declared without `requires` still needs PyTorch below it."""
    data = project()
    add_version(data, "deepspeed", "0.14.4", "0.14.9", drop=("requires",))
    layers = layers_of(data, "cpu-mpi")
    layers.insert(-1, {"deepspeed": "0.14.9"})
    line = render_fails(tmp_path, with_stack(tmp_path, data, "mpi-ds", "cpu-mpi", layers))
    assert ("stack mpi-ds: deepspeed 0.14.9 needs pytorch below it in the stack, but neither "
            "the base debian-12 nor a layer provides it") in line
    assert "[rule component-needs;" in line
    assert "DeepSpeed/blob/master/requirements/requirements.txt" in line


def test_nccl_tests_below_its_nccl_is_rejected(tmp_path):
    """Order matters: nccl-tests under the NCCL layer does not see it at build time."""
    data = project()
    add_version(data, "nccl-tests", "2.17.6", "2.17.7", drop=("requires",))
    layers = [x for x in layers_of(data, "cuda13.2-efa") if "nccl-tests" not in x]
    layers.insert(3, {"nccl-tests": "2.17.7"})  # above cuda, below pytorch, nccl and efa
    stacks = with_stack(tmp_path, data, "early", "cuda13.2-efa", layers)
    line = render_fails(tmp_path, stacks)
    assert ("stack early: nccl-tests 2.17.7 needs nccl below it in the stack, but nccl 2.30.7 "
            "comes after it") in line
    assert "[rule component-needs;" in line and "nccl-tests/blob/master/README.md" in line
    found = check_stack(load_matrix(stacks).stack("early"), (CLASSES["component-needs"],))
    assert [v.component for v in found] == ["nccl", "mpi"]
    assert "needs mpi (openmpi, mpich, intel-mpi) below it in the stack, but efa 1.50.0 comes " \
           "after it" in str(found[1])


def _tests_before_mpi(mpi: bool):
    """cuda13.2-tcp with nccl-tests (no `requires`) between its NCCL and its Open MPI."""
    data = project()
    options = {"prefix": "/opt/nccl-tests", "nccl_home": "/opt/nccl"}
    options.update({} if not mpi else {"mpi_home": "/usr/lib/x86_64-linux-gnu/openmpi"})
    add_version(data, "nccl-tests", "2.17.6", "2.17.7", drop=("requires",),
                options={**options, **({} if mpi else {"mpi": False})})
    layers = layers_of(data, "cuda13.2-tcp")
    layers.insert(5, {"nccl-tests": "2.17.7"})
    return data, layers


def test_nccl_tests_built_without_mpi_need_no_mpi(tmp_path):
    data, layers = _tests_before_mpi(mpi=False)
    matrix = load_matrix(with_stack(tmp_path, data, "nompi", "cuda13.2-tcp", layers))
    rule = CLASSES["component-needs"]
    assert check_stack(matrix.stack("nompi"), (rule,)) == []
    data, layers = _tests_before_mpi(mpi=True)
    matrix = load_matrix(with_stack(tmp_path, data, "mpi", "cuda13.2-tcp", layers))
    (violation,) = check_stack(matrix.stack("mpi"), (rule,))
    assert "nccl-tests 2.17.7 needs mpi" in str(violation)
    assert "openmpi 4.1.4 comes after it" in str(violation)


def test_nccl_tests_without_mpi_render_without_mpi(tmp_path):
    from matrix.image.render import render_layer

    data, layers = _tests_before_mpi(mpi=False)
    stack = load_matrix(with_stack(tmp_path, data, "nompi", "cuda13.2-tcp", layers)).stack("nompi")
    text = render_layer(stack.layer("nccl-tests"), "parent:1", stack.base, stack.fabric,
                        cuda_archs=("9.0",))
    assert "make -j\"$(nproc)\" NCCL_HOME=/opt/nccl" in text and "MPI=1" not in text


# --- distribution-family ---------------------------------------------------------------------

def test_ubuntu_pins_on_the_debian_base_are_rejected(tmp_path):
    """pdsh 2.31 (Ubuntu's 2.31-3build2, no `os` fact) in the Debian cpu-tcp stack."""
    data = project()
    layers = swap(layers_of(data, "cpu-tcp"), "pdsh", "2.31")
    line = render_fails(tmp_path, with_stack(tmp_path, data, "mixed", "cpu-tcp", layers))
    assert ("stack mixed: pdsh 2.31 installs Ubuntu packages through images/pdsh/Dockerfile.j2 "
            "(apt pdsh=2.31-3build2); the base debian-12 is Debian (debian12)") in line
    assert "[rule distribution-family;" in line and "ubuntu-maintainers-handbook" in line


@pytest.mark.parametrize(("spec", "os", "evidence"), [
    ({"apt": {"python3-pydantic": "1.10.4-1+deb12u1"}}, "ubuntu22.04", "+deb12u1"),
    ({"apt": {"python3-dev": "3.11.2-1+b1"}}, "ubuntu22.04", "3.11.2-1+b1"),
    ({"apt": {"python3": "3.6.7-1~18.04"}}, "debian12", "~18.04"),
    ({"options": {"repos": ["https://developer.download.nvidia.com/compute/cuda/repos/"
                            "ubuntu1804/x86_64"]}}, "debian12", "ubuntu1804"),
])
def test_each_distribution_marker_is_read(spec, os, evidence):
    component = "cuda" if "options" in spec else "deepspeed"
    stack = fact_stack([(component, "1.0", spec)], os=os)
    (violation,) = check_stack(stack, (CLASSES["distribution-family"],))
    assert evidence in str(violation)
    same = fact_stack([(component, "1.0", spec)], os="ubuntu18.04" if os == "debian12" else "debian12")
    assert check_stack(same, (CLASSES["distribution-family"],)) == []


def derive_templates() -> dict[str, dict[str, list[str]]]:
    """What each images/<component>/Dockerfile.j2 installs from the distribution, read from the
    template: spec fields apt-installed as name=version pins, and those added as apt repos."""
    pin_loop = re.compile(r"\{% for (\w+), (\w+) in spec\.([\w.]+)\.items\(\) %\}\n\s*"
                          r"\{\{ \1 \}\}=\{\{ \2 \}\}")
    repo_loop = re.compile(r"\{% for (\w+) in spec\.([\w.]+) %\}\n[^\n]*\"deb [^\n]*\{\{ \1 \}\}")
    found = {}
    for template in sorted(IMAGES.glob("*/Dockerfile.j2")):
        if template.parent.name.startswith("_"):
            continue
        text = template.read_text(encoding="utf-8")
        pins = re.findall(r"apt_install\(spec\.([\w.]+)[,)]", text)
        pins += [field for _, _, field in pin_loop.findall(text)]
        repos = [field for _, field in repo_loop.findall(text)]
        entry = {key: sorted(set(v)) for key, v in (("pins", pins), ("repos", repos)) if v}
        found[template.parent.name] = entry
    return found


def test_template_assumptions_are_derived_from_the_templates():
    declared = {name: {k: sorted(v) for k, v in entry.items()}
                for name, entry in CLASSES["distribution-family"].data["templates"].items()}
    assert declared == derive_templates()


# --- cuda13-facts ----------------------------------------------------------------------------

def test_a_cuda13_component_without_its_facts_is_rejected(tmp_path):
    data = project()
    add_version(data, "deepspeed", "0.19.8", "0.19.9", drop=("requires", "os"))
    layers = swap(layers_of(data, "cuda13.2-tcp"), "deepspeed", "0.19.9")
    line = render_fails(tmp_path, with_stack(tmp_path, data, "bare", "cuda13.2-tcp", layers))
    assert ("stack bare: deepspeed 0.19.9 is in a CUDA 13.2.86 stack but its entry in the stacks "
            "file declares no os, cuda, requires (components.deepspeed.versions.0.19.9)") in line
    assert "[rule cuda13-facts;" in line


def test_older_cuda_stacks_are_not_held_to_the_cuda13_facts():
    stack = fact_stack([("nccl-tests", "2.13.6", {})], {"cuda": "12.1.1"})
    assert check_stack(stack, (CLASSES["cuda13-facts"],)) == []


def test_a_pip_pin_without_its_tag_is_named():
    pin = {"pip": {"torch": {"version": "2.15.0", "sha256": "0" * 64}}, "requires": ["python"],
           "cuda": "==13.2.*", "header_cxx_std": 20}
    stack = fact_stack([("pytorch", "2.15.0", pin)], {"cuda": "13.2.86"})
    (violation,) = check_stack(stack, (CLASSES["cuda13-facts"],))
    assert "declares no pip.torch.tag" in str(violation)


# --- pip-needs-pip ----------------------------------------------------------------------------

WITHOUT_PIP = {"version": "3.11.2", "options": {"pip": False}}


def test_a_pip_layer_over_python_without_pip_is_rejected(tmp_path):
    """cpu-tcp's DeepSpeed installs pip pins; its python layer without pip cannot run them."""
    data = project()
    layers = swap(layers_of(data, "cpu-tcp"), "python", WITHOUT_PIP)
    line = render_fails(tmp_path, with_stack(tmp_path, data, "nopip", "cpu-tcp", layers))
    deepspeed = next(x["deepspeed"] for x in layers if "deepspeed" in x)
    assert (f"stack nopip: deepspeed {deepspeed} installs pip pins with python3 -m pip, but "
            "python 3.11.2 below it leaves pip out (its options.pip is false in "
            "stacks/nopip/layers)") in line
    assert "[rule pip-needs-pip;" in line and "packages.debian.org/bookworm/python3-pip" in line


def test_python_without_pip_under_apt_layers_only_is_valid():
    """cpu-tcp-arm64 goes without pip: none of its layers installs pip pins."""
    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack("cpu-tcp-arm64")
    python = next(x for x in stack.layers if x.component == "python")
    assert python.spec["options"] == {"pip": False}
    assert not any(layer.spec.get("pip") for layer in stack.layers)
    assert check_stack(stack, (CLASSES["pip-needs-pip"],)) == []


# --- explained, and the class data checked ------------------------------------------------------

def test_invoke_stacks_says_which_class_fired(tmp_path):
    data = project()
    layers = swap(layers_of(data, "cpu-tcp"), "pdsh", "2.31")
    stacks = with_stack(tmp_path, data, "mixed", "cpu-tcp", layers)
    proc = subprocess.run([sys.executable, "-m", "invoke", "stacks", "--stacks", str(stacks)],
                          cwd=ROOT, capture_output=True, text=True, env={"COLUMNS": "400"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("mixed:")]
    assert line.startswith("mixed: INVALID: pdsh 2.31 installs Ubuntu packages")
    assert "[rule class distribution-family: apt pins and apt repositories" in line


def test_a_class_regex_that_does_not_compile_is_one_line(tmp_path):
    text = (ROOT / "matrix/model/rules.yaml").read_text(encoding="utf-8")
    broken = tmp_path / "rules.yaml"
    broken.write_text(text.replace("'ubuntu[0-9]'", "'ubuntu[0-9'"), encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_rules(broken)
    message = str(info.value)
    assert "\n" not in message and "rule class distribution-family: markers.ubuntu" in message
