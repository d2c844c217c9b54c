"""One job as a writer's task is asked for it: the one step from parsed options to what the
writer renders, which the writer's task and ``invoke explain --scheduler`` both take, so explain
describes exactly the artefact the task writes and refuses what the task refuses, with the same
line (TorchX's ``submit_dryrun``: the dry run is what is submitted).

:func:`job_request` makes the checks in the order a user fixes them: the writer's reading of its
options (:meth:`~matrix.jobs.writer.Writer.prepare`, exit 2), its own refusals of the job
(:meth:`~matrix.jobs.writer.Writer.check`, exit 2), mounts over the image's folders (exit 2),
then the stack on the instance type (exit 1). :func:`refusal` is the line for a plan that would
stop a node at start (exit 1), said by the task and by explain alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from matrix.errors import SEPARATOR
from matrix.jobs.mounts import Claim, Mount, parse_all
from matrix.jobs.runopts import in_option_terms
from matrix.jobs.spec import JobSpec, check_pair
from matrix.jobs.writer import Prepared, Writer
from matrix.model.entities import Matrix, Stack

# The settings a JobSpec writes itself (its launcher); other options' variables go in as env.
SPEC_SETTINGS = ("MNP_LAUNCHER",)


def notices_for(stack: Stack, instance_type: str | None = None) -> list[str]:
    """What every artefact of ``stack`` on ``instance_type`` tells whoever submits it (a minimum
    NVIDIA driver, a cluster requirement, the instance row's ``notice``), one line each; each
    writer renders them in its format (matrix/jobs/spec.py). Add a notice here."""
    from matrix.model.drivers import driver_floor
    from matrix.model.instances import get_instance_type

    floor = driver_floor(stack)
    notices = [floor.line()] if floor else []
    instance = get_instance_type(instance_type) if instance_type else None
    if instance and instance.notice:
        notices.append(instance.notice)
    return notices


@dataclass(frozen=True)
class JobRequest:
    """A job checked for ``writer``: the stack, the pair, the command, the mounts and the
    writer's reading of its options (:class:`~matrix.jobs.writer.Prepared`). ``scheduler`` is
    the entrypoint adapter whose roles explain names (a Kubeflow kind, ``batch``, ``slurm``)."""

    writer: Writer
    scheduler: str
    matrix: Matrix
    stack: Stack
    instance_type: str
    nodes: int
    command: tuple[str, ...]
    prepared: Prepared
    mounts: tuple[Mount, ...] = ()
    claims: tuple[Claim, ...] = ()
    settings: tuple[tuple[str, str], ...] = ()  # MNP_* settings an option sets beyond the spec's

    @property
    def launcher(self) -> str:
        return self.prepared.launcher

    def spec(self, image_uri: str) -> JobSpec:
        """The :class:`JobSpec` the writer renders, with ``image_uri``."""
        return JobSpec.of(self.stack, self.instance_type, self.nodes, image_uri, self.launcher,
                          self.command, mounts=self.mounts, claims=self.claims,
                          attempts=self.prepared.attempts, elastic=self.prepared.elastic,
                          env=dict(self.settings), notices=notices_for(self.stack,
                                                                       self.instance_type))

    def render(self, image_uri: str) -> Any:
        """The artefact the writer's task writes for ``image_uri``."""
        return self.writer.render(self.spec(image_uri), self.prepared.options)

    def describe(self) -> str:
        """``stack S with launcher L on N x T under K`` for refusals."""
        how = self.writer.launch_note(self.launcher, self.prepared.options)
        return (f"stack {self.stack.name} with launcher {self.launcher}"
                f"{f' ({how})' if how else ''} on {self.nodes} x {self.instance_type} under "
                f"{self.writer.scheduler_name}")


def job_request(writer: Writer, values: Mapping[str, Any], command: Sequence[str],
                matrix: Matrix, stack_name: str, scheduler: str | None = None) -> JobRequest:
    """``values`` (the writer's :meth:`~Writer.task_options`, parsed, defaults applied) and the
    command as the writer renders them, after every check but the plan's (:func:`refusal`)."""
    prepared = writer.prepare(dict(values))
    nodes = values["nodes"]
    writer.check(prepared.launcher, nodes, command, prepared.options)
    mounts, claims = parse_all(values.get("mount"), values.get("pvc"))
    stack = matrix.stack(stack_name)
    refuse_image_folders(matrix, stack, mounts, claims)
    # before the image: no engine needed; a refusal names the scheduler the task writes for
    check_pair(stack, values["instance_type"], writer.scheduler_name)
    settings = tuple((option.variable, str(values[option.name]))
                     for option in writer.task_options() if option.variable
                     and option.variable not in SPEC_SETTINGS and values.get(option.name))
    return JobRequest(writer, scheduler or writer.schedulers[0], matrix, stack,
                      values["instance_type"], nodes, tuple(command), prepared, tuple(mounts),
                      tuple(claims), settings)


def refuse_image_folders(matrix: Matrix, stack: Stack, mounts: Sequence[Mount],
                         claims: Sequence[Claim]) -> None:
    """A mount over a folder the image installs into hides it on every node (one line, exit
    2; :func:`matrix.jobs.mounts.refuse_image_folders`)."""
    from matrix.jobs import mounts as mount_rules

    mount_rules.refuse_image_folders(matrix, stack.name, mounts, claims)


def refusal(request: JobRequest, stops: Sequence[str]) -> str:
    """The one line for a job whose plan stops a role at start: the task refuses to write it and
    explain exits 1 with it, word for word; the plan's advice in the writer's option terms."""
    options = request.writer.task_options()
    stops = [in_option_terms(line, options) for line in stops]
    return (f"{request.describe()}: " + SEPARATOR.join(stops) + " (a real run stops there; "
            f"invoke explain --scheduler {request.scheduler} with the same options shows each "
            "role's plan)")
