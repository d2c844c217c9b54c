"""A reader that stops early ends ``invoke`` and ``mnp-stacks`` quietly (issue 25): through a real
pipe, no BrokenPipeError traceback, on the user's path (``| head -1``) and deterministically (the
pipe's reader closed before the command writes a byte)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COMMANDS = {"invoke": [str(BIN / "invoke")], "mnp-stacks": [str(BIN / "mnp-stacks")]}
ARGS = [["--list"], ["stacks"], ["plan", "--all"]]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_head_1_gets_the_first_line_and_no_traceback(name):
    proc = subprocess.run(["bash", "-c", f"{' '.join(COMMANDS[name])} --list | head -1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip() in ("Available tasks:", "Subcommands:"), proc.stdout
    assert proc.stderr == "", proc.stderr


@pytest.mark.parametrize("args", ARGS, ids=[" ".join(a) for a in ARGS])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_pipe_whose_reader_is_gone_exits_quietly(name, args):
    read, write = os.pipe()
    os.close(read)  # gone before the command writes: its first write breaks the pipe
    try:
        proc = subprocess.run([*COMMANDS[name], *args], cwd=ROOT, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.stderr == ""
    # 1 where the broken pipe is met while writing (Python's documented status for it: signal,
    # SIGPIPE note); a bare Debian 12 container gave 0 for --list with the same empty stderr, so
    # the status is not what this test holds the command to: quiet and no traceback is
    assert proc.returncode in (0, 1), proc.returncode
