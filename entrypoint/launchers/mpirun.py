"""The mpirun (Open MPI) launcher unit: SSH, nothing started on children, ``-x NAME`` for every rank.

Main node only: ``mpirun [--allow-run-as-root] -np <sum of slots> --hostfile <file> --bind-to none
--map-by slot --tag-output -x <NAME>... <MNP_LAUNCHER_ARGS without --mca> <program>``.
``--allow-run-as-root`` only when running as root. ``-np`` comes from ``MNP_NP`` or an
``-np``/``-n``/``-c`` in ``MNP_LAUNCHER_ARGS`` when the user gives one. ``-x`` lists every variable
of the job's environment except the node-specific ones (``base.NODE_SPECIFIC``,
``base.NODE_SPECIFIC_PREFIXES``): the job definition's variables, ``AWS_REGION`` and the task
role's ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` reach every rank. Open MPI parameters are not on
the command line at all: they are ``OMPI_MCA_*`` variables (``mca``). The SSH port and keys reach
mpirun's ``ssh`` through ``OMPI_MCA_plm_rsh_args=-F <ssh_config>``. ``--tag-output`` prefixes
every line with the rank that wrote it. A program ending in ``.py`` gets ``python3`` in front.
"""

from typing import Dict, List, Sequence

from .base import Unit, python_program

SOURCE = "https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php (-x, --hostfile)"
UNIT = Unit("mpirun", True, "nothing to start: mpirun reaches this node over SSH",
            "mpirun -x NAME for every exported variable", "mpirun", SOURCE)
NP_FLAGS = ("-np", "--np", "-n", "-c", "--n")


def user_sets_np(args: Sequence[str]) -> bool:
    return any(a in NP_FLAGS or a.startswith(("-np=", "--np=", "-n=")) for a in args)


def argv(mpirun: str, command: Sequence[str], env: Dict[str, str], np: int, hostfile: str,
         mca_flags: Sequence[str], exports: Sequence[str], launcher_args: Sequence[str] = (),
         is_root: bool = False) -> List[str]:
    """The mpirun command line, run on the main node only."""
    line = [mpirun]
    if is_root:
        line.append("--allow-run-as-root")
    if not user_sets_np(launcher_args):
        line += ["-np", str(np)]
    if hostfile:
        line += ["--hostfile", hostfile]
    line += ["--bind-to", "none", "--map-by", "slot"]
    if "--tag-output" not in launcher_args:
        line.append("--tag-output")
    line += list(mca_flags)
    for name in exports:
        line += ["-x", name]
    line += list(launcher_args)
    line += python_program(command)
    return line
