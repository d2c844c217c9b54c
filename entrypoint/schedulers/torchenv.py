"""Readers shared by the Kubeflow adapters (PyTorchJob, TrainJob): torchrun's ``PET_*`` values.

torchrun reads every option from ``PET_<OPTION>`` (``torch/distributed/argparse_util.py``, the
``env`` action), which is how the Kubeflow controllers drive it without arguments.
"""

import re
from typing import Dict, Mapping, Optional, Tuple

from ..core.errors import ConfigError
from .base import MAX_NODES, first, get, slots_value

NNODES_RE = re.compile(r"^(\d+)(?::(\d+))?$")
NPROC = ("PET_NPROC_PER_NODE", "PET_N_PROC_PER_NODE")  # the second: training-operator < 1.5


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
    """Per-node slots from ``PET_NPROC_PER_NODE`` when it is a number (``auto``/``gpu`` leave the
    choice to torchrun: shown in ``extra``)."""
    name = first(env, *NPROC)
    if name is None:
        return None, {}
    count = slots_value(env, name)
    extra = {"nproc per node": "%s (%s)" % (get(env, name), name)}
    if count is None or num_nodes is None:
        return None, extra
    return [count] * num_nodes, extra


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
