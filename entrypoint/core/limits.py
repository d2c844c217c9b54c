"""Limits shared across the entrypoint, defined once and below everything that uses them.

Bounds on every number read from the environment, so a typo cannot make the entrypoint build a
ten-million-line hostfile or wait for a year. AWS Batch's own limit is far lower: a multi-node job
has at most 1000 nodes (docs.aws.amazon.com/batch/latest/userguide/multi-node-parallel-jobs.html
and service quotas); the caps leave room and keep a dry run instant.
"""

MAX_NODES = 10000  # nodes of one job, from any scheduler's variables or a hostfile
MAX_SLOTS = 4096  # processes on one node, from a setting, a scheduler or a registration
MAX_NP = MAX_NODES * MAX_SLOTS  # processes of one job (MNP_NP)
MAX_SECONDS = 7 * 24 * 3600.0  # a week: longer than any Batch attempt duration we expect
# A child heartbeats every max(hb_interval, CLIENT_TICK) s and the server checks every LOOP_TICK s,
# so silence of ~0.7 s is normal on an idle, healthy link; 2 s leaves room for a busy node's
# scheduling delays (rendezvous.server's ticks).
MIN_HEARTBEAT_TIMEOUT = 2.0
