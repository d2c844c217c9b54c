"""The mpirun (Open MPI) launcher unit: SSH, nothing started on children, ``-x NAME`` for every rank.

Main node only: ``mpirun [--allow-run-as-root] -np <sum of slots> --hostfile <file> --bind-to none
--map-by slot [--tag-output] -x <NAME>... <MNP_LAUNCHER_ARGS without --mca> <program>``.
``--allow-run-as-root`` only when running as root. ``-np`` comes from ``MNP_NP`` or an
``-np``/``-n``/``-c`` in ``MNP_LAUNCHER_ARGS`` when the user gives one. ``-x`` lists every variable
of the job's environment except the node-specific ones (``base.NODE_SPECIFIC``,
``base.NODE_SPECIFIC_PREFIXES``): the job definition's variables, ``AWS_REGION`` and the task
role's ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` reach every rank. Open MPI parameters are not on
the command line at all: they are ``OMPI_MCA_*`` variables (``mca``). The SSH port and keys reach
mpirun's ``ssh`` through ``OMPI_MCA_plm_rsh_args=-F <ssh_config>``. A program ending in ``.py``
gets ``python3`` in front.

``--tag-output`` only with ``MNP_TAG_OUTPUT=1``: Open MPI 4 tags each chunk it forwards, not each
line (orte/mca/iof/base/iof_base_output.c, ``orte_iof_base_write_output``: a tag at the start of
every chunk and after every newline, and a newline added at the end of a chunk that has none), so a
line longer than one chunk arrives cut into several tagged lines. Without it the ranks' bytes
arrive as they wrote them; the final line still names the failed rank (``run.attribution``: Open
MPI's own abort message).
"""

import os
from typing import Any, List, Mapping, Sequence

from ..probe.facts import NodeFacts
from .base import Launch, LaunchRequest, Unit, python_program

SOURCE = "https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php (-x, --hostfile)"
NP_FLAGS = ("-np", "--np", "-n", "-c", "--n")
# Options of the user's that place the ranks otherwise than slot by slot in hostfile order: then
# a rank's node is known only where Open MPI's message names it.
MAPPING_FLAGS = ("--map-by", "-map-by", "--rankfile", "-rf", "--npernode", "-npernode",
                 "--npersocket", "-npersocket", "--ppr", "-ppr", "--bynode", "-bynode",
                 "--host", "-H", "-host", "--rank-by", "-rank-by")


class Mpirun(Unit):
    name = "mpirun"
    order = 10
    needs_ssh = True
    on_children = "nothing to start: mpirun reaches this node over SSH"
    env_propagation = "mpirun -x NAME for every exported variable"
    binary = "mpirun"
    source = SOURCE
    reaches_hosts = True
    programs = ("mpirun", "mpiexec")
    options = ("MNP_TAG_OUTPUT",)

    def uses_mpi(self, facts: NodeFacts, options: Mapping[str, Any], rendezvous: bool) -> bool:
        return True

    def launch(self, request: LaunchRequest) -> Launch:
        facts = request.facts
        program = facts.binaries.get("mpirun")
        launch = Launch(command_line(program or "mpirun", request.command, request.np,
                                     request.hostfile, request.exports, request.launcher_args,
                                     facts.is_root,
                                     bool(request.options.get("MNP_TAG_OUTPUT"))))
        if not program:
            launch.problems.append("mpirun not found on PATH: install Open MPI or set "
                                   "MNP_LAUNCHER")
        return launch


UNIT = Mpirun()


def user_sets_np(args: Sequence[str]) -> bool:
    return any(a in NP_FLAGS or a.startswith(("-np=", "--np=", "-n=")) for a in args)


def maps_by_slot(argv: Sequence[str]) -> bool:
    """Whether mpirun's ranks fill the hostfile's nodes slot by slot in order (rank R on the
    node whose slots hold it): our ``--map-by slot`` and none of the user's own placement."""
    if not argv or os.path.basename(argv[0]) not in Mpirun.programs:
        return True  # DeepSpeed's world info numbers the ranks the same way
    flags = [a.split("=", 1)[0] for a in argv]
    return flags.count("--map-by") <= 1 and not any(
        flag in MAPPING_FLAGS for flag in flags if flag != "--map-by")


def command_line(mpirun: str, command: Sequence[str], np: int, hostfile: str,
                 exports: Sequence[str], launcher_args: Sequence[str] = (),
                 is_root: bool = False, tag_output: bool = False) -> List[str]:
    """The mpirun command line, run on the main node only."""
    line = [mpirun]
    if is_root:
        line.append("--allow-run-as-root")
    if not user_sets_np(launcher_args):
        line += ["-np", str(np)]
    if hostfile:
        line += ["--hostfile", hostfile]
    line += ["--bind-to", "none", "--map-by", "slot"]
    if tag_output and "--tag-output" not in launcher_args:
        line.append("--tag-output")
    for name in exports:
        line += ["-x", name]
    line += list(launcher_args)
    line += python_program(command)
    return line
