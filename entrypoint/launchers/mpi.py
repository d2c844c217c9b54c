"""Open MPI's settings for a unit that starts ranks with mpirun (mpirun itself, DeepSpeed's openmpi
runner, a script run as is on Batch's wired nodes): ours, the user's ``OMPI_MCA_*`` and the
``--mca`` pairs of ``MNP_LAUNCHER_ARGS`` merged into one set (``mca``), each set as an
``OMPI_MCA_*`` variable, so nothing is listed twice on any command line.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import mca

WHY = {
    "btl_tcp_if_include": "MPI's TCP traffic on the job's interface",
    "oob_tcp_if_include": "Open MPI's control traffic on the job's interface",
    "pml": "ob1: MPI point-to-point over the BTLs (TCP); NCCL carries the GPU traffic",
    "btl": "no openib BTL (it probes InfiniBand devices, EFA is not one)",
    "plm_rsh_no_tree_spawn": "mpirun starts every node's daemon itself (no ssh between children)",
    "orte_abort_on_non_zero_status": "one failed rank stops the job",
    "orte_default_hostfile": "a script's own mpirun finds the job's hosts",
    "plm_rsh_args": "mpirun's ssh uses the per-job keys and known_hosts",
    "plm": "daemons started over the job's own SSH, not with srun (none in a pyxis container)",
    "ras": "the hosts from the job's hostfile, not from Slurm's variables (its allocation names "
           "the nodes by Slurm's names, the hostfile by address)",
}
# Open MPI 4 (ORTE, every stack's) picks its Slurm launcher and allocation reader whenever
# SLURM_JOBID is set (srun sets it in every task): open-mpi/ompi
# orte/mca/plm/slurm/plm_slurm_component.c:112 (orte_plm_slurm_component_query) at b67dba36 and
# orte/mca/ras/slurm/ras_slurm_component.c (orte_ras_slurm_component_query) at 30597832. The
# first starts the daemons with srun, the second rejects a hostfile host not in the allocation.
SLURM_SELECTS = "SLURM_JOBID"
SLURM_SOURCE = ("open-mpi/ompi orte/mca/plm/slurm/plm_slurm_component.c:112 at b67dba36, "
                "orte/mca/ras/slurm/ras_slurm_component.c orte_ras_slurm_component_query at "
                "30597832 (both chosen whenever SLURM_JOBID is set)")
SOURCES = {
    "orte_default_hostfile": "kubeflow/mpi-operator pkg/controller/mpi_job_controller.go "
                             "(OMPI_MCA_orte_default_hostfile)",
    "orte_abort_on_non_zero_status": "https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php",
    "plm": SLURM_SOURCE,
    "ras": SLURM_SOURCE,
}


def fabric_params(interface: Optional[str]) -> List[Tuple[str, str]]:
    """Open MPI parameters: MPI's own traffic over TCP on the job's interface."""
    params = []
    if interface:
        params += [("btl_tcp_if_include", interface), ("oob_tcp_if_include", interface)]
    return params + [("pml", "ob1"), ("btl", "^openib")]


def our_params(interface: Optional[str], hostfile_path: Optional[str],
               rsh_args: Optional[str], in_slurm_job: bool = False) -> List[Tuple[str, str]]:
    """Ours; ``in_slurm_job``: mpirun reaches the hosts over our SSH from inside a Slurm step
    (the entrypoints wired the step's nodes), where Open MPI would otherwise take Slurm's way."""
    params = fabric_params(interface) + [("plm_rsh_no_tree_spawn", "1"),
                                         ("orte_abort_on_non_zero_status", "1")]
    if hostfile_path:
        params.append(("orte_default_hostfile", hostfile_path))
    if rsh_args is not None:
        params.append(("plm_rsh_args", rsh_args))
        if in_slurm_job:
            params += [("plm", "rsh"), ("ras", "^slurm")]
    return params


def apply(plan: Any, env: Any, unit: Any, interface: Optional[str], user_env: Dict[str, str],
          launcher_args: Sequence[str], hostfile_path: Optional[str]) -> List[str]:
    """Merge ours, the user's ``OMPI_MCA_*`` and the ``--mca`` pairs of the launcher arguments,
    set them as ``OMPI_MCA_*`` in ``env`` (the user's ``--mca`` also into ``user_env``, so it
    replaces ours), record them in ``plan.mca`` and ``plan.kept``; return the launcher arguments
    without the ``--mca`` pairs."""
    try:
        user_params, args = mca.split_args(list(launcher_args))
    except mca.McaError as exc:
        plan.problems.append("MNP_LAUNCHER_ARGS: %s" % exc)
        user_params, args = [], list(launcher_args)
    ours = our_params(interface, hostfile_path, env.as_dict().get("OMPI_MCA_plm_rsh_args"),
                      bool(user_env.get(SLURM_SELECTS)))
    params = mca.merge(ours, user_env, user_params)
    plan.mca = [p.to_list() for p in params]
    for p in params:
        _set(env, user_env, p)
        if p.replaced is not None:
            plan.kept.append("%s=%s from %s (ours: %s)" % (p.name, p.value, p.source, p.replaced))
    notes, problems = unit.mpi_findings(params)
    plan.notes.extend(notes)
    plan.problems.extend(problems)
    return args


def _set(env: Any, user_env: Dict[str, str], param: Any) -> None:
    name = "OMPI_MCA_" + param.name
    if param.source == "ours":
        env.set(name, param.value, WHY.get(param.name, "Open MPI parameter"),
                SOURCES.get(param.name, ""))
    elif param.source == "MNP_LAUNCHER_ARGS":
        # the user's --mca, moved into the environment so that it replaces ours
        env.set(name, param.value, "--mca %s from MNP_LAUNCHER_ARGS (replaces ours: %s)"
                % (param.name, param.replaced) if param.replaced else
                "--mca %s from MNP_LAUNCHER_ARGS" % param.name)
        user_env[name] = param.value
