"""Slurm batch scripts for a stack on a cluster with pyxis and enroot (AWS ParallelCluster).

:func:`build_sbatch_script` writes what ``sbatch`` takes: ``#SBATCH`` lines for the nodes, the
tasks per node, the instance's GPUs and an exclusive allocation, the job's ``MNP_*`` environment
as ``export`` lines, and one ``srun`` line that runs the stack image on every node through pyxis:

- ``--container-image``: the image by digest, in enroot's form (:func:`enroot_image`);
- ``--container-entrypoint``: pyxis runs the image's ENTRYPOINT only with it, and without the
  entrypoint nothing reads the Slurm variables (pyxis README, "--container-entrypoint");
- ``--container-mounts``: the job's ``--mount`` folders (``SRC:DST[:ro]``, comma-separated).

How the tasks are laid out follows the entrypoint's Slurm unit: with ``mpirun`` every rank is a
Slurm task (``srun --mpi=pmix``, one task per slot; the entrypoint sees ``PMIX_RANK`` and runs the
command); with torchrun, DeepSpeed or none, one task per node, which starts the node's processes
with the master taken from the node list. Debian's and Ubuntu's Open MPI have no PMI-2, so the
script never uses ``--mpi=pmi2``. srun passes the submitting environment to every task
(``--export=ALL`` is its default, https://slurm.schedmd.com/srun.html#OPT_export) and pyxis passes
it into the container.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from matrix.deploy.jobdef import DEFAULT_WAIT_TIMEOUT_S, is_pinned, mnp_environment
from matrix.deploy.mounts import Mount, pyxis_mounts
from matrix.errors import UserError
from matrix.model.instances import InstanceType, get_instance_type

# The launchers whose ranks Slurm starts itself; the others run once per node.
PER_RANK = ("mpirun",)
# Docker's rule for the first part of a reference: a registry host when it has '.' or ':' or is
# localhost (github.com/distribution/reference, normalize.go splitDockerDomain).
_REGISTRY = re.compile(r"^(localhost|[^/]*[.:][^/]*)$")


@dataclass(frozen=True)
class Layout:
    """How the job sits on its nodes: tasks per node and whether srun starts MPI ranks."""

    tasks_per_node: int
    mpi: bool


def layout(instance: InstanceType, launcher: str) -> Layout:
    if launcher in PER_RANK:
        return Layout(instance.slots_per_node(), True)
    return Layout(1, False)


def enroot_image(image_uri: str) -> str:
    """``registry/repo@sha256:<hex>`` as pyxis/enroot take it: ``registry#repo:sha256:<hex>``.

    enroot parses ``[USER@][REGISTRY#]IMAGE[:TAG]`` with ':' allowed in the tag and fetches
    ``/v2/<image>/manifests/<tag>``, so the tag ``sha256:<hex>`` asks the registry for exactly that
    manifest digest (NVIDIA/enroot src/docker.sh, ``docker::import`` and ``docker::_download``);
    '@' is not part of that syntax, and '/' after the host would be read as part of the image.
    """
    if not is_pinned(image_uri):
        raise UserError(f"--image-uri {image_uri!r} must name the image by digest (@sha256:...)")
    repo, digest = image_uri.split("@", 1)
    first, _, rest = repo.partition("/")
    if rest and _REGISTRY.match(first):
        return f"{first}#{rest}:{digest}"
    return f"{repo}:{digest}"


def _directives(stack: str, nodes: int, instance: InstanceType, tasks: int) -> list[str]:
    lines = [f"--job-name=mnp-{stack}", f"--nodes={nodes}", f"--ntasks-per-node={tasks}"]
    if instance.gpus:
        lines.append(f"--gpus-per-node={instance.gpus}")
    # whole nodes: the job uses every GPU, EFA interface and core of the instance
    lines += ["--exclusive", f"--output=mnp-{stack}-%j.out"]
    return [f"#SBATCH {line}" for line in lines]


def _srun(image: str, shape: Layout, mounts: Sequence[Mount], command: Sequence[str]) -> str:
    words = ["srun"]
    if shape.mpi:
        words.append("--mpi=pmix")
    words += [f"--container-image={image}", "--container-entrypoint"]
    if mounts:
        words.append(f"--container-mounts={pyxis_mounts(mounts)}")
    quoted = [shlex.quote(word) for word in words]
    return " \\\n  ".join(quoted + [" ".join(shlex.quote(word) for word in command)])


def build_sbatch_script(
    stack: str,
    nodes: int,
    instance_type: str,
    image_uri: str,
    command: Sequence[str],
    *,
    launcher: str = "mpirun",
    fabric: str | None = None,
    mounts: Sequence[Mount] = (),
    env: Mapping[str, str] | None = None,
    wait_timeout_s: int = DEFAULT_WAIT_TIMEOUT_S,
) -> str:
    """The batch script: ``nodes`` x ``instance_type`` running ``command`` in ``image_uri``."""
    instance = get_instance_type(instance_type)
    if nodes < 1:
        raise UserError(f"--nodes {nodes}: a job needs at least 1 node")
    if not command:
        raise UserError("no command given to run on the nodes (put it after --)")
    image = enroot_image(image_uri)
    shape = layout(instance, launcher)
    environment = mnp_environment(instance, launcher, fabric, wait_timeout_s, env)
    head = [
        "#!/bin/bash",
        f"# {stack} on {nodes} x {instance.name}, written by `invoke sbatch`; submit with sbatch.",
        "# Needs pyxis and enroot on the cluster (the image runs with its entrypoint, which reads",
        "# the Slurm variables of every task).",
        *_directives(stack, nodes, instance, shape.tasks_per_node),
        "set -euo pipefail",
        "",
        "# The job's settings for the entrypoint; srun exports them into every task's container.",
    ]
    exports = [f"export {name}={shlex.quote(value)}" for name, value in sorted(environment.items())]
    return "\n".join(head + exports + ["", _srun(image, shape, mounts, command)]) + "\n"


def directives(script: str) -> dict[str, str]:
    """The ``#SBATCH --name=value`` lines of ``script`` as a dict (tests and explain read them)."""
    found = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            name, _, value = line[len("#SBATCH "):].partition("=")
            found[name] = value
    return found
