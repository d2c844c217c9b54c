"""Where one child's connection stands in the registration, as explicit states and transitions.

Every change of a connection's state goes through ``advance``, which refuses any transition not
in ``TRANSITIONS``: the rule "a node that failed its checks is never counted ready" is a missing
edge (``FAILED`` leads only to ``CLOSED``), not a condition some caller has to remember.

::

    HELLO --register--> REGISTERED --ready--> READY --exit--> EXITED
                            |                   |
                            +--exit (failed)--> FAILED
    any state --close--> CLOSED

- ``HELLO``: connected, not yet authenticated.
- ``REGISTERED``: authenticated, valid registration, not ready: sshd may still be starting, or
  the node is about to report that its start-up checks failed.
- ``READY``: the node passed its checks and serves the job; only these count for ``go``.
- ``FAILED``: the node reported a non-zero status before it was ready (its start-up checks
  failed); it can never become ready, and the main node starts nothing.
- ``EXITED``: a ready node's local launcher ended (after ``go``), with its status.
- ``CLOSED``: the connection is gone.

torch.distributed.elastic's agent keeps its workers the same way (an explicit ``WorkerState``,
https://github.com/pytorch/pytorch/blob/v2.3.0/torch/distributed/elastic/agent/server/api.py).
"""

import enum

from .protocol import ProtocolError


class NodeState(str, enum.Enum):
    """One connection's registration state. A ``str`` too, so it prints and logs as its name."""

    HELLO = "hello"
    REGISTERED = "registered"
    READY = "ready"
    FAILED = "failed"
    EXITED = "exited"
    CLOSED = "closed"

    def __str__(self):
        return self.value


TRANSITIONS = {
    NodeState.HELLO: (NodeState.REGISTERED, NodeState.CLOSED),
    NodeState.REGISTERED: (NodeState.READY, NodeState.FAILED, NodeState.CLOSED),
    NodeState.READY: (NodeState.EXITED, NodeState.CLOSED),
    NodeState.FAILED: (NodeState.CLOSED,),
    NodeState.EXITED: (NodeState.CLOSED,),
    NodeState.CLOSED: (),
}

# States in which the node is still connected and owed heartbeats and the final ``done``.
CONNECTED = (NodeState.READY, NodeState.FAILED, NodeState.EXITED)


class IllegalTransition(ProtocolError):
    """A message that would move a connection along an edge the registration does not have."""


def advance(conn, new):
    """Move ``conn`` (anything with a ``state``) to ``new``; ``IllegalTransition`` if that is no
    edge of ``TRANSITIONS`` (``CLOSED`` to ``CLOSED`` is allowed: closing twice is harmless)."""
    old = conn.state
    if new is NodeState.CLOSED and old is NodeState.CLOSED:
        return
    if new not in TRANSITIONS[old]:
        raise IllegalTransition("%s -> %s is not a registration step" % (old, new))
    conn.state = new
