"""Who wires a job's nodes where the scheduler started one entrypoint per node but serves no SSH.

A Slurm step of one task per node (``srun --ntasks-per-node=1 mnp-entrypoint ...``, what the
scripts ``invoke sbatch`` writes for torchrun, DeepSpeed and mpirun-from-node-0 run through pyxis)
gives every node its rank and names the main node, but nothing there lets one process reach the
others: Open MPI's mpirun would start its daemons through ``srun``, which a pyxis container does
not have, and DeepSpeed's runners use ``pdsh`` or ``mpirun`` over SSH. There the entrypoint wires
the nodes itself, as on AWS Batch: node 0 serves the rendezvous, every other node registers with
it (its address, slots and a fresh SSH host key), and node 0 runs the launcher over the job's
own SSH (``run.batchnodes``). It does so only

- when ``MNP_LAUNCHER`` names a launcher that needs SSH to start its ranks (``needs_ssh`` and
  not ``starts_without_ssh``): torchrun and ``none`` keep the scheduler's wiring, so nothing
  listens on the rendezvous or SSH port unless the job asked for a launcher that needs them;
- when every node of the step runs one task: several tasks on a node would each start a
  rendezvous and an sshd on the same ports (the plan names that problem instead), and every
  node must decide alike, or some would wait for a rendezvous that never starts;
- where the scheduler's table gives a ``wiring_id`` (only a Slurm step does), which binds the
  rendezvous messages to that step, as ``AWS_BATCH_JOB_ID`` does on Batch.

The ports are the node's own: enroot creates only user and mount namespaces (NVIDIA/enroot
src/runtime.sh:341-349, bin/enroot-nsenter.c:154-168 at 2e3ce06592f69119c30467221a35c39b2c339f2a)
and pyxis joins each task to the container's user, cgroup and mount namespaces only
(NVIDIA/pyxis pyxis_slurmstepd.c:752-776 at 2ca2427d4bd709627ce5e696c39fed4e143c7a48), so a
task's sshd on ``MNP_SSH_PORT`` (2222; the node's own sshd has 22) and node 0's rendezvous listen
on the node's interfaces, where the other nodes reach them.
"""

from typing import Any, Optional

from .. import launchers


class Wiring(object):
    """The decision to wire a step's nodes here: the node table that records it and the main
    node's place the rendezvous needs (node 0; its address on children; the step's id as the
    job id where the scheduler gave none)."""

    __slots__ = ("node", "job_id", "main_index", "main_address")

    def __init__(self, node: Any, job_id: str, main_index: int,
                 main_address: Optional[str]) -> None:
        self.node = node
        self.job_id = job_id
        self.main_index = main_index
        self.main_address = main_address


def decide(cfg: Any) -> Optional[Wiring]:
    """Whether the entrypoint wires the nodes of ``cfg`` (settings being read, role and launcher
    known) because the scheduler serves no SSH and the launcher needs it: a ``Wiring`` with new
    values, or None. Nothing of ``cfg`` or its table is changed."""
    node = cfg.node
    if node is None or node.wiring_id is None or cfg.mode not in ("main", "child"):
        return None
    unit = launchers.UNITS[cfg.launcher]
    if not cfg.launcher_explicit or not unit.needs_ssh or unit.starts_without_ssh:
        return None
    if not node.one_task_per_node():
        return None
    because = ("MNP_LAUNCHER=%s needs SSH between the nodes, which %s does not serve"
               % (cfg.launcher, node.scheduler))
    return Wiring(node.wired(because), cfg.job_id or node.wiring_id, 0,
                  node.main_address if cfg.mode == "child" else None)
