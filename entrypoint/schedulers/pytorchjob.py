"""Kubeflow PyTorchJob (training-operator): static jobs with a Master replica, and elastic jobs.

Static (a Master replica): every pod gets ``MASTER_ADDR``/``PET_MASTER_ADDR=<job>-master-0``,
``MASTER_PORT``/``PET_MASTER_PORT`` (default 23456), ``WORLD_SIZE``, ``RANK`` (the pod's node
rank: Master 0, Worker i is i+1), and from training-operator v1.7.0 ``PET_NODE_RANK``,
``PET_NNODES`` and ``PET_NPROC_PER_NODE`` (kubeflow/training-operator PR #1840 "Set correct ENV
for PytorchJob to support torchrun", CHANGELOG.md section "v1.7.0-rc.0", New Features); older
operators give only ``RANK``/``WORLD_SIZE``/``MASTER_*``, which the adapter reads then.
Elastic (an ``elasticPolicy``): ``PET_RDZV_ENDPOINT`` (``<job>-worker-0:<port>`` or the policy's
host), ``PET_RDZV_BACKEND`` (default ``c10d``),
``PET_NNODES=MIN:MAX``, ``PET_RDZV_ID``, ``PET_MAX_RESTARTS``; node ranks come from the
rendezvous. Kubernetes DNS names the pods, so the entrypoint wires nothing.
"""

from typing import Dict, Mapping, Optional, Tuple

from .base import EXPORTED, Elastic, NodeTable, below, first, get, integer
from .torchenv import endpoint, nnodes, nproc_word, slots

NAME = "pytorchjob"
PRECEDENCE = 40  # between equally sure adapters (schedulers/__init__.py says why)
SUBMITTED = True  # whether a job is submitted to it (base.ADAPTER_CONTRACT)
NODE_PREFIXES = ()  # per-process variable prefixes (base.ADAPTER_CONTRACT)
SOURCE = ("https://github.com/kubeflow/training-operator/blob/release-1.9/pkg/controller.v1/"
          "pytorch/envvar.go, master.go, elastic.go")
STATIC = ("MASTER_ADDR", "RANK", "WORLD_SIZE")
SIGNALS = STATIC + ("MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NODE_RANK",
                    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND",
                    "PET_RDZV_ID", "PET_MAX_RESTARTS")
DEFAULT_BACKEND = "c10d"  # what the entrypoint passes when PET_RDZV_BACKEND is unset


def detect(env: Mapping[str, str]) -> Optional[str]:
    if get(env, "PET_RDZV_ENDPOINT") and get(env, "PET_NNODES"):
        return "PET_RDZV_ENDPOINT"
    if all(get(env, name) for name in STATIC):
        return first(env, "PET_MASTER_ADDR", "MASTER_ADDR")
    return None


def trust(env: Mapping[str, str]) -> Tuple[int, str]:
    return EXPORTED, ("job scripts export these names too: sbatch recipes, and enroot's PyTorch "
                      "hook in every Slurm task")


def table(env: Mapping[str, str]) -> NodeTable:
    if get(env, "PET_RDZV_ENDPOINT"):
        return _elastic(env)
    return _static(env)


def _static(env: Mapping[str, str]) -> NodeTable:
    detected = detect(env) or "MASTER_ADDR"
    rank_name = first(env, "PET_NODE_RANK") or "RANK"
    rank = integer(env, rank_name)
    bounds = nnodes(env)
    if bounds is not None:
        count_name, num = "PET_NNODES", bounds[1]
    else:  # operators before PET_NNODES: WORLD_SIZE is the replica count
        count_name, num = "WORLD_SIZE", integer(env, "WORLD_SIZE", minimum=1)
    below(rank_name, rank, count_name, num)
    addr_name = first(env, "PET_MASTER_ADDR") or "MASTER_ADDR"
    host, port = endpoint(env, addr_name)
    per_node, extra = slots(env, num)
    port_name = first(env, "PET_MASTER_PORT", "MASTER_PORT")
    if port_name:
        port = integer(env, port_name, minimum=1, maximum=65535)
    if port is not None:
        extra["master port"] = str(port)
    role = "single" if num == 1 else ("main" if rank == 0 else "child")
    return NodeTable(NAME, detected, role, node_rank=rank, num_nodes=num, main_address=host,
                     slots=per_node, extra=extra, master_port=port,
                     slots_are="processes" if per_node else None,
                     nproc_word=nproc_word(env))


def _elastic(env: Mapping[str, str]) -> NodeTable:
    host, port = endpoint(env, "PET_RDZV_ENDPOINT")
    bounds = nnodes(env)
    if bounds is None:
        bounds = (1, 1)
    per_node, extra = slots(env, bounds[1])
    backend = get(env, "PET_RDZV_BACKEND")
    restarts = integer(env, "PET_MAX_RESTARTS") if get(env, "PET_MAX_RESTARTS") else None
    elastic = Elastic(backend or DEFAULT_BACKEND, host + (":%d" % port if port else ""),
                      "%d:%d" % bounds, get(env, "PET_RDZV_ID"), restarts, get(env, "PET_RDZV_CONF"))
    extra.update({
        "rdzv endpoint": elastic.endpoint,
        "rdzv backend": backend or "%s (torchrun's default here)" % DEFAULT_BACKEND,
        "nnodes": elastic.nnodes,
    })
    for label, value in (("max restarts", restarts), ("rdzv id", elastic.rdzv_id),
                         ("rdzv conf", elastic.conf)):
        if value is not None:
            extra[label] = str(value)
    # No node rank and no main node: the rendezvous assigns ranks among MIN..MAX nodes.
    return NodeTable(NAME, "PET_RDZV_ENDPOINT", "peer", node_rank=None, num_nodes=bounds[1],
                     slots=per_node, extra=extra, elastic=elastic,
                     slots_are="processes" if per_node else None,
                     nproc_word=nproc_word(env))


def example(num_nodes: int, node_rank: int = 0) -> Dict[str, str]:
    """What a static PyTorchJob ``job`` (Master + ``num_nodes - 1`` Workers) gives the pod of
    node rank ``node_rank`` (release-1.9 envvar.go, master.go; port 23456 is the default)."""
    return {"MASTER_ADDR": "job-master-0", "PET_MASTER_ADDR": "job-master-0",
            "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "WORLD_SIZE": str(num_nodes),
            "RANK": str(node_rank), "PET_NODE_RANK": str(node_rank),
            "PET_NNODES": str(num_nodes), "PET_NPROC_PER_NODE": "auto", "PYTHONUNBUFFERED": "1"}


def elastic_example(num_nodes: int, backend: str = "c10d") -> Dict[str, str]:
    """What an elastic PyTorchJob ``job`` (``elasticPolicy`` with ``minReplicas`` = ``maxReplicas``
    = ``num_nodes``, ``rdzvBackend``) gives each pod (release-1.9 elastic.go); an etcd rendezvous
    names the etcd service, as the TorchElastic controller's examples do (``etcd-service:2379``)."""
    endpoint = "etcd-service:2379" if backend.startswith("etcd") else "job-worker-0:23456"
    return {"PET_RDZV_ENDPOINT": endpoint, "PET_RDZV_BACKEND": backend,
            "PET_NNODES": "%d:%d" % (num_nodes, num_nodes), "PET_RDZV_ID": "job",
            "PET_NPROC_PER_NODE": "auto", "PYTHONUNBUFFERED": "1"}
