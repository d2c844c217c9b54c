"""Open MPI parameters as one set: ours, DeepSpeed's openmpi runner's and the user's, merged so
that no parameter is listed twice and the user's value wins.

Open MPI 4 stops when a parameter appears twice on the command line ("The following MCA
parameter has been listed multiple times"), so nothing here is put on the command line: every
parameter of the merged set becomes an ``OMPI_MCA_<name>`` variable of the launcher's
environment (mpirun reads them and passes them on to its daemons).

Sources, lowest to highest precedence:

1. ours (``plan``): the fabric's (``btl_tcp_if_include``, ``oob_tcp_if_include``, ``pml``,
   ``btl``), ``plm_rsh_no_tree_spawn``, ``orte_abort_on_non_zero_status`` and
   ``orte_default_hostfile`` (so a script's own ``mpirun`` finds the job's hosts, as
   kubeflow/mpi-operator does);
2. the user's ``OMPI_MCA_<name>`` variables;
3. the user's ``--mca NAME VALUE`` / ``-mca NAME VALUE`` in ``MNP_LAUNCHER_ARGS`` (taken out of
   the arguments and passed as variables).

DeepSpeed's openmpi runner puts ``--mca btl ^openib --mca btl_tcp_if_include eth0`` on its own
``mpirun`` command line, in every release this project ships (``RUNNER_FIXED``); a command-line
parameter beats a variable, so for those two names the runner's value is what runs. The plan says
so, and a user value for them that differs is a problem (use the pdsh runner instead).
"""

import re

MCA_FLAGS = ("--mca", "-mca")
NAME_RE = re.compile(r"^[A-Za-z0-9_]+$")

# DeepSpeed's OpenMPIRunner.get_cmd,
# https://github.com/deepspeedai/DeepSpeed/blob/v0.14.4/deepspeed/launcher/multinode_runner.py:
# the same two parameters, unconditionally, in 0.6.x through 0.14.5 (read in the 0.12.6, 0.14.4
# and 0.14.5 sdists); launcher_args follow them on the command line.
RUNNER_FIXED = (("btl", "^openib"), ("btl_tcp_if_include", "eth0"))


class McaError(Exception):
    """A malformed ``--mca`` in ``MNP_LAUNCHER_ARGS`` (missing name or value)."""


def split_args(args):
    """``(params, rest)``: the ``--mca NAME VALUE`` pairs of ``args`` (in order) and the other
    arguments. ``--mca`` without both a name and a value raises ``McaError``."""
    params = []
    rest = []
    args = list(args)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in MCA_FLAGS:
            if i + 2 >= len(args):
                raise McaError("%s needs a name and a value" % arg)
            name, value = args[i + 1], args[i + 2]
            if not NAME_RE.match(name):
                raise McaError("%s %r: not a parameter name" % (arg, name))
            params.append((name, value))
            i += 3
            continue
        rest.append(arg)
        i += 1
    return params, rest


def from_env(env):
    """The user's ``OMPI_MCA_<name>`` variables as ``[(name, value)]``."""
    return sorted((k[len("OMPI_MCA_"):], v) for k, v in env.items()
                  if k.startswith("OMPI_MCA_") and len(k) > len("OMPI_MCA_"))


class Param(object):
    def __init__(self, name, value, source, replaced=None):
        self.name = name
        self.value = value
        self.source = source  # "ours", "OMPI_MCA_<name>", "MNP_LAUNCHER_ARGS", "deepspeed runner"
        self.replaced = replaced  # the value it replaced, or None

    def to_list(self):
        return [self.name, self.value, self.source]


def merge(ours, user_env, user_args):
    """One ``Param`` per name, in first-seen order; the user's beat ours, the user's command-line
    ones beat their ``OMPI_MCA_`` variables."""
    merged = {}
    order = []

    def put(name, value, source):
        old = merged.get(name)
        if old is None:
            order.append(name)
            merged[name] = Param(name, value, source)
        else:
            replaced = old.value if old.value != value else old.replaced
            merged[name] = Param(name, value, source, replaced)

    for name, value in ours:
        put(name, value, "ours")
    for name, value in from_env(user_env):
        put(name, value, "OMPI_MCA_" + name)
    for name, value in user_args:
        put(name, value, "MNP_LAUNCHER_ARGS")
    return [merged[name] for name in order]


def runner_conflicts(params, fixed=RUNNER_FIXED):
    """``(notes, problems)`` for DeepSpeed's openmpi runner, whose command line fixes ``fixed``:
    a user value that differs cannot take effect (a problem); ours that differs is a note."""
    notes, problems = [], []
    by_name = dict((p.name, p) for p in params)
    for name, value in fixed:
        param = by_name.get(name)
        if param is None or param.value == value:
            continue
        if param.source == "ours":
            notes.append("DeepSpeed's openmpi runner passes --mca %s %s on its own command line, "
                         "which beats our %s=%s; MNP_DEEPSPEED_LAUNCHER=pdsh avoids it"
                         % (name, value, name, param.value))
        else:
            problems.append("%s=%s (from %s) cannot take effect: DeepSpeed's openmpi runner "
                            "passes --mca %s %s on its own command line; use "
                            "MNP_DEEPSPEED_LAUNCHER=pdsh" % (name, param.value, param.source,
                                                              name, value))
    return notes, problems
