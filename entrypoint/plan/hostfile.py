"""Hostfiles, one line per node, sorted by node index.

- ``hostfile``: Open MPI and DeepSpeed, ``<address> slots=<N>``.
- ``hostfile.plain``: one address per line.
- ``hostfile.intel``: Intel MPI / MPICH, ``<address>:<N>``.

Addresses are IPv4 literals, so Open MPI cannot collapse two nodes into one by their names, and
one line per index means no duplicate entries (Open MPI and DeepSpeed reject those).
"""

import os


def _sorted(nodes):
    return sorted(nodes, key=lambda node: node.index)


def render_openmpi(nodes):
    return "".join("%s slots=%d\n" % (n.address, n.slots) for n in _sorted(nodes))


def render_plain(nodes):
    return "".join("%s\n" % n.address for n in _sorted(nodes))


def render_intel(nodes):
    return "".join("%s:%d\n" % (n.address, n.slots) for n in _sorted(nodes))


def total_slots(nodes):
    return sum(n.slots for n in nodes)


def write_all(directory, nodes):
    """Write the three hostfiles into ``directory``; return ``{kind: path}``."""
    paths = {
        "openmpi": os.path.join(directory, "hostfile"),
        "plain": os.path.join(directory, "hostfile.plain"),
        "intel": os.path.join(directory, "hostfile.intel"),
    }
    renderers = {"openmpi": render_openmpi, "plain": render_plain, "intel": render_intel}
    for kind, path in paths.items():
        tmp = path + ".tmp"
        with open(tmp, "w") as handle:
            handle.write(renderers[kind](nodes))
        os.rename(tmp, path)
    return paths
