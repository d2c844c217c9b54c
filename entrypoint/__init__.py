"""mnp-entrypoint: the in-container entrypoint for AWS Batch multi-node parallel (MNP) jobs.

Every image of this project runs ``python3 -m entrypoint CMD ARGS...`` (installed as
``/usr/local/bin/mnp-entrypoint``); the container command is the user's program. The entrypoint

1. reads its role from the Batch variables (``config``): main node, child node, or a single node
   when the variables are absent (a workstation);
2. picks this node's address by a route lookup towards the main node (``netaddr``);
3. counts its slots (GPUs, Habana HPUs, ``MNP_SLOTS_PER_NODE`` or 1, ``slots``);
4. decides EFA or TCP and the matching environment (``fabric``);
5. on a multi-node job, meets the other nodes (``rendezvous`` over ``protocol``): children register
   with the main node (index, address, slots, SSH host key), authenticated with an HMAC when a
   secret is set; the main node waits for every index, at most ``MNP_WAIT_TIMEOUT`` seconds;
6. sets up per-job SSH (``ssh``), writes the hostfiles (``hostfile``), builds the launcher command
   (``launch``) and runs it as a supervised child (``lifecycle``), forwarding signals, reaping
   zombies and exiting with the launcher's status.

It uses the Python standard library only and runs on Python 3.6 and newer. The user-facing
documentation is ``docs/entrypoint.md``.
"""

__version__ = "0.1.0"
