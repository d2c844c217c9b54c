"""A single node: no scheduler variables (a workstation, a plain Batch or Kubernetes job)."""

from typing import Dict, Mapping, Optional, Tuple

from .base import EXPORTED, NodeTable

NAME = "single"
PRECEDENCE = 90  # between equally sure adapters (schedulers/__init__.py says why)
SUBMITTED = False  # whether a job is submitted to it (base.ADAPTER_CONTRACT)
NODE_PREFIXES = ()  # per-process variable prefixes (base.ADAPTER_CONTRACT)
SOURCE = "no scheduler variables: this node runs the whole job"
SIGNALS = ()  # type: Tuple[str, ...]


def detect(env: Mapping[str, str]) -> Optional[str]:
    return None  # the fallback: chosen when no other adapter detects itself


def trust(env: Mapping[str, str]) -> Tuple[int, str]:
    return EXPORTED, "no scheduler variables"


def table(env: Mapping[str, str]) -> NodeTable:
    return NodeTable(NAME, None, "single", node_rank=0, num_nodes=1)


def example(num_nodes: int, node_rank: int = 0) -> Dict[str, str]:
    return {}
