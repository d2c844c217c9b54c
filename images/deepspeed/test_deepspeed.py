"""DeepSpeed layer: version equals the matrix, imports with the image's torch, no pip cache.

As users call it: on a CPU stack ``deepspeed.init_distributed()`` and ``deepspeed.initialize``
with a model and an optimizer take two training steps in one process (the CUDA stacks do the
same on a GPU in tests/test_gpu.py). Every op DeepSpeed lists (``ds_report``) is pre-built or
compatible, the JIT toolchain is there (the ninja module, a C++ compiler, Python.h, nvcc on CUDA
stacks), and one op not pre-built is really compiled just in time. Ops pre-built at install time
are installed and hold code for every GPU architecture of the stack family (cuobjdump).
"""

import json
import re
from pathlib import Path

import pytest

from matrix.model.cuda_arch import family_archs
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parents[2]

# Ops ds_report lists that no user of these stacks can JIT-build, each with why; any other op
# must be installed or compatible, so an op that loses its toolchain fails the test.
NOT_BUILDABLE = {
    # A placeholder for ops an accelerator lacks: loading it raises by design.
    "deepspeed_not_implemented": "deepspeed/ops/op_builder/cpu/no_impl.py",
    # Built only for dist_backend="ccl", which needs Intel's oneCCL (CCL_ROOT) and its torch
    # bindings; no stack ships them.
    "deepspeed_ccl_comm": "op_builder/cpu/comm.py: extra_ldflags needs CCL_ROOT",
    # DeepSpeed4Science's Evoformer attention (AlphaFold-style models) compiles against CUTLASS
    # (CUTLASS_PATH, op_builder/evoformer_attn.py); no stack ships CUTLASS.
    "evoformer_attn": "op_builder/evoformer_attn.py: needs CUTLASS_PATH",
    # GPUDirect Storage links NVIDIA's cuFile (op_builder/gds.py, is_compatible looks for
    # cuFileDriverOpen) and needs the host's nvidia-fs driver; no stack ships either.
    "gds": "op_builder/gds.py: needs libcufile",
}

TRAIN = r'''
import json, os, torch, deepspeed
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
deepspeed.init_distributed()  # the accelerator's own backend, as users call it
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                       config={"train_batch_size": 4})
x, y = torch.randn(4, 8), torch.randn(4, 1)
losses = []
for _ in range(2):
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
print("RESULT " + json.dumps({"accelerator": get_accelerator()._name, "backend": dist.get_backend(),
                              "world": dist.get_world_size(), "steps": engine.global_steps,
                              "losses": losses}), flush=True)
# As PyTorch's distributed docs (Shutdown) ask: a gloo process group left to interpreter
# exit can abort the rank with 'terminate called without an active exception'
# (pytorch/pytorch#190489), failing a job that trained.
dist.destroy_process_group()
'''

CPU_ADAM = r'''
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
p = torch.nn.Parameter(torch.ones(16))
opt = DeepSpeedCPUAdam([p], lr=0.1)
p.grad = torch.ones(16)
opt.step()
print("CPUADAM", round(float(p[0]), 4), flush=True)
'''

# One rank, as DeepSpeed's launcher describes it to each rank.
ONE_RANK = "RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 "\
    "MASTER_PORT=29517"


def _build_ops(layer):
    return layer["spec"].get("options", {}).get("build_ops", [])


def _cuda_stack(layer):
    return "cuda" in layer["versions"]


def _ds_env(layer):
    # the CUDA op table, GPU or not: the accelerator a CUDA stack's ranks use
    return "DS_ACCELERATOR=cuda " if _cuda_stack(layer) else ""


def _script(host, name, text):
    host.run(f"cat > /tmp/{name} <<'PY'\n{text}\nPY")
    return f"/tmp/{name}"


# Readings per host (the layer's container): several tests read each, and each run imports
# torch and DeepSpeed, seconds of CPU. Kept here, not in a fixture: a layer test's dry run
# (tests/layer_dry_run.py) sets fixtures up without a container.
_REPORTS: dict[int, tuple[dict, str]] = {}
_OP_TABLES: dict[int, tuple[dict, str]] = {}


def _op_table(host, layer):
    """BUILD_VAR -> op name, from DeepSpeed's own op table for the stack's accelerator, and the
    folder of DeepSpeed's ops: one Python run per host."""
    if id(host) not in _OP_TABLES:
        code = ("import json, os, deepspeed.ops as o; "
                "from deepspeed.ops.op_builder.all_ops import ALL_OPS; "
                "print(json.dumps([{b.BUILD_VAR: n for n, b in ALL_OPS.items()}, "
                "os.path.dirname(o.__file__)]))")
        # The last line: importing DeepSpeed may log its accelerator choice to stdout first.
        out = host.check_output(f"{_ds_env(layer)}python3 -c '{code}'")
        names, ops_dir = json.loads(out.splitlines()[-1])
        _OP_TABLES[id(host)] = (names, ops_dir)
    return _OP_TABLES[id(host)]


def _op_names(host, layer):
    return _op_table(host, layer)[0]


def _ds_report(host, layer):
    """``{op: (installed, compatible)}`` and the ninja line, from ds_report's op table."""
    if id(host) not in _REPORTS:
        _REPORTS[id(host)] = _read_ds_report(host, layer)
    return _REPORTS[id(host)]


def _read_ds_report(host, layer):
    out = host.run(f"{_ds_env(layer)}ds_report")
    assert out.rc == 0, out.stderr[-2000:]
    clean = [re.sub(r"\x1b\[[0-9;]*m", "", x).strip() for x in out.stdout.splitlines()]
    ops = {}
    for line in clean:
        # "<op> .... [NO] ....... [OKAY]": op name, installed, compatible
        match = re.match(r"^(\w+)\s.*?\[(YES|NO)\]\s*\.*\s*\[(OKAY|NO)\]", line)
        if match:
            ops[match.group(1)] = (match.group(2) == "YES", match.group(3) == "OKAY")
    ninja = next((x for x in clean if x.startswith("ninja ")), "")
    return ops, ninja


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


def test_init_distributed_and_initialize_train_two_steps(host, layer):
    """The user's first lines on one rank: init_distributed() with no arguments, initialize()
    with a model and a torch optimizer, two steps. No JIT build may be needed for it."""
    if _cuda_stack(layer):
        pytest.skip("CUDA stack: tests/test_gpu.py runs this on a GPU (marker gpu)")
    script = _script(host, "ds_train.py", TRAIN)
    out = host.run(f"cd /tmp && env {ONE_RANK} timeout 300 python3 {script}")
    assert out.rc == 0, (out.stdout + out.stderr)[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, out.stdout[-3000:]
    result = json.loads(line[-1][len("RESULT "):])
    assert (result["accelerator"], result["backend"], result["world"]) == ("cpu", "gloo", 1)
    assert result["steps"] == 2
    assert result["losses"][1] < result["losses"][0], result
    # init_distributed loaded its shared-memory op without compiling it
    assert "Unable to JIT load" not in out.stderr + out.stdout
    if "SHM_COMM" in _build_ops(layer):
        assert host.run("ls -d ~/.cache/torch_extensions 2>/dev/null").stdout.strip() == "", \
            "init_distributed JIT-compiled an op that the layer pre-builds"


def test_every_op_is_prebuilt_or_buildable(host, layer):
    """ds_report: every op DeepSpeed would JIT-build is installed or compatible (NOT_BUILDABLE
    aside, each with its reason), and JIT compilation finds what it needs in the image."""
    ops, ninja = _ds_report(host, layer)
    assert ops, "no op table in ds_report's output"
    unusable = {op: state for op, state in ops.items()
                if not any(state) and op not in NOT_BUILDABLE}
    assert unusable == {}, f"neither installed nor compatible: {sorted(unusable)}"
    assert "[OKAY]" in ninja, f"ds_report: {ninja!r} (JIT builds import the ninja module)"
    pending = [op for op, (installed, _) in ops.items()
               if not installed and op not in NOT_BUILDABLE]
    if pending:  # what a JIT build of them needs, as torch.utils.cpp_extension calls it
        tools = host.run("c++ --version && ninja --version && python3 -c 'import sysconfig, os; "
                         "h = sysconfig.get_paths()[\"include\"] + \"/Python.h\"; "
                         "assert os.path.exists(h), h'")
        assert tools.rc == 0, f"JIT builds of {pending} need: {tools.stderr[-1000:]}"
        if _cuda_stack(layer):
            nvcc = host.run("nvcc --version || \"${CUDA_HOME:-/usr/local/cuda}/bin/nvcc\" "
                            "--version")
            assert nvcc.rc == 0, f"JIT builds of CUDA ops {pending} need nvcc: {nvcc.stderr}"


def test_an_op_not_prebuilt_compiles_just_in_time(host, layer):
    """Proof that JIT works, not only that its tools exist: cpu_adam (ZeRO-Offload's optimizer,
    compiled with -march=native so never pre-built) is compiled and steps once."""
    if _cuda_stack(layer):
        pytest.skip("CUDA stack: the CUDA op table is checked above; cpu_adam is a CPU op")
    script = _script(host, "ds_cpu_adam.py", CPU_ADAM)
    out = host.run(f"cd /tmp && timeout 900 python3 {script}")
    assert out.rc == 0, (out.stdout + out.stderr)[-3000:]
    assert "CPUADAM 0.9" in out.stdout, out.stdout[-2000:]  # Adam's first step: lr * sign


def test_ds_report_shows_prebuilt_ops_installed(host, layer):
    if not _build_ops(layer):
        pytest.skip("this DeepSpeed version JIT-compiles every op")
    ops, _ = _ds_report(host, layer)
    names = _op_names(host, layer)
    for op in _build_ops(layer):
        name = names.get("DS_BUILD_" + op)
        assert name, f"DeepSpeed {layer['version']} has no op DS_BUILD_{op}"
        assert ops.get(name, (False,))[0], f"{name} (DS_BUILD_{op}) not installed: {ops}"


def _prebuilt_libs(host, layer):
    """The shared object of each pre-built op, found under DeepSpeed's ops folder."""
    names, ops_dir = _op_table(host, layer)
    ops = [names["DS_BUILD_" + op] for op in _build_ops(layer)]
    libs = []
    for op in ops:
        lib = host.check_output(f"find {ops_dir} -name '{op}_op*.so' | head -1")
        assert lib, f"no compiled {op} under {ops_dir}"
        libs.append(lib)
    return libs


def test_prebuilt_ops_hold_every_family_arch(host, layer):
    if not _build_ops(layer) or not _cuda_stack(layer):
        pytest.skip("no CUDA op is pre-built in this layer")
    matrix = load_matrix(ROOT / "stacks.yaml")
    archs = [a.replace(".", "") for a in family_archs(matrix, matrix.stack(layer["stack"]))]
    assert archs, "a stack with pre-built CUDA ops must have GPU instances"
    for lib in _prebuilt_libs(host, layer):
        elf = host.check_output(f"cuobjdump --list-elf {lib}")
        assert sorted(set(re.findall(r"sm_(\d+)", elf)), key=int) == archs, elf


def test_prebuilt_ops_carry_debug_information_only_where_the_matrix_asks(host, layer):
    """options.host_debug_info false: no DWARF section in a pre-built op (DeepSpeed's builders
    pass -g, which the layer's compiler wrapper drops); omitted: the op keeps it."""
    if not _build_ops(layer) or not host.exists("readelf"):
        pytest.skip("no op is pre-built in this layer, or no readelf to read it")
    wanted = layer["spec"].get("options", {}).get("host_debug_info", True)
    for lib in _prebuilt_libs(host, layer):
        sections = host.check_output(f"readelf -S -W {lib}")
        assert (".debug_info" in sections) == wanted, f"{lib}: {sections}"
