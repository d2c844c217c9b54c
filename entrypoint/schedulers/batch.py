"""AWS Batch multi-node parallel jobs: the only scheduler whose nodes the entrypoint must wire.

Batch gives every node of an MNP job ``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX``
and ``AWS_BATCH_JOB_NUM_NODES``, and children ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS``
(the ``AWS_BATCH_`` prefix is reserved: users cannot set it). Nothing names the other nodes, so
children register with the main node (``rendezvous``). One of the three set without the others is
an error; ``AWS_BATCH_JOB_NUM_NODES=1`` is a single node.
"""

import ipaddress
from typing import Dict, Mapping, Optional, Tuple

from ..core.errors import ConfigError
from .base import MAX_NODES, STARTED, NodeTable, below, first, get, integer

NAME = "batch"
PRECEDENCE = 20  # between equally sure adapters (schedulers/__init__.py says why)
SUBMITTED = True  # whether a job is submitted to it (base.ADAPTER_CONTRACT)
NODE_PREFIXES = ()  # per-process variable prefixes (base.ADAPTER_CONTRACT)
SOURCE = ("https://docs.aws.amazon.com/batch/latest/userguide/job_env_vars.html (Batch "
          "environment variables); https://docs.aws.amazon.com/batch/latest/userguide/"
          "multi-node-parallel-jobs.html")
VARIABLES = ("AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_MAIN_NODE_INDEX", "AWS_BATCH_JOB_NUM_NODES")
ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
SIGNALS = VARIABLES + (ADDRESS,)


def detect(env: Mapping[str, str]) -> Optional[str]:
    return first(env, *VARIABLES)


def trust(env: Mapping[str, str]) -> Tuple[int, str]:
    return STARTED, "the AWS_BATCH_ prefix is reserved to AWS Batch"


def table(env: Mapping[str, str]) -> NodeTable:
    present = [n for n in VARIABLES if get(env, n) is not None]
    if not present:
        raise ConfigError(VARIABLES[2], "is not set: this is not an AWS Batch multi-node job")
    missing = [n for n in VARIABLES if n not in present]
    if missing:
        raise ConfigError(missing[0], "is not set but %s is: incomplete Batch MNP environment"
                          % present[0])
    num = integer(env, "AWS_BATCH_JOB_NUM_NODES", minimum=1, maximum=MAX_NODES)
    index = integer(env, "AWS_BATCH_JOB_NODE_INDEX")
    main = integer(env, "AWS_BATCH_JOB_MAIN_NODE_INDEX")
    below("AWS_BATCH_JOB_NODE_INDEX", index, "AWS_BATCH_JOB_NUM_NODES", num)
    below("AWS_BATCH_JOB_MAIN_NODE_INDEX", main, "AWS_BATCH_JOB_NUM_NODES", num)
    extra = {}
    job = get(env, "AWS_BATCH_JOB_ID")
    if job:
        extra["job id"] = job
    common = dict(node_rank=index, num_nodes=num, main_rank=main, extra=extra)
    if num == 1:
        return NodeTable(NAME, present[0], "single", **common)
    if index == main:
        return NodeTable(NAME, present[0], "main", rendezvous=True, **common)
    return NodeTable(NAME, present[0], "child", main_address=_main_address(env, index),
                     rendezvous=True, **common)


def _main_address(env: Mapping[str, str], index: int) -> str:
    addr = get(env, ADDRESS)
    if not addr:
        raise ConfigError(ADDRESS, "is required on a child node (index %d) but not set" % index)
    try:
        parsed = ipaddress.IPv4Address(addr)
    except ValueError:
        raise ConfigError(ADDRESS, "%r is not an IPv4 address" % addr) from None
    if parsed.is_loopback or parsed.is_unspecified or parsed.is_multicast:
        raise ConfigError(ADDRESS, "%s cannot be the main node's address" % addr)
    return str(parsed)


def example(num_nodes: int, node_rank: int = 0) -> Dict[str, str]:
    """What Batch gives node ``node_rank`` of an MNP job (``invoke explain --scheduler``); the
    main node's address is from TEST-NET-1 (RFC 5737)."""
    env = {"AWS_BATCH_JOB_ID": "<job-id>#%d" % node_rank,
           "AWS_BATCH_JOB_NODE_INDEX": str(node_rank), "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
           "AWS_BATCH_JOB_NUM_NODES": str(num_nodes)}
    if node_rank:
        env[ADDRESS] = "192.0.2.10"
    return env
