"""Slots per node: how many processes this node runs, and which source decided.

Order (the first that finds something wins):

1. ``MNP_SLOTS_PER_NODE`` (override).
2. NVIDIA GPUs: ``nvidia-smi -L`` (lines starting ``GPU ``), else ``/proc/driver/nvidia/gpus/*``,
   else ``/dev/nvidia[0-9]*`` device nodes.
3. Habana Gaudi HPUs: ``/dev/accel/accel[0-9]*`` or ``/dev/hl[0-9]*`` device nodes, else
   ``hl-smi -Q index -f csv,noheader`` (one line per HPU).
4. 1.

``detect`` takes a ``root`` (paths are looked up under it, for fixture trees in tests) and a
``run`` function (argv -> stdout text, or ``None`` when the tool is missing or fails).
"""

import glob
import os
import re
import subprocess

from ..core.log import log


class Slots(object):
    def __init__(self, count, source, kind, names=()):
        self.count = count
        self.names = list(names)  # device model names when known (nvidia-smi -L)
        self.source = source  # words, e.g. "nvidia-smi -L (4 GPUs)"
        self.kind = kind  # "gpu" | "hpu" | "override" | "default"

    def __repr__(self):
        return "Slots(%d, %r, %r)" % (self.count, self.source, self.kind)


def run_tool(argv, timeout=20):
    """Run a probe tool; its stdout as text, or ``None`` if missing, failing or hanging."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        log("%s did not answer within %ds; ignoring it" % (argv[0], timeout))
        return None
    if proc.returncode != 0:
        return None
    return out.decode("utf-8", "replace")


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _count_devices(root, pattern, regex):
    names = [os.path.basename(p) for p in glob.glob(_under(root, pattern))]
    return len([n for n in names if re.match(regex, n)])


def detect(override=None, root="/", run=None):
    """Return a ``Slots`` for this node."""
    if run is None:
        run = run_tool if root == "/" else (lambda argv: None)
    if override:
        return Slots(override, "MNP_SLOTS_PER_NODE=%d" % override, "override")

    out = run(["nvidia-smi", "-L"])
    if out:
        gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
        if gpus:
            names = [g.split(":", 1)[1].split("(UUID")[0].strip() for g in gpus if ":" in g]
            return Slots(len(gpus), "nvidia-smi -L (%d GPUs)" % len(gpus), "gpu", names)
    proc_dir = _under(root, "/proc/driver/nvidia/gpus")
    if os.path.isdir(proc_dir):
        entries = [e for e in os.listdir(proc_dir) if not e.startswith(".")]
        if entries:
            return Slots(len(entries), "/proc/driver/nvidia/gpus (%d entries)" % len(entries),
                         "gpu")
    count = _count_devices(root, "/dev/nvidia[0-9]*", r"^nvidia[0-9]+$")
    if count:
        return Slots(count, "/dev/nvidia[0-9]* (%d devices)" % count, "gpu")

    count = _count_devices(root, "/dev/accel/accel[0-9]*", r"^accel[0-9]+$")
    if count:
        return Slots(count, "/dev/accel/accel[0-9]* (%d HPUs)" % count, "hpu")
    count = _count_devices(root, "/dev/hl[0-9]*", r"^hl[0-9]+$")
    if count:
        return Slots(count, "/dev/hl[0-9]* (%d HPUs)" % count, "hpu")
    out = run(["hl-smi", "-Q", "index", "-f", "csv,noheader"])
    if out:
        lines = [line for line in out.splitlines() if line.strip().isdigit()]
        if lines:
            return Slots(len(lines), "hl-smi (%d HPUs)" % len(lines), "hpu")

    return Slots(1, "no GPU or HPU found, MNP_SLOTS_PER_NODE unset: 1", "default")
