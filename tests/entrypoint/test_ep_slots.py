"""Slot detection from fixture trees and fake tools."""

import os

from entrypoint.probe import slots


def touch(root, path):
    full = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    open(full, "w").close()


def no_tools(argv):
    return None


def test_override_wins(tmp_path):
    touch(tmp_path, "/dev/nvidia0")
    result = slots.detect(override=3, root=str(tmp_path), run=no_tools)
    assert (result.count, result.kind) == (3, "override")
    assert "MNP_SLOTS_PER_NODE" in result.source


def test_nvidia_smi():
    out = ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n"
           "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\n")
    result = slots.detect(root="/nonexistent", run=lambda argv: out if argv[0] == "nvidia-smi"
                          else None)
    assert (result.count, result.kind) == (2, "gpu")
    assert "nvidia-smi" in result.source
    assert result.names == ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"]


def test_proc_driver_nvidia(tmp_path):
    for bus in ("0000:00:1e.0", "0000:00:1f.0"):
        os.makedirs(str(tmp_path / "proc/driver/nvidia/gpus" / bus))
    touch(tmp_path, "/dev/nvidia0")
    result = slots.detect(root=str(tmp_path), run=no_tools)
    assert result.count == 2 and "/proc/driver/nvidia/gpus" in result.source


def test_dev_nvidia_counts_more_than_ten(tmp_path):
    for i in range(16):
        touch(tmp_path, f"/dev/nvidia{i}")
    for extra in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        touch(tmp_path, "/dev/" + extra)
    result = slots.detect(root=str(tmp_path), run=no_tools)
    assert (result.count, result.kind) == (16, "gpu")
    assert "/dev/nvidia" in result.source


def test_habana_accel(tmp_path):
    for i in range(8):
        touch(tmp_path, f"/dev/accel/accel{i}")
        touch(tmp_path, f"/dev/accel/accel_controlD{i}")
    result = slots.detect(root=str(tmp_path), run=no_tools)
    assert (result.count, result.kind) == (8, "hpu")


def test_habana_hl(tmp_path):
    for i in range(4):
        touch(tmp_path, f"/dev/hl{i}")
        touch(tmp_path, f"/dev/hl_controlD{i}")
    result = slots.detect(root=str(tmp_path), run=no_tools)
    assert (result.count, result.kind) == (4, "hpu")


def test_hl_smi():
    result = slots.detect(root="/nonexistent",
                          run=lambda argv: "0\n1\n2\n" if argv[0] == "hl-smi" else None)
    assert (result.count, result.kind) == (3, "hpu")
    assert "hl-smi" in result.source


def test_nothing_found_is_one(tmp_path):
    result = slots.detect(root=str(tmp_path), run=no_tools)
    assert (result.count, result.kind) == (1, "default")


def test_run_tool_missing_and_failing():
    assert slots.run_tool(["/nonexistent/tool"]) is None
    assert slots.run_tool(["false"]) is None
    assert slots.run_tool(["echo", "x"]) == "x\n"
