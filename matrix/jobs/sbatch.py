"""Slurm batch scripts for a stack on a cluster with pyxis and enroot (AWS ParallelCluster).

:class:`SlurmWriter` (``WRITER``) writes what ``sbatch`` takes: ``#SBATCH`` lines for the
nodes, the tasks per node, the instance's GPUs and an exclusive allocation, the job's ``MNP_*``
environment as ``export`` lines, and one ``srun`` line whose every task runs the stack image
through pyxis with ``mnp-entrypoint`` as its own command.

pyxis does not run the image's ENTRYPOINT per task. It starts each node's container once per
step, as ``enroot start --conf SCRIPT NAME sh -c "kill -STOP $$ ; exit 0"``, waits until that
shell stops itself, then joins every task of the node into the container's user, cgroup and
mount namespaces with ``setns`` and runs the task's own command there (NVIDIA/pyxis
pyxis_slurmstepd.c:941-963 and :1340-1441 at 2ca2427d4bd709627ce5e696c39fed4e143c7a48). With
``--container-entrypoint`` only that one start goes through the ENTRYPOINT: enroot's ``/etc/rc``
runs ``exec ENTRYPOINT "$@"`` (NVIDIA/enroot src/docker.sh:214-226 at
2e3ce06592f69119c30467221a35c39b2c339f2a) in an environment enroot loads from one file after
``clearenv`` (bin/common.h:147-164 at 2e3ce065): the image's ``ENV``, the ``--container-env``
names and what enroot's hooks append. ``SLURM_PROCID`` and ``SLURM_LOCALID`` never reach it
(pyxis_slurmstepd.c:339-358), other Slurm variables only where the site installed enroot's
conf/hooks/extra/50-slurm-pmi.sh (:24 at 2e3ce065). Our entrypoint would run there without its
task's rank, run the ``sh`` as its child and never stop itself, so the step would hang. Hence:

- ``--container-image``: the image by digest, in enroot's form (:func:`enroot_image`);
- ``--no-container-entrypoint``: never the ENTRYPOINT at container start, even where the site
  sets pyxis' ``execute_entrypoint=1`` (the default is off, NVIDIA/pyxis config.c:36 at 2ca2427d;
  the flag wins, pyxis_slurmstepd.c:114);
- ``--container-env``: every variable the script exports. pyxis copies the container's
  environment (the image's ``ENV``) over each task's, except the names listed here
  (pyxis_slurmstepd.c:619-629 at 2ca2427d; the option's help says the same, NVIDIA/pyxis
  args.c:146-153 at 2eb8b711d9b314cc438a2091b008b3f6f51af843), so an image ``ENV`` would
  otherwise win over the job's settings;
- ``--container-mounts``: the job's ``--mount`` folders (``SRC:DST[:ro]``, comma-separated);
- the command: :data:`ENTRYPOINT` (the image's ENTRYPOINT, by its installed path), then the
  user's command, so every task reads its own Slurm variables.

How the tasks are laid out follows the entrypoint's Slurm unit (:func:`layout`):

- ``mpirun`` with ``ranks="srun"`` (the default): every rank is a Slurm task (``srun
  --mpi=pmix``, one task per slot; the entrypoint sees ``PMIX_RANK`` and runs the command).
  Debian's and Ubuntu's Open MPI have no PMI-2, so the script never uses ``--mpi=pmi2``;
- ``mpirun`` with ``ranks="mpirun"``: mpirun inside the allocation, for a Slurm without PMIx or
  a job that needs mpirun's own options. One task per node; the entrypoints wire the step's nodes
  themselves (``entrypoint/settings/wiring.py``: rendezvous with node 0, per-job SSH on
  ``MNP_SSH_PORT``), because mpirun in a pyxis container cannot start its daemons through the
  ``srun`` the container does not have; node 0 runs mpirun over that SSH. DeepSpeed's runners
  (pdsh or mpirun over SSH) are wired the same way;
- torchrun, torch.distributed.launch and none: one task per node, which starts the node's
  processes with the master taken from the node list. ``none`` means every task runs the
  command itself, with Slurm as its launcher; a command that is itself a launcher (``mpirun
  ...``) is refused on more than one node (:func:`check_command`): it would run alone on every
  node.

Every one-task-per-node step says ``--mpi=none``: a site whose ``slurm.conf`` sets
``MpiDefault=pmix`` would otherwise give each task ``PMIX_RANK``, and the entrypoint would take the
task for one rank of an MPI job and skip its launcher (srun's ``--mpi`` defaults to
``MpiDefault``, https://slurm.schedmd.com/srun.html#OPT_mpi; ``MpiDefault`` itself is documented in
slurm.conf(5), https://slurm.schedmd.com/slurm.conf.html#OPT_MpiDefault; the option on the command line wins
over ``SLURM_MPI_TYPE`` in the environment, https://slurm.schedmd.com/srun.html#SECTION_INPUT-
ENVIRONMENT-VARIABLES). Where the entrypoint wires the nodes the script makes a secret for the
step (``MNP_SECRET``, 32 random bytes from ``/dev/urandom`` on the batch host), so only this job's
tasks can join its rendezvous. srun passes the submitting environment to every task
(``--export=ALL`` is its default, https://slurm.schedmd.com/srun.html#OPT_export).
The pyxis play in tests/integration (pyxis_play.py) runs these scripts on a Slurm cluster.

A failure a new allocation can fix is requeued: the script asks for ``--requeue`` and, when the
srun step ends with one of :data:`REQUEUE_EXIT_CODES` (the entrypoint's infrastructure class:
a node that never joined, a peer lost, a failed health check), runs ``scontrol requeue`` on its
own job while ``SLURM_RESTART_COUNT`` (unset on the first run, then the number of restarts)
leaves attempts of ``max_attempts``. Any other status, the user's own failures included, ends the
job with that status. Every attempt appends to the one output file (``--open-mode=append``).
Slurm 22.05's manuals for these: https://slurm.schedmd.com/sbatch.html#OPT_requeue,
https://slurm.schedmd.com/sbatch.html#OPT_SLURM_RESTART_COUNT and
https://slurm.schedmd.com/scontrol.html#OPT_requeue.

:class:`SlurmWriter` (``WRITER``, see ``matrix/jobs/writer.py``) renders a job spec so for
``invoke sbatch`` and ``invoke explain``, and :func:`slurm_roles` reads each task back from the
script as srun starts it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from entrypoint import launchers
from entrypoint.core.errors import INFRASTRUCTURE_EXIT
from matrix.errors import UsageError, UserError
from matrix.jobs.mounts import Mount, pyxis_mounts
from matrix.jobs.roles import Devices, Role
from matrix.jobs.runopts import Option, RunOpts
from matrix.jobs.spec import (
    DEFAULT_ATTEMPTS,
    MAX_ATTEMPTS,
    JobSpec,
    check_launcher_command,
    comment_lines,
    is_pinned,
)
from matrix.jobs.writer import Prepared, Variant, Writer
from matrix.model.instances import InstanceType, get_instance_type

# The launchers whose ranks Slurm can start itself (``ranks="srun"``); the others run once per node.
PER_RANK = ("mpirun",)
# Who starts the ranks of an mpirun job: srun (every task a rank) or mpirun from node 0.
RANKS = ("srun", "mpirun")


def wired_by_entrypoint(launcher: str) -> bool:
    """Whether ``launcher`` reaches the other nodes over SSH from node 0 (its unit declares
    ``needs_ssh``) and runs on node 0 alone: under a Slurm step the entrypoints then wire the
    nodes themselves (entrypoint/settings/wiring.py), which wants a secret per job. ``none``
    needs SSH on Batch's main node, but under Slurm every task runs the command itself."""
    return launchers.UNITS[launcher].needs_ssh and launcher != launchers.AS_IS
# 32 random bytes as hex, made on the batch host for the step's rendezvous (od and tr: coreutils).
# A plain assignment, not `export NAME="$(...)"`, whose status is export's own (0) whatever the
# substitution did: set -e then stops the script when od fails, and the length check when it gives
# too little; an empty secret would leave the rendezvous open to any host.
SECRET_LINES = (
    'MNP_SECRET="$(od -An -N32 -tx1 /dev/urandom | tr -d \' \\n\')"',
    '[ "${#MNP_SECRET}" -eq 64 ] || { echo "mnp: cannot make MNP_SECRET from /dev/urandom: the '
    'job stops here" >&2; exit 1; }',
    "export MNP_SECRET",
)
# Where the entrypoint layer installs the image's ENTRYPOINT (images/entrypoint/Dockerfile.j2).
ENTRYPOINT = "/usr/local/bin/mnp-entrypoint"
# The entrypoint's exit codes for a failure of the infrastructure, which a requeue on other nodes
# can fix (its failure classes, defined once in entrypoint/core/errors.py); the tests read them here.
REQUEUE_EXIT_CODES = (INFRASTRUCTURE_EXIT,)
# --container-env came with pyxis 0.15.0 (commit 5164d82a6b8099c294fb512437afd85542578df6, after
# v0.14.0); an older pyxis rejects the srun line's option.
PYXIS_MINIMUM = "0.15.0"
PYXIS_SOURCE = "https://github.com/NVIDIA/pyxis/releases/tag/v0.15.0"
# Docker's rule for the first part of a reference: a registry host when it has '.' or ':' or is
# localhost (github.com/distribution/reference, normalize.go splitDockerDomain).
_REGISTRY = re.compile(r"^(localhost|[^/]*[.:][^/]*)$")


@dataclass(frozen=True)
class Layout:
    """How the job sits on its nodes: tasks per node, whether srun starts MPI ranks, and whether
    the entrypoints wire the nodes themselves (one task per node, a launcher that needs SSH)."""

    tasks_per_node: int
    mpi: bool
    wired: bool = False


def check_ranks(launcher: str, ranks: str) -> None:
    """``--ranks``: one of :data:`RANKS`, and ``mpirun`` only for a launcher whose ranks Slurm
    could start (the others run one task per node whatever is asked)."""
    if ranks not in RANKS:
        raise UsageError(f"--ranks {ranks!r}: expected one of {', '.join(RANKS)}")
    if launcher not in PER_RANK and ranks != RANKS[0]:
        raise UsageError(f"--ranks {ranks}: only for --launcher mpirun ({launcher} runs one task "
                         "per node)")


def layout(instance: InstanceType, launcher: str, ranks: str = "srun") -> Layout:
    check_ranks(launcher, ranks)
    if launcher in PER_RANK and ranks == "srun":
        return Layout(instance.slots_per_node(), True)
    return Layout(1, False, wired_by_entrypoint(launcher))


def check_command(launcher: str, nodes: int, command: Sequence[str], ranks: str = "srun") -> None:
    """Refuse a command that is itself a launcher where the script would start another around
    it (:func:`~matrix.jobs.spec.check_launcher_command`), and ``--launcher none`` with such a
    command on more than one node.

    Under Slurm ``none`` means one thing: every task (one per node) runs the command itself, with
    Slurm's variables and the job's ``MNP_*`` settings; Slurm is its launcher. A command that is a
    launcher (``mpirun ...``, ``deepspeed ...``, ``torchrun ...``) would then run on every node
    alone, with no hostfile, SSH or secret: as many separate jobs as nodes. The entrypoint's plan
    refuses it too (``entrypoint/plan/roles.py``); here it is said in the writer's own words."""
    own = launchers.launcher_command(list(command))
    unit = launchers.command_unit(list(command)) or PER_RANK[0]
    how = (f"--launcher {unit} --ranks mpirun (node 0 runs mpirun over the job's own SSH, the "
           "other nodes serve it) or --launcher mpirun (every task a rank)" if unit in PER_RANK
           else f"--launcher {unit} (" + ("node 0 runs it over the job's own SSH, the other nodes "
                                          "serve it)" if wired_by_entrypoint(unit) else
                                          "every node runs it with its node rank)"))
    wraps = ("srun starts one task a rank and every task would run it" if launcher in PER_RANK
             and ranks == RANKS[0] else f"node 0's entrypoint would start {launcher} around it")
    check_launcher_command(launcher, command, f"under Slurm with --launcher {launcher}, {wraps}",
                           f"give the program alone (e.g. -- python3 train.py) with {how}")
    if launcher != launchers.AS_IS or nodes < 2 or not own:
        return
    raise UsageError(f"--launcher none with a command that starts {own} itself: under Slurm every "
                    f"task runs the command as is, so {nodes} nodes would each start {own} alone "
                    f"(no hostfile, SSH or secret); give the program alone with {how}")


def enroot_image(image_uri: str) -> str:
    """``registry/repo@sha256:<hex>`` as pyxis/enroot take it: ``registry#repo:sha256:<hex>``.

    enroot parses ``[USER@][REGISTRY#]IMAGE[:TAG]`` with ':' allowed in the tag and fetches
    ``/v2/<image>/manifests/<tag>``, so the tag ``sha256:<hex>`` asks the registry for exactly that
    manifest digest (NVIDIA/enroot src/docker.sh:243-253 and :120 at
    2e3ce06592f69119c30467221a35c39b2c339f2a); '@' is not part of that syntax there, and '/'
    after the host would be read as part of the image.
    """
    if not is_pinned(image_uri):
        raise UsageError(f"--image-uri {image_uri!r} must name the image by digest (@sha256:...)")
    repo, digest = image_uri.split("@", 1)
    first, _, rest = repo.partition("/")
    if rest and _REGISTRY.match(first):
        return f"{first}#{rest}:{digest}"
    return f"{repo}:{digest}"


def _directives(stack: str, nodes: int, instance: InstanceType, tasks: int) -> list[str]:
    lines = [f"--job-name=mnp-{stack}", f"--nodes={nodes}", f"--ntasks-per-node={tasks}"]
    if instance.gpus:
        lines.append(f"--gpus-per-node={instance.gpus}")
    # whole nodes: the job uses every GPU, EFA interface and core of the instance; requeued on
    # an infrastructure failure (see requeue_lines), every attempt's output in one file
    lines += ["--exclusive", f"--output=mnp-{stack}-%j.out", "--requeue", "--open-mode=append"]
    return [f"#SBATCH {line}" for line in lines]


def requeue_lines(max_attempts: int) -> list[str]:
    """After the srun step: requeue the job on an infrastructure exit code while attempts are
    left, else end with the step's status."""
    codes = "|".join(str(code) for code in REQUEUE_EXIT_CODES)
    return [
        "# A failure of the infrastructure (mnp-entrypoint's exit code "
        f"{' or '.join(codes.split('|'))}) is requeued on",
        f"# a new allocation, {max_attempts} attempts in all; any other status ends the job.",
        f"max_attempts={max_attempts}",
        "attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))",
        f'case "$status" in {codes})',
        '  if [ "$attempt" -lt "$max_attempts" ]; then',
        '    echo "mnp: attempt $attempt of $max_attempts ended with the infrastructure exit code'
        ' $status: requeueing job $SLURM_JOB_ID" >&2',
        '    scontrol requeue "$SLURM_JOB_ID" || echo "mnp: scontrol requeue $SLURM_JOB_ID failed:'
        ' the job ends here" >&2',
        "  fi",
        "  ;;",
        "esac",
        'exit "$status"',
    ]


def _srun(image: str, shape: Layout, mounts: Sequence[Mount], env_names: Sequence[str],
          command: Sequence[str]) -> str:
    words = ["srun", "--mpi=pmix" if shape.mpi else "--mpi=none"]
    words += [f"--container-image={image}", "--no-container-entrypoint",
              f"--container-env={','.join(env_names)}"]
    if mounts:
        words.append(f"--container-mounts={pyxis_mounts(mounts)}")
    quoted = [shlex.quote(word) for word in words]
    task = " ".join(shlex.quote(word) for word in [ENTRYPOINT, *command])
    return " \\\n  ".join(quoted + [task + " || status=$?"])


def _script(stack: str, nodes: int, instance: InstanceType, image_uri: str,
            command: Sequence[str], shape: Layout, environment: Mapping[str, str],
            mounts: Sequence[Mount], max_attempts: int, notices: Sequence[str]) -> str:
    """The script from checked parts (a :class:`JobSpec`'s and the layout)."""
    image = enroot_image(image_uri)
    head = [
        "#!/bin/bash",
        f"# {stack} on {nodes} x {instance.name}, written by `invoke sbatch`; submit with sbatch.",
        f"# Needs pyxis >= {PYXIS_MINIMUM} (the first with --container-env: {PYXIS_SOURCE})",
        "# and enroot on the cluster. Every task runs mnp-entrypoint, which reads its own Slurm",
        "# variables; pyxis never runs the image's ENTRYPOINT per task.",
        *comment_lines(notices),
        *_directives(stack, nodes, instance, shape.tasks_per_node),
        "set -euo pipefail",
        "",
        "# The job's settings for the entrypoint: srun exports them to every task, and",
        "# --container-env keeps their values over any the image's ENV sets.",
    ]
    names = sorted(environment)
    exports = [f"export {name}={shlex.quote(environment[name])}" for name in names]
    if shape.wired:
        exports += ["# the step's nodes join node 0's rendezvous: only this job's tasks know this",
                    *SECRET_LINES]
        names = sorted(names + ["MNP_SECRET"])
    step = ["", "status=0", _srun(image, shape, mounts, names, command), ""]
    return "\n".join(head + exports + step + requeue_lines(max_attempts)) + "\n"


def directives(script: str) -> dict[str, str]:
    """The ``#SBATCH --name=value`` lines of ``script`` as a dict (tests and explain read them)."""
    found = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            name, _, value = line[len("#SBATCH "):].partition("=")
            found[name] = value
    return found


# -- the roles of a script --------------------------------------------------------------------------
# The script's ``export`` lines (srun passes the batch script's environment to every task:
# ``--export=ALL`` is its default) plus what srun sets per task for the script's one srun line
# and ``#SBATCH`` lines: ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NODEID`` and the step's counts
# and node list, GPUs where ``--gpus-per-node`` asks, and ``PMIX_RANK`` with ``--mpi=pmix``
# (SLURM_SOURCE, measured on Slurm 22.05 in the project's Slurm play). The step's ``MNP_SECRET``
# is made by the script at run time: a placeholder of its length stands for it.
SLURM_SOURCE = ("https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES; "
                "https://slurm.schedmd.com/srun.html#OPT_export (ALL by default)")
SECRET_PLACEHOLDER = "0" * 64  # the length of the step secret the sbatch script makes


def slurm_roles(script: str, instance_type: str | None = None,
                job_id: str = "1234") -> list[Role]:
    """Node 0's first task and the last node's last task, as srun starts them; on
    ``instance_type`` (default: the one the script tells the entrypoint, ``MNP_INSTANCE_TYPE``)."""
    options = directives(script)  # the writer's own reader of its #SBATCH lines
    nodes = int(options["--nodes"])
    per_node = int(options.get("--ntasks-per-node", "1"))
    gpus = int(options.get("--gpus-per-node", "0"))
    exports = _exports(script)
    srun, task = _srun_line(script)
    instance = get_instance_type(instance_type or exports["MNP_INSTANCE_TYPE"])
    tasks = nodes * per_node
    hosts = f"node[1-{nodes}]" if nodes > 1 else "node1"
    spread = f"{per_node}(x{nodes})" if nodes > 1 else str(per_node)
    roles = []
    for node, local in sorted({(0, 0), (nodes - 1, per_node - 1)}):
        rank = node * per_node + local
        env = dict(exports)
        env.update(SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_STEP_ID="0", SLURM_STEPID="0",
                   SLURM_NODEID=str(node), SLURM_PROCID=str(rank), SLURM_LOCALID=str(local),
                   SLURM_NTASKS=str(tasks), SLURM_NPROCS=str(tasks), SLURM_NNODES=str(nodes),
                   SLURM_JOB_NUM_NODES=str(nodes), SLURM_JOB_NODELIST=hosts,
                   SLURM_NODELIST=hosts, SLURM_STEP_NODELIST=hosts,
                   SLURM_STEP_NUM_NODES=str(nodes), SLURM_STEP_NUM_TASKS=str(tasks),
                   SLURM_STEP_TASKS_PER_NODE=spread, SLURM_TASKS_PER_NODE=spread,
                   SLURMD_NODENAME=f"node{node + 1}")
        if gpus:
            env.update(SLURM_GPUS_ON_NODE=str(gpus),
                       CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(gpus)))
        if "--mpi=pmix" in srun:
            env.update(PMIX_RANK=str(rank), PMIX_NAMESPACE=f"slurm.pmix.{job_id}.0")
        # --exclusive whole nodes through pyxis: the container shares the host's /dev
        devices = Devices(gpus, instance.hpus, instance.efa_interfaces)
        roles.append(Role(f"node {node} task {local}", env, task, devices, instance.name))
    return roles


def _exports(script: str) -> dict[str, str]:
    """The script's ``export NAME=value`` lines; a secret the script makes is a placeholder."""
    env = {}
    for line in script.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export "):].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        elif line.startswith("export "):  # `export MNP_SECRET` after the script made it
            env[line.split()[1]] = SECRET_PLACEHOLDER
    return env


def _srun_line(script: str) -> tuple[list[str], list[str]]:
    """The srun line's options and the task's argv (the words after the ENTRYPOINT path)."""
    text = script.replace("\\\n", " ")
    (line,) = [item for item in text.splitlines() if item.lstrip().startswith("srun ")]
    words = shlex.split(line.split(" || ")[0])
    first = next(i for i, word in enumerate(words) if not word.startswith("-") and i > 0)
    return words[:first], words[first + 1:]


# -- the writer -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmOptions:
    """What a Slurm script takes besides the :class:`JobSpec`: who starts an mpirun job's ranks
    (``srun``, every task a rank, or ``mpirun`` from node 0; :data:`RANKS`)."""

    ranks: str = "srun"


def plan_scheduler(launcher: str, ranks: str) -> str:
    """The adapter whose plan the tasks of the script run: with ``srun --mpi=pmix`` every task is
    one rank and the plan to check is mpirun's main node's (what the ranks need from the stack,
    Batch's); otherwise the entrypoint runs once per node of a Slurm step."""
    return "batch" if launcher in PER_RANK and ranks == RANKS[0] else "slurm"


SLURM_OPTIONS = RunOpts((
    Option("launcher", "what each task runs: mpirun (one task per rank), deepspeed, torchrun, "
           "torch.distributed.launch (one task per node) or none (every task runs the command "
           "itself)", choices=tuple(launchers.NAMES), default="mpirun", example="mpirun",
           what="launcher",
           variable="MNP_LAUNCHER"),
    Option("ranks", "with --launcher mpirun, who starts the ranks: srun (srun --mpi=pmix, needs "
           "Slurm's PMIx) or mpirun (from node 0 over the job's own SSH, one task per node)",
           choices=RANKS, default=RANKS[0], example="srun", what="rank starter"),
    Option("attempts", "runs of the job: scontrol requeue after an infrastructure failure (exit "
           "200), never after a failing command", kind=int, default=DEFAULT_ATTEMPTS, minimum=1,
           maximum=MAX_ATTEMPTS, example="2"),
))


class SlurmWriter(Writer):
    """Slurm batch scripts through pyxis and enroot: ``invoke sbatch``."""

    task = "sbatch"
    summary = "Slurm batch script (pyxis/enroot, ParallelCluster) running a stack on every node"
    file_name = "job.sbatch"
    scheduler_name = "Slurm"
    schedulers = ("slurm",)
    what = "the srun line's command"

    def run_options(self) -> RunOpts:
        return SLURM_OPTIONS

    def prepare(self, values: dict[str, Any]) -> Prepared:
        check_ranks(values["launcher"], values["ranks"])
        return Prepared(values["launcher"], SlurmOptions(values["ranks"]), values["attempts"])

    def launch_note(self, launcher: str, options: Any) -> str:
        ranks = (options or SlurmOptions()).ranks
        if launcher in PER_RANK and ranks == RANKS[0]:
            return "srun --mpi=pmix starts every rank, one task each, and runs the command"
        if launcher in PER_RANK or wired_by_entrypoint(launcher):
            return f"one task a node; node 0 runs {launcher} over the job's own SSH"
        return "one task a node"

    def variants(self) -> tuple[Variant, ...]:
        """Every launcher with srun starting the tasks, and mpirun starting its ranks itself."""
        found = [Variant(f"{name}/srun", name, SlurmOptions("srun"),
                         plan_scheduler(name, "srun")) for name in launchers.NAMES]
        found += [Variant(f"{name}/mpirun", name, SlurmOptions("mpirun"),
                          plan_scheduler(name, "mpirun")) for name in PER_RANK]
        return tuple(found)

    def check(self, launcher: str, nodes: int, command: Sequence[str], options: Any) -> None:
        """A launcher run unwired on every node (:func:`check_command`), ``--ranks`` for a
        launcher that runs one task per node (:func:`layout`)."""
        ranks = (options or SlurmOptions()).ranks
        check_ranks(launcher, ranks)
        check_command(launcher, nodes, command, ranks)

    def render(self, spec: JobSpec, options: Any = None) -> str:
        options = options or SlurmOptions()
        if spec.elastic is not None:
            raise UserError("--elastic: only a pytorchjob has elastic bounds, not a Slurm job")
        self.check(spec.launcher, spec.nodes, spec.command, options)
        shape = layout(spec.instance, spec.launcher, options.ranks)
        return _script(spec.stack.name, spec.nodes, spec.instance, spec.image_uri, spec.command,
                       shape, spec.environment(), spec.mounts, spec.attempts, spec.notices)

    def text(self, artefact: str) -> str:
        return artefact

    def roles(self, artefact: str) -> list[Role]:
        return slurm_roles(artefact)


WRITER = SlurmWriter()
