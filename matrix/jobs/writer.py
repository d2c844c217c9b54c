"""The interface every job writer implements (one class per scheduler, Lightning style), so
that ``invoke explain``, the tasks and the contract test treat every writer alike.

A writer renders a :class:`~matrix.jobs.spec.JobSpec` into its scheduler's artefact (a Batch
job definition, an sbatch script, a Kubeflow manifest), writes the artefact as the text a user
submits, and reads each role back from the artefact as the scheduler starts it
(:class:`~matrix.jobs.roles.Role`): the role derivation lives beside the writer that makes the
artefact, so a new scheduler is one module (its writer class, its derivation and a module-level
``WRITER``) that :mod:`matrix.jobs.writers` finds by that mark.

``options`` are what a writer takes besides the spec, its own dataclass (a Slurm job's
``--ranks``, a Kubeflow kind, a Batch job's IAM roles): TorchX's scheduler run options, apart
from the job.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from matrix.jobs.roles import Role
from matrix.jobs.spec import JobSpec


@dataclass(frozen=True)
class Variant:
    """One way a writer writes a job: ``name`` (as the contract test reports it), the launcher
    it writes, the writer's ``options``, ``scheduler`` (the entrypoint's adapter name the roles
    are planned under, which the task's refusal of a plan with problems uses too) and whether the
    job has an elastic node range (``1:nodes``)."""

    name: str
    launcher: str
    options: Any
    scheduler: str
    elastic: bool = False


class Writer(ABC):
    """A scheduler's job writer.

    ``task``: the invoke task that writes the artefact (``--output``'s file name key);
    ``scheduler_name``: the scheduler as the task's refusals name it ("AWS Batch");
    ``schedulers``: the entrypoint's adapter names its roles are started under (what
    ``invoke explain --scheduler`` takes for this writer); ``what``: what the training command
    becomes in the artefact (the task's refusal of a missing command says it)."""

    task: ClassVar[str]
    scheduler_name: ClassVar[str]
    schedulers: ClassVar[tuple[str, ...]]
    what: ClassVar[str]

    @abstractmethod
    def variants(self) -> tuple[Variant, ...]:
        """Every launcher and option the writer accepts: the contract test's matrix."""

    @abstractmethod
    def explained(self, scheduler: str, launcher: str | None, rdzv: str | None) -> Variant:
        """What ``invoke explain --scheduler scheduler`` writes: ``launcher=None`` is the
        launcher the writer writes by default; ``rdzv`` an elastic PyTorchJob's backend."""

    def command_line(self, scheduler: str) -> str:
        """The task a user runs to write the job ``scheduler`` starts (explain's header)."""
        return f"invoke {self.task}"

    @abstractmethod
    def check(self, launcher: str, nodes: int, command: Sequence[str], options: Any) -> None:
        """The writer's own refusals of a job (one line, nothing written), made before the
        image is known; what every writer refuses is :class:`JobSpec`'s."""

    @abstractmethod
    def render(self, spec: JobSpec, options: Any = None) -> Any:
        """The artefact for ``spec``, checked against the scheduler's schema."""

    @abstractmethod
    def text(self, artefact: Any) -> str:
        """The artefact as the file a user submits."""

    @abstractmethod
    def roles(self, artefact: Any) -> list[Role]:
        """Each distinct role of the artefact as the scheduler starts it: environment,
        arguments, devices, mounted files, each behaviour citing the scheduler's source."""
