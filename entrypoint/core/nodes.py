"""The node record every room passes around: one node of the job as the plan and the rendezvous
see it (index, address, slots, SSH host key)."""

import collections

NodeInfo = collections.namedtuple("NodeInfo", "index address slots host_key")
