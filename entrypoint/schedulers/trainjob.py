"""Kubeflow TrainJob (Trainer v2, torch plugin): one JobSet pod per node, driven through ``PET_*``.

The ``node`` container gets ``PET_NNODES``, ``PET_NPROC_PER_NODE`` (a number, or ``auto``),
``PET_NODE_RANK`` (the Indexed Job's completion index) and, unless the trainer is torchtune,
``PET_MASTER_ADDR=<trainjob>-node-0-0.<trainjob>`` and ``PET_MASTER_PORT=29500``. Unlike a
PyTorchJob there is no ``RANK``/``MASTER_ADDR``/``WORLD_SIZE``. DNS names the pods.

The plugin's ``EnforceMLPolicy`` (``pkg/runtime/framework/plugins/torch/torch.go``, kubeflow/trainer
v2 module) sets ``PET_NNODES``, ``PET_NPROC_PER_NODE`` and ``PET_NODE_RANK`` in one call, then
``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` in the branch ``if !slices.Equal(trainJob.Spec.Trainer.
Command, constants.TorchTuneEntrypoint)`` ("Add PET_MASTER_ADDR and PET_MASTER_PORT envs for
torchrun", lines 184-193 of the stored version); a torchtune trainer (``tune run``) gets
``--rdzv_endpoint=<trainjob>-node-0-0.<trainjob>:29500`` on its command instead, and its command
replaces the image's ENTRYPOINT. So a multi-node TrainJob node without ``PET_MASTER_ADDR`` is not
what the plugin makes for torchrun: one ``ConfigError`` naming it, not a guessed master.
"""

from typing import Dict, Mapping, Optional, Tuple

from ..core.errors import ConfigError
from .base import EXPORTED, NodeTable, below, get, integer
from .torchenv import endpoint, nnodes, nproc_word, slots

NAME = "trainjob"
PRECEDENCE = 50  # between equally sure adapters (schedulers/__init__.py says why)
SUBMITTED = True  # whether a job is submitted to it (base.ADAPTER_CONTRACT)
NODE_PREFIXES = ()  # per-process variable prefixes (base.ADAPTER_CONTRACT)
SOURCE = ("https://github.com/kubeflow/trainer/blob/master/pkg/runtime/framework/plugins/torch/"
          "torch.go (EnforceMLPolicy); pkg/constants/constants.go (TorchEnv*); "
          "https://github.com/kubeflow/trainer/pull/2587 (torchtune: a rendezvous endpoint on the "
          "command instead of PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)")
MASTER = "PET_MASTER_ADDR"


SIGNALS = ("PET_NODE_RANK", "PET_NNODES", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR",
           "PET_MASTER_PORT")


def detect(env: Mapping[str, str]) -> Optional[str]:
    if get(env, "PET_NODE_RANK") and get(env, "PET_NNODES"):
        return "PET_NODE_RANK"
    return None


def trust(env: Mapping[str, str]) -> Tuple[int, str]:
    return EXPORTED, "job scripts can export PET_* too: torchrun reads its options from them"


def table(env: Mapping[str, str]) -> NodeTable:
    bounds = nnodes(env)
    if bounds is None:
        raise ConfigError("PET_NNODES", "is not set: a TrainJob node gets it from the trainer")
    if bounds[0] != bounds[1]:
        raise ConfigError("PET_NNODES", "%d:%d: a TrainJob has a fixed node count" % bounds)
    num = bounds[1]
    rank = integer(env, "PET_NODE_RANK")
    below("PET_NODE_RANK", rank, "PET_NNODES", num)
    per_node, extra = slots(env, num)
    host, port = None, None
    if num > 1 and not get(env, MASTER):
        raise ConfigError(MASTER, "is not set, but PET_NODE_RANK=%d and PET_NNODES=%d are: the "
                          "Trainer's torch plugin sets it for torchrun (<trainjob>-node-0-0."
                          "<trainjob>) and leaves it out only for torchtune, whose tune run gets "
                          "--rdzv_endpoint instead; without it no node can find node 0"
                          % (rank, num))
    if get(env, MASTER):
        host, port = endpoint(env, MASTER)
        if get(env, "PET_MASTER_PORT"):
            port = integer(env, "PET_MASTER_PORT", minimum=1, maximum=65535)
        if port is not None:
            extra["master port"] = str(port)
    if get(env, "JOB_COMPLETION_INDEX"):
        extra["job completion index"] = get(env, "JOB_COMPLETION_INDEX") or ""
    role = "single" if num == 1 else ("main" if rank == 0 else "child")
    return NodeTable(NAME, "PET_NODE_RANK", role, node_rank=rank, num_nodes=num,
                     main_address=host, slots=per_node, extra=extra, master_port=port,
                     slots_are="processes" if per_node else None,
                     nproc_word=nproc_word(env))


def example(num_nodes: int, node_rank: int = 0) -> Dict[str, str]:
    """What TrainJob ``tj`` gives the ``node`` container of node ``node_rank`` (torch plugin)."""
    return {"PET_NNODES": str(num_nodes), "PET_NPROC_PER_NODE": "auto",
            "PET_NODE_RANK": str(node_rank), "JOB_COMPLETION_INDEX": str(node_rank),
            "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500"}
