"""``invoke explain``: every role of a job as its scheduler would start it, each with what that
role's own dry run prints, without hardware, without an image and without a build.

1. The job is written as the scheduler's writer writes it (the writer of
   :mod:`matrix.jobs.writers` that covers the scheduler renders the job's
   :class:`~matrix.jobs.spec.JobSpec`, as its task does) and each role is read back from it by
   that writer (``Writer.roles``: the environment, arguments, devices and mounted files the
   scheduler gives that pod/task/node).
   A scheduler the entrypoint has an adapter for but no task writes a job for is explained from
   its adapter's ``example`` (:func:`adapter_roles`).
2. Each role's node facts are declarations: versions from stacks.yaml, programs, library folders
   and plugins from the stack's templates and its ENV (:mod:`matrix.image.declared`), devices as
   the scheduler passes them to that role; what only a node can probe is a placeholder
   (:data:`NODE_ONLY`).
3. The entrypoint's own dry-run path (:func:`entrypoint.run.main.dry_run_plan`, what
   ``Runner.dry_run`` prints) plans the role, so explain holds no copy of its decisions;
   tests/test_explain_roles.py compares every section with the role's dry run run as a process.
"""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entrypoint import launchers
from entrypoint import schedulers as ep_schedulers
from entrypoint.core.limits import MAX_NODES
from entrypoint.plan import make as ep_plan
from entrypoint.probe import facts as ep_facts
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config
from matrix.errors import UsageError
from matrix.model.drivers import driver_floor
from matrix.model.entities import Matrix, Stack, comparable
from matrix.model.instances import INSTANCE_TYPES, InstanceType, get_instance_type

if TYPE_CHECKING:  # imported where used: listing the schedulers (tab completion) stays quick
    from matrix.jobs.request import JobRequest
    from matrix.jobs.roles import Role

# A fork's own version -> the upstream DeepSpeed release it is based on (what decides how the
# launcher passes the environment on).
DEEPSPEED_FORKS = {
    "deepspeed-habana": {
        # The 1.6.0 branch was installed from HabanaAI/DeepSpeed in 2022; that history now lives
        # in HabanaAI/deepspeed_old (stacks.yaml deepspeed-habana 1.6.0 archive_url).
        "1.6.0": ("0.6.1", "HabanaAI/deepspeed_old commit 8385a1f, the 1.6.0 branch of Habana's "
                           "fork of DeepSpeed 0.6.1"),
    },
}
PLACEHOLDER_COMMAND = ["python3", "train.py"]
# What ``--scheduler`` accepts: the schedulers a job is submitted to, the entrypoint's adapters
# that say so (``rank`` and ``single`` are what it finds inside a job; a new adapter module is
# one more, with no edit here).
SCHEDULERS = tuple(adapter.NAME for adapter in ep_schedulers.ORDER if adapter.SUBMITTED)


class ExplainError(UsageError):
    """Unknown stack, instance type or launcher, or a bad node count: one line, exit status 2
    (a pair the rules refuse is :func:`matrix.jobs.spec.check_pair`'s UserError: 1)."""


@dataclass
class Section:
    """One role of the generated job and the plan its own dry run prints."""

    role: Role
    plan: ep_plan.Plan

    def text(self) -> str:
        """Exactly what the role's entrypoint prints with ``MNP_DRY_RUN=1``."""
        return self.plan.text()


@dataclass
class Explained:
    header: str
    sections: list[Section]
    notes: list[str] = field(default_factory=list)

    @property
    def plan(self) -> ep_plan.Plan:
        """The first role's plan: Batch's main node, Slurm's node 0, a PyTorchJob's master,
        an MPIJob's launcher."""
        return self.sections[0].plan

    def stops(self) -> list[str]:
        """What stops any role at start (each line names its role)."""
        return [f"{section.role.name}: {line}" for section in self.sections
                for line in section.plan.stops()]

    def text(self) -> str:
        lines = [self.header] + [f"note: {note}" for note in self.notes]
        for section in self.sections:
            lines += ["", f"=== {section.role.name}: {role_title(section.role)} ===",
                      section.text()]
        return "\n".join(lines)

    def json(self) -> str:
        return json.dumps({"header": self.header, "notes": self.notes,
                           "roles": [{"name": section.role.name, "argv": section.role.argv,
                                      "plan": section.plan.to_dict()}
                                     for section in self.sections]}, indent=2, sort_keys=True)


def role_title(role: Role) -> str:
    """Where the role runs and what the scheduler passes in, in a few words."""
    devices = role.devices
    passed = ", ".join(f"{count} {what}" for count, what in (
        (devices.gpus, "GPUs"), (devices.hpus, "HPUs"), (devices.efa, "EFA devices")) if count)
    return f"{role.instance_type}, {passed or 'no devices'} passed in"


def _nccl(stack: Stack, versions: dict[str, str]) -> tuple[str | None, str]:
    """The lowest NCCL a job of this stack can load: the system one and PyTorch's wheel."""
    found = []
    if versions.get("nccl"):
        found.append((versions["nccl"], "nccl component"))
    torch = stack.layer("pytorch")
    for name, pin in ((torch.spec.get("pip") or {}) if torch else {}).items():
        if name.startswith("nvidia-nccl"):
            found.append((pin["version"], f"pytorch {torch.version} wheel {name}"))
    if not found:
        return None, ""
    return min(found, key=lambda item: comparable(item[0]))


def stack_facts(matrix: Matrix, stack: Stack, instance: InstanceType) -> NodeFacts:
    """What a node of ``stack`` on ``instance`` has, from declarations only: the versions in
    stacks.yaml, the programs, library folders and plugins its templates say they install
    (:func:`matrix.image.declared.image_facts`) and the instance table's devices."""
    image = declared_image(matrix, stack)
    versions, sources = _declared_versions(stack)
    # invoke jobdef passes the uverbs devices in only when the stack's fabric is efa
    efa_devices = ([f"uverbs{i}" for i in range(instance.efa_interfaces)]
                   if stack.fabric == "efa" else [])
    accel = instance.accelerators
    return NodeFacts(
        instance_type=instance.name,
        instance_source="MNP_INSTANCE_TYPE (set by invoke jobdef)",
        gpus=instance.gpus, hpus=instance.hpus, efa_devices=efa_devices,
        fi_info_efa=image.fi_info_efa,
        # AWS Batch MNP runs awsvpc: the container's eth0 is its own ENI, an ENA device.
        nic_vendor="0x1d0f", interface="eth0", address="<node-0>",
        address_reason="route lookup on the node (placeholder: nothing probed)",
        slots=accel or 1,
        slots_source=(f"instance table: {instance.gpus} GPUs" if instance.gpus else
                      f"instance table: {instance.hpus} HPUs" if instance.hpus else
                      "no GPU or HPU on this instance type: 1"),
        versions=versions, version_sources=sources,
        binaries={name: image.programs.get(name)
                  for name in sorted(set(ep_facts.BINARIES) | set(launchers.programs())
                                     | set(image.programs))},
        plugin_path=image.plugin, hccl_wrapper=image.hccl_wrapper, libdirs=list(image.libdirs),
        is_root=True, user="root", home="/root",
        origin=f"declared: stacks.yaml stack {stack.name}, its templates' installs and the "
               f"instance table row {instance.name} (no hardware, image or build)",
    )


_DECLARED: dict[tuple[str, str], Any] = {}


def declared_image(matrix: Matrix, stack: Stack) -> Any:
    """The stack's image as its templates declare it (``matrix.image.declared.ImageFacts``),
    rendered once per process; imported here, so listing schedulers renders nothing."""
    from matrix.image.declared import image_facts

    key = (str(matrix.path), stack.name)
    if key not in _DECLARED:
        _DECLARED[key] = image_facts(matrix, stack)
    return _DECLARED[key]


def _declared_versions(stack: Stack) -> tuple[dict[str, str], dict[str, str]]:
    """The component versions ``stack`` declares, and where each one was read."""
    declared = stack.versions()
    versions: dict[str, str] = {}
    sources: dict[str, str] = {}

    def put(key: str, value: str | None, where: str) -> None:
        if value:
            versions[key] = value
            sources[key] = where

    nccl, where = _nccl(stack, declared)
    put("nccl", nccl, f"stacks.yaml {stack.name}: {where}")
    for key, name in (("aws-ofi-nccl", "aws-ofi-nccl"), ("efa-installer", "efa"),
                      ("libfabric", "libfabric"), ("openmpi", "openmpi"),
                      ("pytorch", "pytorch"), ("deepspeed", "deepspeed"),
                      ("synapseai", "synapseai")):
        put(key, declared.get(name), f"stacks.yaml {stack.name}: {name}")
    for fork, table in DEEPSPEED_FORKS.items():
        if fork in declared and declared[fork] in table:
            upstream, why = table[declared[fork]]
            put("deepspeed", upstream, f"stacks.yaml {stack.name}: {fork} {declared[fork]}, {why}")
    return versions, sources


def explain(matrix: Matrix, stack_name: str, instance_type: str, nodes: int,
            launcher: str | None = None, command: list[str] | None = None,
            scheduler: str = "batch", rdzv: str | None = None) -> Explained:
    """Every role of the job ``scheduler``'s writer generates for these values, each with the
    plan its own dry run prints (what ``invoke explain`` prints for the same options).
    ``launcher=None``: the writer's default, as its task writes it. Raises
    :class:`ExplainError` for unknown names or bad numbers, and the writer's refusals."""
    from matrix.jobs import request as rq
    from matrix.jobs import writers

    _check_request(matrix, stack_name, instance_type, nodes, launcher, scheduler, rdzv)
    writer = writers.for_scheduler(scheduler)
    given = list(command or PLACEHOLDER_COMMAND)
    if writer is None:
        return _adapter_explained(matrix, matrix.stacks[stack_name], instance_type, nodes,
                                  launcher, given, scheduler, placeholder=not command)
    typed = dict(writer.implied(scheduler), nodes=nodes, instance_type=instance_type)
    if launcher is not None:
        typed["launcher"] = launcher
    if rdzv is not None:
        if "rdzv" not in writer.task_options().names():
            raise ExplainError(f"--rdzv {rdzv}: an elastic PyTorchJob's rendezvous; add "
                               "--scheduler pytorchjob")
        typed["rdzv"] = rdzv
    values = writer.task_options().parse(typed)
    job = rq.job_request(writer, values, given, matrix, stack_name, scheduler)
    return explain_request(job, placeholder=not command)


def explain_request(job: JobRequest, placeholder: bool = False) -> Explained:
    """Every role of the artefact ``job.writer`` writes for ``job`` (read back by that writer,
    ``Writer.roles``), each with the plan its own dry run prints. ``placeholder``: the command
    is explain's stand-in, none was given."""
    roles = job.writer.roles(job.render(IMAGE_URI))
    sections = [role_dry_run(job.matrix, job.stack, role) for role in roles]
    notes = job.writer.notes(job.nodes)
    if placeholder:
        notes.append(f"no command given after --: {' '.join(PLACEHOLDER_COMMAND)} shown")
    notes += _stack_notes(job.stack, job.instance_type)
    how = job.writer.launch_note(job.launcher, job.prepared.options)
    header = (f"invoke explain: stack {job.stack.name} on {job.nodes} x {job.instance_type} "
              f"under {job.scheduler}, launcher {job.launcher}{f' ({how})' if how else ''}: "
              f"each role of what {job.writer.command_line(job.scheduler)} writes, with what "
              f"its own dry run (MNP_DRY_RUN=1) prints. Facts from the stack's declarations and "
              f"the instance table; only a node can probe {', '.join(NODE_ONLY)}")
    return Explained(header, sections, notes)


def _stack_notes(stack: Stack, instance_type: str) -> list[str]:
    notes = []
    floor = driver_floor(stack)
    if floor:
        notes.append("hosts need " + floor.line())
    if INSTANCE_TYPES[instance_type].notice:
        notes.append(INSTANCE_TYPES[instance_type].notice)
    if instance_type not in stack.instances:
        notes.append(f"{instance_type} is not one of {stack.name}'s instances "
                     f"({', '.join(stack.instances)}): shown as asked")
    return notes


def _adapter_explained(matrix: Matrix, stack: Stack, instance_type: str, nodes: int,
                       launcher: str | None, command: list[str], scheduler: str,
                       placeholder: bool) -> Explained:
    """A scheduler the entrypoint has an adapter for but no task writes a job for."""
    from matrix.jobs import spec

    spec.check_pair(stack, instance_type)
    sections = [role_dry_run(matrix, stack, role) for role in
                adapter_roles(stack, instance_type, nodes, launcher, command, scheduler)]
    notes = [f"no command given after --: {' '.join(PLACEHOLDER_COMMAND)} shown"] \
        if placeholder else []
    notes += _stack_notes(stack, instance_type)
    header = (f"invoke explain: stack {stack.name} on {nodes} x {instance_type} under "
              f"{scheduler}, launcher {sections[0].plan.launcher['unit']}: each role the "
              f"adapter's example describes, with what its own dry run (MNP_DRY_RUN=1) prints")
    return Explained(header, sections, notes)


# What the dry run shows that only the node itself can know (placeholders here).
NODE_ONLY = ("its address and interface", "fi_info's answer", "/dev/shm and free space",
             "the LC_CTYPE its python3 sets when LANG is unset (PEP 538)")
# The image reference the writers are given: the plan never reads it.
IMAGE_URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp-stacks@sha256:" + "0" * 64


def adapter_roles(stack: Stack, instance_type: str, nodes: int, launcher: str | None,
                  command: list[str], scheduler: str) -> list[Role]:
    """A scheduler the entrypoint has an adapter for but no task writes a job for: node 0 and
    the last node as the adapter's own ``example`` says the scheduler starts them, with the
    ``MNP_*`` settings every writer writes (``spec.mnp_environment``) and the instance's devices.
    """
    from matrix.jobs import spec
    from matrix.jobs.roles import Devices, Role

    instance = get_instance_type(instance_type)
    settings = spec.mnp_environment(instance, launcher or "mpirun", stack.fabric,
                                    spec.DEFAULT_WAIT_TIMEOUT_S, None)
    efa = instance.efa_interfaces if stack.fabric == "efa" else 0
    devices = Devices(instance.gpus, instance.hpus, efa)
    return [Role(f"node {index} (the {scheduler} adapter's example; no task writes this job)",
                 dict(settings, **ep_schedulers.MODULES[scheduler].example(nodes, index)),
                 list(command), devices, instance.name)
            for index in sorted({0, nodes - 1})]


def role_facts(matrix: Matrix, stack: Stack, role: Role) -> NodeFacts:
    """The stack's declared facts on the role's instance type, with the devices the scheduler
    passes into the role's container (an MPIJob launcher gets none)."""
    facts = copy.copy(stack_facts(matrix, stack, get_instance_type(role.instance_type)))
    devices = role.devices
    facts.gpus, facts.hpus = devices.gpus, devices.hpus
    facts.efa_devices = [f"uverbs{i}" for i in range(devices.efa)]
    facts.slots = devices.gpus or devices.hpus or 1
    facts.slots_source = (f"the scheduler passed {devices.gpus} GPUs" if devices.gpus
                          else f"the scheduler passed {devices.hpus} HPUs" if devices.hpus
                          else "no GPU or HPU passed in: 1")
    return facts


def role_environment(matrix: Matrix, stack: Stack, role: Role) -> dict[str, str]:
    """What the role's entrypoint reads in its dry run: the image's variables (its templates'
    ENV), then the role's (the scheduler's override the image's), with ``MNP_DRY_RUN=1``."""
    return dict(declared_image(matrix, stack).env, **role.env, MNP_DRY_RUN="1")


def role_dry_run(matrix: Matrix, stack: Stack, role: Role) -> Section:
    """The role's dry run: the entrypoint's own ``dry_run_plan`` on the role's environment and
    arguments, with the stack's declared facts. A file the scheduler mounts (an MPIJob's
    hostfile) is written to a temporary folder for the entrypoint to read, and named in the
    plan by the path the scheduler mounts it at."""
    from entrypoint.run import main as ep_main

    env = role_environment(matrix, stack, role)
    facts = role_facts(matrix, stack, role)
    with tempfile.TemporaryDirectory() as tmp:
        moved = {}
        for index, (path, content) in enumerate(sorted(role.files.items())):
            local = str(Path(tmp) / f"file{index}")
            Path(local).write_text(content)
            moved[local] = path
            env = {k: (local if v == path else v) for k, v in env.items()}
        plan = ep_main.dry_run_plan(config.load(env), role.argv, env, facts)
    for local, path in moved.items():
        _rename_in_plan(plan, local, path)
    return Section(role, plan)


def _rename_in_plan(plan: ep_plan.Plan, old: str, new: str) -> None:
    """Every mention of ``old`` in the plan's data as ``new``."""
    for name, value in list(vars(plan).items()):
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            continue
        if old in text:
            setattr(plan, name, json.loads(text.replace(json.dumps(old)[1:-1],
                                                        json.dumps(new)[1:-1])))


def _check_request(matrix: Matrix, stack_name: str, instance_type: str, nodes: int,
                   launcher: str | None, scheduler: str, rdzv: str | None) -> None:
    """Refuse an unknown name or a bad number with an :class:`ExplainError` naming the option."""
    if scheduler not in SCHEDULERS:
        raise ExplainError(f"--scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")

    if stack_name not in matrix.stacks:
        raise ExplainError(f"--stack {stack_name!r} is not in {matrix.path} "
                           f"(stacks: {', '.join(sorted(matrix.stacks))})")
    if instance_type not in INSTANCE_TYPES:
        raise ExplainError(f"--instance-type {instance_type!r} is not in the instance table "
                           f"({', '.join(sorted(INSTANCE_TYPES))})")
    if launcher is not None and launcher not in launchers.NAMES:
        raise ExplainError(f"--launcher {launcher!r} is not one of {', '.join(launchers.NAMES)}")
    if not 1 <= nodes <= MAX_NODES:
        # the entrypoint refuses more nodes (AWS_BATCH_JOB_NUM_NODES): say so before it does
        raise ExplainError(f"--nodes {nodes}: expected a whole number from 1 to "
                           f"{MAX_NODES} (the entrypoint's limit)")


def parse_nodes(raw: Any) -> int:
    """``--nodes`` as an int, or an :class:`ExplainError`."""
    try:
        return int(str(raw), 10)
    except ValueError:
        raise ExplainError(f"--nodes {raw!r} is not a whole number") from None
