"""The ``none`` launcher unit: the command itself on the main node, after the rendezvous.

Hostfiles, SSH and the ``MNP_*`` variables are ready for a script that calls a launcher itself.
"""

from typing import List, Sequence

from .base import Unit

SOURCE = "this project: the command runs as is on the main node"
UNIT = Unit("none", True, "nothing to start: the command may use SSH to reach it",
            "up to the command", None, SOURCE)


def argv(command: Sequence[str]) -> List[str]:
    """The user's command, as is."""
    return list(command)
