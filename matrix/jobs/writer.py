"""The interface every job writer implements (one class per scheduler, Lightning style), so
that ``invoke explain``, the tasks and the contract test treat every writer alike.

A writer renders a :class:`~matrix.jobs.spec.JobSpec` into its scheduler's artefact (a Batch
job definition, an sbatch script, a Kubeflow manifest), writes the artefact as the text a user
submits, and reads each role back from the artefact as the scheduler starts it
(:class:`~matrix.jobs.roles.Role`): the role derivation lives beside the writer that makes the
artefact, so a new scheduler is one module (its writer class, its derivation and a module-level
``WRITER``) that :mod:`matrix.jobs.writers` finds by that mark.

A writer declares its task's options beside its artefact (:meth:`Writer.run_options`, TorchX's
``runopts``): the task, its ``--help``, completion, the README's command table and what
``invoke explain --scheduler`` takes for it are made from that declaration
(:mod:`matrix.jobs.runopts`). :meth:`Writer.prepare` turns the parsed values into what the
writer renders besides the :class:`~matrix.jobs.spec.JobSpec`: its ``options`` dataclass (a Slurm
job's ``--ranks``, a Kubeflow kind, a Batch job's IAM roles), the launcher every node is told and
the attempts, so the task and explain hold one request (:class:`Request`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from matrix.jobs.roles import Role
from matrix.jobs.runopts import RunOpts
from matrix.jobs.spec import JOB_OPTIONS, JobSpec


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


@dataclass(frozen=True)
class Prepared:
    """What a writer makes of its task's parsed options besides the job's own fields: the
    launcher every node is told (``MNP_LAUNCHER``), its ``options`` dataclass, the runs of the
    job and an elastic node range (only a PyTorchJob has one)."""

    launcher: str
    options: Any
    attempts: int
    elastic: tuple[int, int] | None = None


class Writer(ABC):
    """A scheduler's job writer.

    ``task``: the invoke task that writes the artefact; ``summary``: that task's one line (its
    ``--help`` and the README's command table); ``file_name``: what ``--output`` given a folder is
    answered with; ``scheduler_name``: the scheduler as the task's refusals name it ("AWS
    Batch"); ``schedulers``: the entrypoint's adapter names its roles are started under (what
    ``invoke explain --scheduler`` takes for this writer); ``what``: what the training command
    becomes in the artefact (the task's refusal of a missing command says it)."""

    task: ClassVar[str]
    summary: ClassVar[str]
    file_name: ClassVar[str]
    scheduler_name: ClassVar[str]
    schedulers: ClassVar[tuple[str, ...]]
    what: ClassVar[str]

    @abstractmethod
    def run_options(self) -> RunOpts:
        """The options of the writer's own (and its own help or default for one of
        :data:`~matrix.jobs.spec.JOB_OPTIONS`)."""

    def task_options(self) -> RunOpts:
        """Every option of the writer's task: the job's, then the writer's own."""
        return JOB_OPTIONS.merged(self.run_options())

    def implied(self, scheduler: str) -> dict[str, Any]:
        """The option values ``invoke explain --scheduler scheduler`` stands for (a Kubeflow
        kind); explain refuses another value for them."""
        return {}

    @abstractmethod
    def prepare(self, values: dict[str, Any]) -> Prepared:
        """The writer's reading of its parsed options (:meth:`task_options`, defaults applied):
        a value wrong for this scheduler is one :class:`~matrix.errors.UsageError` line naming
        the option."""

    def notes(self, nodes: int) -> list[str]:
        """What the scheduler's user should know about a job of ``nodes`` nodes that is no
        refusal (e.g. above AWS Batch's default node limit), said once on stderr by the task
        and as a note by explain."""
        return []

    def action(self, values: dict[str, Any]) -> Callable[[Any], str] | None:
        """What the task does with the artefact besides writing it (``--register``), readied
        now so that a missing setting is said before anything is written; it returns the line
        to print. None: nothing."""
        return None

    def launch_note(self, launcher: str, options: Any) -> str:
        """How ``launcher`` starts the ranks in this artefact, when that is not the launcher's
        own doing (explain's header): e.g. srun starting every rank."""
        return ""

    @abstractmethod
    def variants(self) -> tuple[Variant, ...]:
        """Every launcher and option the writer accepts: the contract test's matrix."""

    def command_line(self, scheduler: str) -> str:
        """The task a user runs to write the job ``scheduler`` starts (explain's header)."""
        return " ".join([f"invoke {self.task}"] + [
            f"--{name.replace('_', '-')} {value}" for name, value in
            self.implied(scheduler).items()])

    @abstractmethod
    def check(self, launcher: str, nodes: int, command: Sequence[str], options: Any) -> None:
        """The writer's own refusals of a job (one line, nothing written), made before the
        image is known, in the writer's own terms (its options, its scheduler); what every
        writer refuses is :class:`JobSpec`'s."""

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
