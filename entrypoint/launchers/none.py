"""The ``none`` launcher unit: the command itself on the main node, after the rendezvous.

Hostfiles, SSH and the ``MNP_*`` variables are ready for a script that calls a launcher itself.
"""

from typing import Any, Mapping

from ..probe.facts import NodeFacts
from .base import Launch, LaunchRequest, Unit

SOURCE = "this project: the command runs as is on the main node"


class AsIs(Unit):
    name = "none"
    order = 50
    needs_ssh = True
    on_children = "nothing to start: the command may use SSH to reach it"
    env_propagation = "up to the command"
    source = SOURCE
    starts_without_ssh = True  # where a scheduler started one per node, each runs the command
    reaches_hosts = True  # a launcher role's script may start ranks itself

    def uses_mpi(self, facts: NodeFacts, options: Mapping[str, Any], rendezvous: bool) -> bool:
        """A script run as is on Batch's wired nodes may call mpirun itself."""
        return bool(rendezvous)

    def launch(self, request: LaunchRequest) -> Launch:
        return Launch(list(request.command))


UNIT = AsIs()
