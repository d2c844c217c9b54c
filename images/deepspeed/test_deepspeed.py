"""DeepSpeed layer: version equals the matrix, imports with the image's torch, no pip cache; ops
pre-built at install time are installed (ds_report) and hold code for every GPU architecture of
the stack family (cuobjdump --list-elf)."""

import re
from pathlib import Path

import pytest

from matrix.model.cuda_arch import family_archs
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parents[2]


def _build_ops(layer):
    ops = layer["spec"].get("options", {}).get("build_ops", [])
    if not ops:
        pytest.skip("this DeepSpeed version JIT-compiles every op")
    return [op.lower() for op in ops]


def test_version(host, layer):
    out = host.check_output("python3 -c 'import deepspeed; print(deepspeed.__version__)'")
    assert out.splitlines()[-1] == layer["version"]


def test_accelerator_and_launcher(host):
    out = host.run("python3 -c 'from deepspeed.accelerator import get_accelerator; "
                   "print(get_accelerator().communication_backend_name())'")
    assert out.rc == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] in ("gloo", "nccl", "ccl", "hccl")
    assert host.exists("deepspeed")


def test_pip_left_no_cache_or_requirements(host):
    assert not host.file("/tmp/requirements.txt").exists
    assert host.run("find / -xdev -type d -path '*/.cache/pip' 2>/dev/null").stdout.strip() == ""


def test_ds_report_shows_prebuilt_ops_installed(host, layer):
    out = host.run("DS_ACCELERATOR=cuda ds_report")  # the CUDA op table, GPU or not
    assert out.rc == 0, out.stderr[-2000:]
    for op in _build_ops(layer):
        clean = [re.sub(r"\x1b\[[0-9;]*m", "", x).strip() for x in out.stdout.splitlines()]
        line = next((x for x in clean if x.startswith(op + " ")), "")
        # ds_report columns: op name, installed, compatible
        assert re.findall(r"\[(\w+)\]", line)[:1] == ["YES"], f"{op}: {line!r}"


def test_prebuilt_ops_hold_every_family_arch(host, layer):
    ops = _build_ops(layer)
    matrix = load_matrix(ROOT / "stacks.yaml")
    archs = [a.replace(".", "") for a in family_archs(matrix, matrix.stack(layer["stack"]))]
    assert archs, "a stack with pre-built CUDA ops must have GPU instances"
    # The last line: importing DeepSpeed may log its accelerator choice to stdout first.
    ops_dir = host.check_output("python3 -c 'import os, deepspeed.ops as o; "
                                "print(os.path.dirname(o.__file__))'").splitlines()[-1]
    for op in ops:
        lib = host.check_output(f"find {ops_dir} -name '{op}_op*.so' | head -1")
        assert lib, f"no compiled {op} under {ops_dir}"
        elf = host.check_output(f"cuobjdump --list-elf {lib}")
        assert sorted(set(re.findall(r"sm_(\d+)", elf)), key=int) == archs, elf
