"""What the Batch node roles (``batchnodes.BatchNodes``) need from the node they run on.

``NodeHost`` is the declared interface: ``main.Runner`` implements it (it probes the node, makes
the plan, starts sshd and the launcher), and ``BatchNodes`` is given one and reads nothing else
of it. Before, ``BatchNodes`` was half of ``Runner`` in another file and read 19 of its names
without saying so; the registration race of issue 31 hid in that unstated contract.
``missing_names`` lets a caller (and a test) check an implementation against the list.
"""

# The attributes a host has (set in its constructor or after probing), with what they hold.
ATTRIBUTES = {
    "cfg": "settings.config.Config: the role and settings",
    "sup": "lifecycle.Supervisor: spawns, reaps, knows the signal received",
    "paths": "ssh.Paths: where the job's SSH files go",
    "environ": "the environment the node started with (a dict)",
    "facts": "probe.facts.Facts: the node's facts, once probed",
    "plan": "the dry-run plan (placeholder node table)",
    "command": "the user's command (a list)",
    "node": "this node's name in the final line: its index",
    "need_ssh": "whether the launcher reaches the nodes over SSH",
    "local_launcher": "whether the launcher starts on every node (torchrun)",
    "slot_count": "this node's slots",
    "user": "the user the ranks run as",
}


class NodeHost(object):
    """The node a ``BatchNodes`` role runs on: ``ATTRIBUTES`` plus these methods."""

    def hb(self):
        """``(interval, timeout)`` of the rendezvous heartbeat, seconds."""
        raise NotImplementedError

    def make_plan(self, table, hostfiles):
        """The plan for the node table ``table`` (``None``: the placeholder)."""
        raise NotImplementedError

    def prepare(self, plan):
        """Raise ``StartupError`` on the plan's first problem; write its files."""
        raise NotImplementedError

    def make_state_dir(self):
        """Create ``MNP_STATE_DIR`` (private)."""
        raise NotImplementedError

    def start_sshd(self):
        """Start sshd and wait until it listens; its process."""
        raise NotImplementedError

    def alive(self, proc):
        """Whether ``proc`` (a supervised process) still runs, after reaping."""
        raise NotImplementedError

    def start_launcher(self, plan):
        """Spawn the plan's launcher; ``None`` when it cannot start."""
        raise NotImplementedError

    def own_outcome(self, code):
        """The ``Outcome`` of this node's launcher ending with ``code``: its ranks' first failure
        as the launcher's output told it (``attribution``)."""
        raise NotImplementedError

    def run_launcher(self, plan, watch=None):
        """Start and supervise the launcher (``watch``: the children's events, on the main
        node); the run's ``Outcome``."""
        raise NotImplementedError


METHODS = tuple(name for name in vars(NodeHost) if not name.startswith("_"))


def missing_names(host):
    """The interface's names ``host`` lacks (an empty list for a complete implementation)."""
    # on the class (a property) or the instance: a property is not evaluated before probing
    missing = [name for name in ATTRIBUTES
               if not hasattr(type(host), name) and name not in getattr(host, "__dict__", {})]
    for name in METHODS:
        if getattr(type(host), name, None) is getattr(NodeHost, name):
            missing.append(name)  # still the interface's own placeholder
    return missing
