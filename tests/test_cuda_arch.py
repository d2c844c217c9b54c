"""GPU architectures come from the stack's instances and CUDA release (issue 9, fact 1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from matrix.errors import UserError
from matrix.image.plan import plan
from matrix.model import cuda_arch
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parent.parent


def test_nvcc_11_7_cannot_target_hopper():
    assert cuda_arch.cuda_archs("11.8", ["A100", "H100"]) == ["8.0", "9.0"]
    with pytest.raises(UserError, match=r"CUDA 11\.7\.1 cannot compile for the H100 GPU "
                                        r"\(sm_90 needs CUDA 11\.8 or newer"):
        cuda_arch.cuda_archs("11.7.1", ["A100", "H100"])


def test_blackwell_needs_12_8_and_13_drops_volta():
    assert cuda_arch.cuda_archs("12.8", ["H100", "B200", "V100"]) == ["7.0", "9.0", "10.0"]
    assert cuda_arch.cuda_archs("13.2.86", ["B200", "A10G"]) == ["8.6", "10.0"]
    with pytest.raises(UserError, match="sm_100 needs CUDA 12.8 or newer"):
        cuda_arch.cuda_archs("12.6", ["H100", "B200"])


def test_one_cubin_per_major_serves_the_higher_minors():
    """A cubin for X.y runs on X.z GPUs with z >= y: sm_86 serves the L4 and L40S (8.9), sm_100
    the B300 (10.3); a major with one GPU model keeps that model's own architecture."""
    assert cuda_arch.cuda_archs("13.2.86", ["L40S", "A10G", "L4", "H100", "B300", "B200"]) == \
        ["8.6", "9.0", "10.0"]
    assert cuda_arch.cuda_archs("13.2.86", ["L4", "B300"]) == ["8.9", "10.3"]
    assert "ada-compatibility-guide" in cuda_arch.BINARY_COMPATIBILITY


def test_a_gpu_the_cuda_cannot_target_is_an_error_not_an_omission():
    """Issue 16 item 9: the V100 used to be dropped silently (no kernels for the hardware)."""
    with pytest.raises(UserError) as info:
        cuda_arch.cuda_archs("13.2.86", ["V100", "B200", "A10G"])
    message = str(info.value)
    assert "\n" not in message and "V100" in message and "CUDA 13.0 dropped sm_70" in message
    assert "archive/13.0.0/cuda-toolkit-release-notes" in message


def test_no_cuda_means_no_archs_and_cuda_without_a_gpu_is_an_error():
    assert cuda_arch.cuda_archs(None, ["H100"]) == []
    with pytest.raises(UserError, match="no GPU model to compile kernels for"):
        cuda_arch.cuda_archs("13.2", [])


def test_every_arch_source_cites_release_notes_by_url_and_section():
    for cc, support in cuda_arch.ARCH_SUPPORT.items():
        assert "https://docs.nvidia.com/cuda/archive/" in support.source, cc
        assert "section" in support.source, cc


def test_unknown_gpu_model_names_the_table():
    with pytest.raises(UserError, match="GPU model 'X9' has no compute capability"):
        cuda_arch.cuda_archs("13.2", ["X9"])


def test_every_gpu_instance_of_the_matrix_has_a_known_gpu():
    matrix = load_matrix(ROOT / "stacks.yaml")
    for stack in matrix.stacks.values():
        if cuda_arch.stack_cuda(stack):
            for instance in stack.instances:
                assert cuda_arch.gpu_model(instance) in cuda_arch.GPU_COMPUTE_CAPABILITY, instance


def test_cuda11_7_nccl_tests_no_longer_asks_for_sm_90():
    matrix = load_matrix(ROOT / "stacks.yaml")
    layer = next(x for x in plan(matrix, ["cuda11.7-efa"]).chain("cuda11.7-efa")
                 if x.component == "nccl-tests")
    assert "sm_80" in layer.dockerfile
    assert "sm_90" not in layer.dockerfile and "compute_90" not in layer.dockerfile


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"])
def test_cuda13_efa_job_definitions_validate_with_botocore(instance_type):
    from matrix.jobs.jobdef import validate_job_definition
    from matrix.model.instances import INSTANCE_TYPES
    from tests.helpers import written

    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack("cuda13.2-efa")
    assert instance_type in stack.instances
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp-stacks@sha256:" + "a" * 64
    definition = written("jobdef", "--stack", "cuda13.2-efa", "--nodes", "2", "--instance-type",
                         instance_type, "--image-uri", image, "--launcher", "torchrun",
                         command=["python3", "train.py"])
    validate_job_definition(definition)
    (node_range,) = definition["nodeProperties"]["nodeRangeProperties"]
    resources = {r["type"]: r["value"] for r in node_range["container"]["resourceRequirements"]}
    assert resources["GPU"] == str(INSTANCE_TYPES[instance_type].gpus)
    assert len(node_range["container"]["linuxParameters"]["devices"]) == \
        INSTANCE_TYPES[instance_type].efa_interfaces


def test_cuda13_efa_shares_its_lower_layers_with_the_tcp_sibling():
    matrix = load_matrix(ROOT / "stacks.yaml")
    result = plan(matrix, ["cuda13.2-tcp", "cuda13.2-efa"])
    shared = [x.component for x in result.chain("cuda13.2-efa")
              if x.ref in result.chains["cuda13.2-tcp"]]
    assert shared == ["ssh", "python", "cuda", "pytorch", "nccl", "deepspeed", "pdsh"]
    compiled = next(x for x in result.chain("cuda13.2-efa") if x.component == "nccl-tests")
    assert "sm_90" in compiled.dockerfile and "sm_100" in compiled.dockerfile


def test_the_architectures_the_readme_and_stacks_file_name_are_the_ones_compiled():
    """The README's stack table and a stack's description say in prose which architectures its
    CUDA code is compiled for ("compiled for sm_86/90/100"); the rule above is their owner, so a
    change of instances or of the rule that leaves the prose behind fails here."""
    matrix = load_matrix(ROOT / "stacks.yaml")
    readme = (ROOT / "README.md").read_text().splitlines()
    checked = 0
    for stack in matrix.stacks.values():
        compiled = [cc.replace(".", "") for cc in cuda_arch.family_archs(matrix, stack)]
        row = next((line for line in readme if line.startswith(f"| `{stack.name}` |")), "")
        for where, text in (("README.md", row), ("stacks.yaml description", stack.description)):
            named = re.search(r"compiled for sm_(\d+(?:/\d+)*)", text)
            if named:
                assert named.group(1).split("/") == compiled, (stack.name, where)
                checked += 1
    assert checked >= 2  # cuda13.2-tcp's row and description at least
