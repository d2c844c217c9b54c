"""mnp-entrypoint: the in-container entrypoint of every image, under AWS Batch multi-node
parallel jobs, Slurm (srun tasks and batch scripts), the Kubeflow operators (PyTorchJob, TrainJob,
MPIJob) and on a single node.

Every image runs ``python3 -m entrypoint CMD ARGS...`` (installed as
``/usr/local/bin/mnp-entrypoint``); the container command is the user's program. The rooms, in
the order a start goes through them (imports go only down this list):

1. ``core``: one-line errors, the log, shared limits, the node record, version ranges.
2. ``schedulers``: who started this process and the ``NodeTable`` it gives (role, ranks, hosts).
3. ``probe``: the node's facts, gathered once (address, devices, EFA, versions, programs); the
   EFA preflight's checks.
4. ``launchers``: one unit per launcher behind one interface (its argv from a ``LaunchRequest``).
5. ``settings``: the ``MNP_*`` settings and the scheduler's table, read once (``config``).
6. ``plan``: ``make_plan(settings, facts)``, the one decision for every scheduler; the dry run
   prints it, the run executes it.
7. ``rendezvous``: nodes the entrypoint wires itself (Batch's, and a Slurm step's whose launcher
   needs SSH) meet the main node (bounded, authenticated registration).
8. ``run``: the flow (``main``), the wired main node and children, the MPIJob worker, SSH, the
   start-up gate and the supervised launcher whose exit status becomes the job's.

It uses the Python standard library only and runs on Python 3.6 and newer. The user-facing
documentation is ``docs/entrypoint.md``.
"""

__version__ = "0.1.0"
