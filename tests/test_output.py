"""``--output`` of jobdef, sbatch and k8s as users call them (issue 25): whatever exists at the
path and is not a regular file (a device node, a FIFO, a symlink) is refused in one line and left
as it was; a new file gets the mode the umask gives, a replaced one keeps its own."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import one_line, writer_commands

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu-tcp@sha256:" + "a" * 64
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
GENERATORS = writer_commands()


def generate(task: str, output: Path, umask: int = 0o022) -> subprocess.CompletedProcess:
    env = {**os.environ, **NO_ENGINE}
    args = [*GENERATORS[task], "--nodes", "2", "--instance-type", "c5n.18xlarge",
            "--image-uri", IMAGE, "--output", str(output), "--", "python3", "train.py"]
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False,
                          preexec_fn=lambda: os.umask(umask))


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink(path: Path) -> None:
    (path.parent / "real.json").write_text("keep me\n", encoding="utf-8")
    path.symlink_to(path.parent / "real.json")


def _dangling(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere.json")


def _device(path: Path) -> None:
    try:  # a private copy of /dev/null's node (1, 3): the test never touches /dev itself
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")


@pytest.mark.parametrize("task", list(GENERATORS))
@pytest.mark.parametrize(("make", "kind"), [
    (_fifo, "a FIFO"), (_symlink, "a symlink"), (_dangling, "a symlink"),
    (_device, "a character device"),
])
def test_output_over_what_is_not_a_regular_file_is_refused(tmp_path, task, make, kind):
    target = tmp_path / "out"
    make(target)
    before = os.lstat(target)
    line = one_line(generate(task, target), 2)
    assert f"--output {target}: exists and is {kind}, not a regular file" in line
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)  # left as it was
    if make is _symlink:
        assert (tmp_path / "real.json").read_text(encoding="utf-8") == "keep me\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


@pytest.mark.parametrize("task", list(GENERATORS))
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_output_file_gets_the_mode_the_umask_gives(tmp_path, task, umask, mode):
    target = tmp_path / "out"
    proc = generate(task, target, umask=umask)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(target.stat().st_mode) == mode


def test_a_replaced_output_file_keeps_its_mode(tmp_path):
    target = tmp_path / "job.json"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o640)
    proc = generate("jobdef", target, umask=0o022)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.read_text(encoding="utf-8").startswith("{")
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]  # no temporary file left
