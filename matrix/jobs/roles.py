"""Each role of a generated job as its scheduler starts it, read from the artefact itself: the
types every writer's role derivation yields.

Each writer derives its own artefact's roles beside the code that writes it
(``matrix.jobs.writer.Writer.roles``): the environment, arguments, devices and mounted files the
scheduler gives each distinct role, read from what was generated, never from a second model of
the job: ``jobdef.batch_roles`` (AWS Batch: the node range's container plus what Batch adds per
node), ``sbatch.slurm_roles`` (the script's exports plus what srun sets per task),
``k8s.k8s_roles`` (each pod template plus what the Kubeflow operators inject per role). The
names the schedulers inject are the entrypoint's adapters' (``entrypoint/schedulers``), which cite
the same sources; every value comes from the artefact.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Devices:
    """What the scheduler passes into the container."""

    gpus: int = 0
    hpus: int = 0
    efa: int = 0


@dataclass
class Role:
    """One role's container as started: ``argv`` is what the image's ENTRYPOINT gets (the
    container's command or args); ``files`` what the scheduler mounts (path: content)."""

    name: str
    env: dict[str, str]
    argv: list[str]
    devices: Devices
    instance_type: str
    files: dict[str, str] = field(default_factory=dict)
