"""Ctrl-C while mmdebstrap bootstraps a base leaves nothing behind: no /tmp/mmdebstrap.* chroot,
no proc/sys/dev still mounted in it. Runs the real bootstrap in a child process with its own
TMPDIR, interrupts it once mmdebstrap has mounted its chroot, and looks at what is left."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import signal
import sys
import docker
# as in a terminal: a suite started in the background by a shell without job control inherits
# SIGINT ignored, and Python keeps it ignored in the child
signal.signal(signal.SIGINT, signal.default_int_handler)
from matrix.image import bootstrap
from matrix.model.entities import Base
base = Base(name="t", image=sys.argv[1], os="debian12", provides={},
            bootstrap={"suite": "bookworm", "mirror": "http://deb.debian.org/debian"})
bootstrap.bootstrap(docker.from_env(), base)
"""

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def mounts_under(folder: Path) -> list[str]:
    text = Path("/proc/mounts").read_text(encoding="utf-8")
    return [line.split()[1] for line in text.splitlines() if line.split()[1].startswith(str(folder))]


@pytest.mark.skipif(not shutil.which("mmdebstrap") or os.geteuid() != 0,
                    reason="needs mmdebstrap and root (its chroot mounts proc, sys and dev)")
def test_ctrl_c_during_bootstrap_leaves_nothing_behind(tmp_path, docker_client):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    image = f"mnp-test-i17-interrupt-{uuid.uuid4().hex[:8]}:bookworm"
    child = subprocess.Popen([sys.executable, "-c", CHILD, image], cwd=ROOT,
                             env=dict(os.environ, TMPDIR=str(tmpdir)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not mounts_under(tmpdir):  # mmdebstrap has mounted proc/sys/dev in its chroot
            assert child.poll() is None, child.stdout.read().decode()[-2000:]
            assert time.monotonic() < deadline, "mmdebstrap never mounted its chroot"
            time.sleep(0.2)
        assert list(tmpdir.glob("mmdebstrap.*"))
        child.send_signal(signal.SIGINT)  # what Ctrl-C sends to the invoke process
        output = child.communicate(timeout=300)[0].decode()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    left = mounts_under(tmpdir)
    for mount in sorted(left, reverse=True):  # never leave a failed run's mounts on the machine
        subprocess.run(["umount", "-l", mount], check=False)
    assert "KeyboardInterrupt" in output
    assert left == []
    assert [p.name for p in tmpdir.iterdir()] == []  # no mmdebstrap.*, no mnp-base-*
    assert not docker_client.images.list(name=image.split(":")[0])
