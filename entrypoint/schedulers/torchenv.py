"""Readers shared by the Kubeflow adapters (PyTorchJob, TrainJob): torchrun's ``PET_*`` values.

torchrun reads most of its options from ``PET_<OPTION>`` too: those ``torch/distributed/run.py``
declares with ``torch/distributed/argparse_util.py``'s ``env`` or ``check_env`` action (``--nnodes``,
``--nproc-per-node``, the rendezvous options, ``--max-restarts``...; not ``--logs-specs`` or
``--numa-binding``, TORCHRUN_SOURCE's run.py), which is how the Kubeflow controllers drive it
without arguments.
"""

import re
from typing import Dict, Mapping, Optional, Tuple

from ..core.errors import ConfigError
from .base import MAX_NODES, first, get, slots_value

NNODES_RE = re.compile(r"^(\d+)(?::(\d+))?$")
NPROC = ("PET_NPROC_PER_NODE", "PET_N_PROC_PER_NODE")  # the second: training-operator < 1.5
# torchrun's own words for --nproc_per_node, as its determine_local_world_size reads them (word
# for word, case and all): ``cpu`` the CPU count, ``gpu`` torch.cuda.device_count() (no CUDA:
# ValueError "Cuda is not available."), ``auto`` the GPUs when CUDA (newer releases: any
# torch.accelerator) is available, else the CPU count. Its ``xpu`` and PrivateUse1 backend names
# count devices these images do not carry, so they are refused here like any other word.
TORCHRUN_SOURCE = ("https://github.com/pytorch/pytorch/blob/"
                   "010929fd3f401c3868310396e6a91ed95aa0305b/torch/distributed/run.py "
                   "(determine_local_world_size)")
NPROC_WORDS = ("auto", "cpu", "gpu")


def nnodes(env: Mapping[str, str], name: str = "PET_NNODES") -> Optional[Tuple[int, int]]:
    """``PET_NNODES`` as ``(min, max)``: ``3`` is ``(3, 3)``, ``1:4`` is ``(1, 4)``."""
    raw = get(env, name)
    if raw is None:
        return None
    match = NNODES_RE.match(raw)
    if not match:
        raise ConfigError(name, "%r is not N or MIN:MAX" % raw)
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if not 1 <= low <= high <= MAX_NODES:
        raise ConfigError(name, "%r: need 1 <= MIN <= MAX <= %d" % (raw, MAX_NODES))
    return low, high


def slots(env: Mapping[str, str], num_nodes: Optional[int]) -> Tuple[Optional[list], Dict[str, str]]:
    """Per-node slots from ``PET_NPROC_PER_NODE`` when it is a number; one of torchrun's words
    (``nproc_word``) leaves them to the plan, which resolves it on the node as torchrun would."""
    name = first(env, *NPROC)
    if name is None:
        return None, {}
    word = nproc_word(env)
    count = None if word else slots_value(env, name)
    shown = "%s (%s)" % (get(env, name), name)
    if word:
        shown += ": torchrun's word, counted on this node as torchrun counts it (see devices)"
    extra = {"nproc per node": shown}
    if count is None or num_nodes is None:
        return None, extra
    return [count] * num_nodes, extra


def nproc_word(env: Mapping[str, str]) -> Optional[str]:
    """The word of ``PET_NPROC_PER_NODE`` (``auto``, ``cpu``, ``gpu``), None for a number or when
    unset; anything else is a ``ConfigError``: torchrun would stop on it ("Unsupported
    nproc_per_node value"), and a guess here would start a different number of processes."""
    name = first(env, *NPROC)
    raw = get(env, name) if name else None
    if raw is None or raw.lstrip("-").isdigit():
        return None
    if raw in NPROC_WORDS:
        return raw
    hint = " (did you mean %s? torchrun reads the words as written)" % raw.lower() \
        if raw.lower() in NPROC_WORDS else ""
    raise ConfigError(name, "%r is neither a number of processes nor one of torchrun's words %s%s"
                      % (raw, ", ".join(NPROC_WORDS), hint))


def resolve(word: str, gpus: int, hpus: int, cpus: int,
            gpu_source: str) -> Tuple[Optional[int], str]:
    """``(processes, why)`` for torchrun's ``word`` on a node with these devices, as torchrun
    counts (``TORCHRUN_SOURCE``); ``(None, problem)`` where torchrun would stop or where what it
    counts depends on its release (``auto`` on a Gaudi node)."""
    said = "PET_NPROC_PER_NODE=%s" % word
    if word == "cpu" or (word == "auto" and not gpus and not hpus):
        return cpus, "%s: this node's %d CPUs (os.cpu_count()), as torchrun counts them%s" % (
            said, cpus, "" if word == "cpu" else " where there is no GPU")
    if gpus:
        return gpus, "%s: this node's %d GPUs, as torchrun counts CUDA devices (%s)" % (
            said, gpus, gpu_source)
    if word == "gpu":
        return None, ("%s: torchrun stops on a node without a CUDA GPU (\"Cuda is not "
                      "available.\") and this one has none: set a number" % said)
    return None, ("%s on a node with %d HPUs and no GPU: whether torchrun starts one process per "
                  "HPU or per CPU depends on its PyTorch release: set a number" % (said, hpus))


def endpoint(env: Mapping[str, str], name: str) -> Tuple[str, Optional[int]]:
    """``host[:port]`` of a rendezvous endpoint or master address, checked."""
    raw = get(env, name) or ""
    host, sep, port = raw.rpartition(":") if raw.count(":") == 1 else (raw, "", "")
    if not host or any(c.isspace() for c in host):
        raise ConfigError(name, "%r is not HOST[:PORT]" % raw)
    if not sep:
        return host, None
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(name, "%r: the port must be 1-65535" % raw)
    return host, int(port)
