"""mnp-entrypoint: the in-container entrypoint for AWS Batch multi-node parallel (MNP) jobs.

Every image of this project runs ``python3 -m entrypoint CMD ARGS...`` (installed as
``/usr/local/bin/mnp-entrypoint``); the container command is the user's program. The entrypoint

1. reads its role from the Batch variables (``config``): main node, child node, or a single node
   when the variables are absent (a workstation);
2. picks this node's address by a route lookup towards the main node (``netaddr``);
3. gathers the node's facts once (``facts``: slots from GPUs/HPUs (``slots``), EFA devices and
   versions (``fabric``), instance type, installed versions, launcher programs) and computes the
   plan from them (``plan``: EFA or TCP, every variable from the ``envtable`` rows with its
   reason and source, the launcher unit from ``launchers`` and its argv); ``MNP_DRY_RUN``
   prints the plan, the run executes it;
4. a missing launcher is a line in the dry run and an error (exit 1) when running;
5. on a multi-node job, meets the other nodes (``rendezvous`` over ``protocol``): children register
   with the main node (index, address, slots, SSH host key), authenticated with an HMAC when a
   secret is set; the main node waits for every index, at most ``MNP_WAIT_TIMEOUT`` seconds;
6. sets up per-job SSH (``ssh``), writes the hostfiles (``hostfile``), recomputes the plan with
   the real node table and runs its command (built by its ``launchers`` unit) as a supervised child
   (``lifecycle``), forwarding signals, reaping zombies and exiting with the launcher's status.

It uses the Python standard library only and runs on Python 3.6 and newer. The user-facing
documentation is ``docs/entrypoint.md``.
"""

__version__ = "0.1.0"
