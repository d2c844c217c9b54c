"""The audit's wrong facts (issue 9, facts 2-5) stay fixed: each test failed on the old matrix."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from matrix.model.loader import load_matrix
from matrix.model.rules import blocking, check_stack
from tests.helpers import make_stack, stacks_yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = stacks_yaml()
GENERATED = ROOT / "images" / "generated"
DS_COMMIT = "8385a1fb4a6e436ae2db6aab47becae1d130e2ac"


def _version(component: str, version: str) -> dict:
    return DATA["components"][component]["versions"][version]


def _ids(stack) -> list[str]:
    return [v.rule.id for v in blocking(check_stack(stack))]


# --- fact 2: deepspeed-habana 1.6.0 ----------------------------------------------------------

def test_deepspeed_habana_points_at_the_deepspeed_old_commit_archive():
    spec = _version("deepspeed-habana", "1.6.0")
    url = spec["options"]["archive_url"]
    assert url == f"https://github.com/HabanaAI/deepspeed_old/archive/{DS_COMMIT}.tar.gz"
    assert "download" not in spec or spec["download"]["url"] == url


def test_deepspeed_habana_layer_fails_closed_with_the_instruction():
    dockerfile = next((GENERATED / "synapseai1.6-efa").glob("*-deepspeed-habana.Dockerfile"))
    text = dockerfile.read_text(encoding="utf-8")
    if "download" in _version("deepspeed-habana", "1.6.0"):
        assert "sha256sum" in text or "sha256" in text
        return
    assert "exit 1" in text
    assert f"deepspeed_old/archive/{DS_COMMIT}.tar.gz" in text
    assert "invoke pin --check" in text
    assert "refs/tags/1.6.0" not in text


# --- fact 3: rule and note fixes -------------------------------------------------------------

def test_efa_1_29_0_is_enough_for_nccl_2_19():
    """The cheatsheet says efa-installer>=1.29.0 (the old rule asked for 1.29.1)."""
    stack = replace(make_stack({"nccl": "2.19.3", "efa": "1.29.0"}), fabric="efa")
    assert "nccl-2.19-efa-installer" not in _ids(stack)
    older = replace(make_stack({"nccl": "2.19.3", "efa": "1.28.0"}), fabric="efa")
    assert "nccl-2.19-efa-installer" in _ids(older)


def test_synapseai_1_7_1_ships_pytorch_1_13_0():
    good = make_stack({"synapseai": "1.7.1", "pytorch": "1.13.0", "efa": "1.19.0",
                       "deepspeed-habana": "1.7.1"}, instances=("dl1.24xlarge",),
                      provides={"python": "3.8"})
    assert _ids(good) == []
    old_pairing = make_stack({"synapseai": "1.7.1", "pytorch": "1.12.0", "efa": "1.19.0",
                              "deepspeed-habana": "1.7.1"}, instances=("dl1.24xlarge",),
                             provides={"python": "3.8"})
    assert _ids(old_pairing) == ["synapseai-1.7.1"]


def test_p5_recommended_versions_do_not_block_but_are_reported():
    stack = replace(make_stack({"nccl": "2.18.1", "aws-ofi-nccl": "1.7.2", "efa": "1.29.0"},
                               provides={"cuda": "12.1.1", "libfabric": "1.18.0amzn1.0"},
                               instances=("p5.48xlarge",)),
                    fabric="efa")
    assert _ids(stack) == []
    advice = [v for v in check_stack(stack) if not v.blocking]
    assert {v.rule.id for v in advice} == {"p5-efa-recommended"}
    assert all("recommended, not required" in str(v) for v in advice)
    below_minimum = replace(stack, layers=tuple(
        replace(layer, version="2.17.1") if layer.component == "nccl" else layer
        for layer in stack.layers))
    assert "p5-efa-minimums" in _ids(below_minimum)


def test_libfabric_amzn_builds_compare_by_their_suffix():
    """EFA 1.36.0 ships 1.22.0amzn3.0; aws-ofi-nccl >= 1.13 needs 1.22.0amzn4.0 (installer 1.37.0)."""
    assert _version("efa", "1.36.0")["provides"]["libfabric"] == "1.22.0amzn3.0"
    too_old = make_stack({"efa": "1.36.0", "nccl": "2.23.4", "aws-ofi-nccl": "1.13.2"},
                         provides={"libfabric": "1.22.0amzn3.0"})
    assert "ofi-nccl-libfabric-1.13" in _ids(too_old)
    new_enough = make_stack({"efa": "1.37.0", "nccl": "2.23.4", "aws-ofi-nccl": "1.13.2"},
                            provides={"libfabric": "1.22.0amzn4.0"})
    assert _ids(new_enough) == []


def test_aws_ofi_nccl_1_19_needs_upstream_libfabric_1_22_0_not_amzn4():
    """From 1.19 the notes ask for Libfabric v1.22.0 (any build), not 1.22.0amzn4.0
    (https://github.com/aws/aws-ofi-nccl/releases/tag/v1.19.2)."""
    amzn3 = make_stack({"nccl": "2.27.3", "aws-ofi-nccl": "1.19.2"},
                       provides={"libfabric": "1.22.0amzn3.0"})
    assert _ids(amzn3) == []
    older = make_stack({"nccl": "2.27.3", "aws-ofi-nccl": "1.19.2"},
                       provides={"libfabric": "1.21.0"})
    assert "ofi-nccl-libfabric-1.19" in _ids(older)


def test_pytorch_2_2_and_2_3_with_python_3_12_are_reported_not_refused():
    """PyTorch's RELEASE.md lists 3.12 as experimental for 2.2 and 2.3: a note, not a refusal."""
    for torch in ("2.2.2", "2.3.1"):
        stack = make_stack({"pytorch": torch}, provides={"python": "3.12.3"},
                           sources={"pytorch": "pip"})
        assert _ids(stack) == []
        assert "pytorch-2.2-2.3-python-3.12-experimental" in [v.rule.id for v in check_stack(stack)]
    too_new = make_stack({"pytorch": "2.3.1"}, provides={"python": "3.13.1"},
                         sources={"pytorch": "pip"})
    assert "pytorch-2.2-2.3-python" in _ids(too_new)
    older = make_stack({"pytorch": "2.1.2"}, provides={"python": "3.12.3"},
                       sources={"pytorch": "pip"})
    assert "pytorch-2.0-2.1-python" in _ids(older)


def test_p5e_and_p5en_need_the_plugin_release_that_added_them():
    """P5e came in aws-ofi-nccl 1.11.0 (pull 520), P5en in 1.13.0 (RELEASENOTES v1.13.0-aws);
    p5's 1.7.2 floor is not enough for them."""
    def efa_stack(instance: str, plugin: str, libfabric: str):
        return replace(make_stack({"nccl": "2.23.4", "aws-ofi-nccl": plugin, "efa": "1.37.0"},
                                  provides={"cuda": "12.4.1", "libfabric": libfabric},
                                  instances=(instance,)), fabric="efa")
    assert _ids(efa_stack("p5.48xlarge", "1.10.0", "1.19.0amzn1.0")) == []
    assert _ids(efa_stack("p5e.48xlarge", "1.10.0", "1.19.0amzn1.0")) == ["p5e-efa-plugin-minimum"]
    assert _ids(efa_stack("p5e.48xlarge", "1.11.0", "1.19.0amzn1.0")) == []
    assert _ids(efa_stack("p5en.48xlarge", "1.12.1", "1.22.0amzn4.0")) == ["p5en-efa-plugin-minimum"]
    assert _ids(efa_stack("p5en.48xlarge", "1.13.2", "1.22.0amzn4.0")) == []


def test_efa_ubuntu_18_04_support_runs_to_1_22():
    spec = _version("efa", "1.10.0")
    assert "ubuntu18.04" in spec["os"]
    assert "Last installer line" not in spec["notes"]
    assert "1.22" in spec["notes"] and "1.23.0" in spec["notes"]
    on_bionic = make_stack({"efa": "1.22.0"}, provides={"ubuntu": "18.04"})
    assert _ids(on_bionic) == []
    assert _ids(make_stack({"efa": "1.23.0"}, provides={"ubuntu": "18.04"})) == [
        "efa-ubuntu-18.04-dropped"]


def test_aws_ofi_nccl_1_12_1_is_recommended_not_required():
    for text in (_version("aws-ofi-nccl", "1.12.1")["notes"], _version("efa", "1.36.0")["notes"]):
        assert "recommended" in text
        assert not re.search(r"\brequired with (EFA )?installers? ", text), text


def test_aws_ofi_nccl_1_6_0_configures_without_with_nccl():
    assert "--with-nccl" not in _version("aws-ofi-nccl", "1.6.0")["options"]["configure"]
    dockerfile = next((GENERATED / "cuda10.1-efa").glob("*-aws-ofi-nccl.Dockerfile"))
    text = dockerfile.read_text(encoding="utf-8")
    assert "./configure" in text and "--with-nccl" not in text


# --- fact 4: EFA-only requirements apply only to EFA stacks -----------------------------------

def test_p4d_tcp_stack_without_efa_layers_is_valid():
    stack = make_stack({"pytorch": "2.0.1", "nccl": "2.16.2"},
                       provides={"cuda": "11.7.1", "python": "3.10.12"},
                       instances=("p4d.24xlarge",), sources={"pytorch": "pip"})
    assert stack.fabric == "tcp"
    assert _ids(stack) == []
    efa = replace(stack, fabric="efa")
    assert "p4d-gpudirect-rdma" in _ids(efa)


# --- fact 5: no citations of paths outside the repository ------------------------------------

def test_no_citation_of_shared_facts():
    files = [ROOT / "stacks.yaml", *sorted((ROOT / "matrix").rglob("*.py")),
             *sorted((ROOT / "matrix").rglob("*.yaml"))]
    offenders = [str(f.relative_to(ROOT)) for f in files
                 if re.search(r"shared/facts|\.\./shared/|facts §", f.read_text(encoding="utf-8"))]
    assert offenders == []


def test_every_rule_and_fact_source_names_a_url():
    from matrix.model.rules import load_rules

    assert all("https://" in rule.source for rule in load_rules())
    matrix = load_matrix(ROOT / "stacks.yaml")
    for stack in matrix.stacks.values():
        for layer in stack.layers:
            for fact, source in (layer.spec.get("sources") or {}).items():
                assert "https://" in source or source.startswith(("images/", "the package")), (
                    layer.label, fact, source)


# --- issue 16 item 12: facts corrected against upstream ----------------------------------------

def _flat(text: str) -> str:
    return " ".join(text.split())


def test_efa_1_50_0_note_gives_the_plugin_notes_tested_and_compatible_nccl():
    notes = _flat(_version("efa", "1.50.0")["notes"])
    assert "2.29 to 2.31" not in notes and "not re-read" not in notes
    assert "tested with NCCL 2.31.2-1" in notes and "NCCL 2.17.1 and later" in notes
    assert "aws-ofi-nccl/blob/v1.21.1/RELEASENOTES.md" in notes


def test_hccl_wrapper_readme_is_cited_at_a_commit_with_its_era():
    notes = _flat(_version("hccl-ofi-wrapper", "1.0")["notes"])
    pinned = re.findall(r"hccl_ofi_wrapper/blob/([0-9a-f]{40})/README\.md", notes)
    assert len(pinned) == 2, notes
    assert "Required steps" in notes and "late 2022" in notes and "after SynapseAI 1.6.0" in notes
    doc = (ROOT / "docs" / "seed-jobs.md").read_text(encoding="utf-8")
    assert 'hccl_ofi_wrapper "Required steps"' not in doc
    assert re.search(r"hccl_ofi_wrapper/blob/[0-9a-f]{40}/README\.md", doc)


def test_explain_names_the_habana_fork_where_stacks_yaml_installs_it_from():
    from matrix.jobs.explain import DEEPSPEED_FORKS

    upstream, description = DEEPSPEED_FORKS["deepspeed-habana"]["1.6.0"]
    assert upstream == "0.6.1"
    assert "HabanaAI/deepspeed_old" in description and DS_COMMIT[:7] in description
    assert "HabanaAI/DeepSpeed branch" not in description
    url = _version("deepspeed-habana", "1.6.0")["options"]["archive_url"]
    assert url.split("/archive/")[0].endswith("HabanaAI/deepspeed_old")
