"""What every job writer shares, so that no writer imports another: the job itself
(:class:`JobSpec`, validated once, which every writer renders), the image reference rule, the
``MNP_*`` settings the entrypoint reads, the attempts bounds, the stack/instance pair check and
the notices for the scheduler's user.

:class:`JobSpec` is in the spirit of TorchX's ``AppDef``: what the job is (stack, image, nodes,
instance type, launcher, command, mounts, attempts, elastic range, health settings), apart from
how one scheduler writes it down. Each writer (``matrix.jobs.writer.Writer``) renders a spec into
its artefact and reads the artefact's roles back; a spec that exists has passed every check the
writers share, so a writer only checks what is its own (a Slurm ``--ranks``, a Kubeflow kind).

``notices`` are lines a writer must carry to whoever submits the artefact (a stack's minimum
NVIDIA driver, a cluster requirement): each writer renders them in its own format
(:func:`batch_tags` for a Batch definition's tags, :func:`comment_lines` for the sbatch script's
head and the YAML's first comments, :func:`annotation` for a Kubeflow manifest), so adding one is
one line where the notices are gathered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from entrypoint.core.limits import MAX_NODES
from entrypoint.launchers import AS_IS, launcher_command
from entrypoint.launchers import NAMES as LAUNCHERS
from matrix.errors import UsageError, UserError
from matrix.jobs.mounts import Claim, Mount
from matrix.jobs.runopts import Option, RunOpts
from matrix.model.entities import Stack
from matrix.model.instances import INSTANCE_TYPES, InstanceType, get_instance_type
from matrix.model.rules import blocking, check_stack

DEFAULT_WAIT_TIMEOUT_S = 600
# Attempts of a job (the first run and its retries). Batch takes 1 to 10 (RetryStrategy
# "attempts", https://docs.aws.amazon.com/batch/latest/APIReference/API_RetryStrategy.html); two
# gives one retry on other hosts after an infrastructure failure: project choice, enough for one
# bad node without repeating a long failure many times.
DEFAULT_ATTEMPTS = 2
MAX_ATTEMPTS = 10
SECRET_ENV_NAME = "MNP_SECRET"
NOTICE_ANNOTATION = "mnp-stacks/notices"
NOTICE_TAG = "mnp:notice"
# Batch tag values are at most 256 characters (API_RegisterJobDefinition.html, "tags").
BATCH_TAG_MAX = 256



def stack_names(stacks_file: str) -> list[str]:
    """The stacks of ``stacks_file`` read with PyYAML alone (shell completion's values for
    ``--stack``: no schema or rule check); [] when it cannot be read (the task says why)."""
    import yaml

    try:
        with open(stacks_file, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
        return list((data or {}).get("stacks") or {})
    except (OSError, ValueError, AttributeError, TypeError, yaml.YAMLError):
        return []


MOUNT_HELP = ("HOST_PATH:CONTAINER_PATH[:ro], a host folder (e.g. FSx for Lustre at /fsx) at the "
              "same path on every node; repeat")
# What every writer's task takes: the job itself (``JobSpec``'s fields as typed) and the stacks
# file. A writer adds its own (``Writer.run_options``) and may replace one of these with its own
# help or default (its launcher's default, what its attempts mean).
JOB_OPTIONS = RunOpts((
    Option("stack", "a stack by name", repeatable=True, choices=stack_names, example="cpu-tcp",
           default_text="default_stack of the stacks file", checked=False),
    Option("nodes", "number of nodes", kind=int, required=True, minimum=1, maximum=MAX_NODES,
           example="2", bound_reason="the entrypoint's limit"),
    Option("instance_type", "the EC2 instance type of every node", required=True,
           choices=tuple(INSTANCE_TYPES), example="c5n.18xlarge", what="instance type"),
    Option("launcher", "the entrypoint's launcher unit on the nodes (MNP_LAUNCHER)",
           choices=tuple(LAUNCHERS), default="mpirun", example="mpirun", what="launcher",
           variable="MNP_LAUNCHER"),
    Option("launcher_args", "the launcher's own options (MNP_LAUNCHER_ARGS; its --nnodes, "
           "--node_rank, -np and hosts are the entrypoint's), given with =, e.g. "
           "--launcher-args='--master_port 29600'",
           example="'--master_port 29600'", variable="MNP_LAUNCHER_ARGS"),
    Option("image_uri", "the image by digest, REPO@sha256:<64 hex>",
           default_text="the pushed digest of <repo>:<stack>, read from a running Docker engine",
           example="REPO@sha256:DIGEST"),
    Option("mount", MOUNT_HELP, repeatable=True, example="/fsx:/fsx"),
    Option("attempts", "runs of the job: infrastructure failures (exit 200, a lost host) are "
           "retried, a failing command never", kind=int, default=DEFAULT_ATTEMPTS, minimum=1,
           maximum=MAX_ATTEMPTS, example="2"),
    Option("output", "write it to this file, whole or not at all", default_text="print it",
           action=True),
    Option("stacks", "stacks file", default="stacks.yaml", example="stacks.yaml"),
))

_DIGEST_REF = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_pinned(image_uri: str) -> bool:
    """True when ``image_uri`` names its image by digest (``repo@sha256:<64 hex>``)."""
    return bool(_DIGEST_REF.match(image_uri))


def mnp_environment(
    instance: InstanceType,
    launcher: str,
    fabric: str | None,
    wait_timeout_s: int,
    extra: Mapping[str, str] | None,
) -> dict[str, str]:
    """The ``MNP_*`` settings for the entrypoint, then ``extra`` (which may override them).

    ``AWS_BATCH_*`` names are reserved by Batch and ``MNP_SECRET`` must come from Secrets
    Manager, so both are refused in ``extra``.
    """
    env = {
        "MNP_LAUNCHER": launcher,
        "MNP_FABRIC": fabric or ("efa" if instance.has_efa else "tcp"),
        "MNP_SLOTS_PER_NODE": str(instance.slots_per_node()),
        "MNP_WAIT_TIMEOUT": str(wait_timeout_s),
        # The entrypoint derives the EFA settings (FI_EFA_USE_DEVICE_RDMA...) from this.
        "MNP_INSTANCE_TYPE": instance.name,
    }
    for name, value in (extra or {}).items():
        if not _ENV_NAME.match(name):
            raise UserError(f"environment variable {name!r}: not a valid variable name")
        if name.startswith("AWS_BATCH_"):
            raise UserError(f"environment variable {name}: the AWS_BATCH_ prefix is reserved by AWS "
                            "Batch")
        if name == SECRET_ENV_NAME:
            raise UserError(f"environment variable {name}: pass the secret with --secret-arn, not "
                            "in plain text")
        env[name] = str(value)
    return env


def comment_lines(notices: Sequence[str]) -> list[str]:
    """``# Notice: ...`` lines for a script's or a YAML document's head."""
    return [f"# Notice: {line}" for line in notices]


# What an AWS tag value may hold: letters, digits, spaces and + - = . _ : / @ ("Tag naming limits
# and requirements", https://docs.aws.amazon.com/tag-editor/latest/userguide/best-practices-and-strats.html).
TAG_UNSAFE = re.compile(r"[^A-Za-z0-9 +\-=._:/@]+")


def batch_tags(notices: Sequence[str]) -> dict[str, str]:
    """``mnp:notice-1``... tags: each notice with the characters tags refuse dropped (quotes,
    brackets, semicolons), cut to Batch's 256 characters."""
    return {f"{NOTICE_TAG}-{index}":
            " ".join(TAG_UNSAFE.sub(" ", line.replace(">=", "at least")).split())[:BATCH_TAG_MAX]
            for index, line in enumerate(notices, start=1)}


def annotation(notices: Sequence[str]) -> dict[str, str]:
    """The ``mnp-stacks/notices`` annotation (one notice per line), or nothing."""
    return {NOTICE_ANNOTATION: "\n".join(notices)} if notices else {}


def effective_fabric(instance: InstanceType, fabric: str | None) -> str:
    """The fabric the entrypoint is told (``MNP_FABRIC``): ``fabric``, else ``efa`` on a type
    with EFA and ``tcp`` otherwise."""
    return fabric or ("efa" if instance.has_efa else "tcp")


def check_launcher(launcher: str) -> None:
    """The entrypoint's launcher units only: every node refuses anything else at start."""
    if launcher not in LAUNCHERS:
        raise UserError(f"--launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")


def check_launcher_command(launcher: str, command: Sequence[str], wraps: str,
                           advice: str) -> None:
    """Refuse a command that is itself a launcher (``mpirun -np 108 ...``, ``torchrun ...``, as
    users copy their command lines) where the artefact starts ``launcher`` around it: a launcher
    inside a launcher nests jobs, and the copied line's node count, rank, master or hostfile
    cannot be right. ``wraps`` says how, in the writer's terms; ``advice`` what to type instead.
    ``--launcher none`` runs the command as is: each writer decides whether that works."""
    own = launcher_command(list(command))
    if own and launcher != AS_IS:
        raise UsageError(f"-- {' '.join(command[:2])} ...: the command starts {own} itself, and "
                         f"{wraps} (a launcher inside a launcher): {advice}")


def check_nodes(nodes: int) -> None:
    """1 to the entrypoint's node limit: every node refuses more at start (exit 2)."""
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes {nodes}: expected a whole number from 1 to {MAX_NODES} "
                        "(the entrypoint's limit)")


def check_has_command(command: Sequence[str]) -> None:
    """A job runs a command: without one the image's default would run (it has none)."""
    if not command:
        raise UserError("no command given to run on the nodes (put it after --)")


def check_pinned(image_uri: str) -> None:
    """The image by digest, so every node and every retry runs the same image (a value typed on
    the command line: exit 2)."""
    if not is_pinned(image_uri):
        raise UsageError(f"--image-uri {image_uri!r} must name the image by digest (@sha256:...)")


def check_fabric(instance: InstanceType, fabric: str | None) -> None:
    """``efa`` only where the instance has an EFA interface to pass in."""
    if fabric == "efa" and not instance.has_efa:
        raise UserError(f"fabric efa: {instance.name} has no EFA interface")


def check_attempts(attempts: int) -> None:
    """1 (no retry) to :data:`MAX_ATTEMPTS`, the most any writer's scheduler takes (Batch)."""
    if not 1 <= attempts <= MAX_ATTEMPTS:
        raise UsageError(f"--attempts {attempts}: expected 1 to {MAX_ATTEMPTS}")


def check_elastic(low: int, high: int, nodes: int, given: str) -> None:
    """``MIN <= nodes <= MAX`` within the entrypoint's node limit (``given``: the option as
    typed, for the message)."""
    if not 1 <= low <= high <= MAX_NODES:
        # every pod's entrypoint refuses PET_NNODES beyond its node limit (exit 2)
        raise UsageError(f"--elastic {given}: need 1 <= MIN <= MAX <= {MAX_NODES} (the "
                         "entrypoint's node limit)")
    if not low <= nodes <= high:
        raise UsageError(f"--elastic {given}: --nodes {nodes} (the pods started first) must be "
                         f"between {low} and {high}")


def check_pair(stack: Stack, instance_type: str, scheduler: str = "AWS Batch") -> None:
    """Refuse ``stack`` on ``instance_type`` when the rules say it cannot work there.

    The stack's rules are run as if it targeted only this instance, so every capability rule
    (fabric efa needs EFA, a CUDA stack needs GPUs, a SynapseAI stack needs Gaudi, minimum
    versions per instance, and the other way round: an accelerator instance needs the stack
    built for it, or the job holds every GPU or HPU and uses none) answers with its source, as
    ``invoke stacks`` says it for a declared target. ``scheduler`` names whom the refusal is
    about (the writer's scheduler)."""
    problems = blocking(check_stack(replace(stack, instances=(instance_type,))))
    if problems:
        raise UserError(f"stack {stack.name} cannot run on {instance_type} under {scheduler}: "
                        + " | ".join(p.sentence + f" [rule {p.rule.id}]" for p in problems))


@dataclass(frozen=True)
class JobSpec:
    """One job, as every writer renders it: checked once here, on construction, so a writer
    renders a spec without checking it again (TorchX's ``AppDef``: the job apart from its
    scheduler).

    ``fabric`` is what the entrypoint is told (``MNP_FABRIC``); None leaves the default to the
    instance (efa where it has EFA). ``env`` are extra variables over the ``MNP_*`` settings
    (names checked by :func:`mnp_environment`). ``elastic`` is the ``(MIN, MAX)`` node range of a
    job that may shrink or grow (only a PyTorchJob has one). ``wait_timeout_s`` is how long a
    node waits for the others (``MNP_WAIT_TIMEOUT``, the start-up health gate's bound);
    ``notices`` are lines whoever submits the artefact must read (a minimum driver)."""

    stack: Stack
    image_uri: str
    nodes: int
    instance: InstanceType
    launcher: str
    command: tuple[str, ...]
    mounts: tuple[Mount, ...] = ()
    claims: tuple[Claim, ...] = ()
    attempts: int = DEFAULT_ATTEMPTS
    elastic: tuple[int, int] | None = None
    fabric: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    wait_timeout_s: int = DEFAULT_WAIT_TIMEOUT_S
    notices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """The checks every writer shares, in the order a user fixes them."""
        check_launcher(self.launcher)
        check_nodes(self.nodes)
        check_has_command(self.command)
        check_pinned(self.image_uri)
        check_fabric(self.instance, self.fabric)
        check_attempts(self.attempts)
        if self.elastic is not None:
            low, high = self.elastic
            check_elastic(low, high, self.nodes, f"{low}:{high}")
        self.environment()  # a bad variable name is refused here, before any writer runs

    @classmethod
    def of(cls, stack: Stack, instance_type: str, nodes: int, image_uri: str, launcher: str,
           command: Sequence[str], *, mounts: Sequence[Mount] = (),
           claims: Sequence[Claim] = (), attempts: int = DEFAULT_ATTEMPTS,
           elastic: tuple[int, int] | None = None, env: Mapping[str, str] | None = None,
           wait_timeout_s: int = DEFAULT_WAIT_TIMEOUT_S,
           notices: Sequence[str] = ()) -> JobSpec:
        """The spec of ``stack`` on ``nodes`` x ``instance_type``, with the stack's own fabric
        (what the tasks and explain write)."""
        return cls(stack, image_uri, nodes, get_instance_type(instance_type), launcher,
                   tuple(command), tuple(mounts), tuple(claims), attempts, elastic,
                   stack.fabric, tuple(sorted((env or {}).items())), wait_timeout_s,
                   tuple(notices))

    @property
    def effective_fabric(self) -> str:
        """The fabric the nodes use (``MNP_FABRIC``)."""
        return effective_fabric(self.instance, self.fabric)

    def environment(self, launcher: str | None = None) -> dict[str, str]:
        """The ``MNP_*`` settings every node reads, then the extra ``env``; ``launcher``
        overrides the spec's (a writer whose roles run another unit than the job's)."""
        return mnp_environment(self.instance, launcher or self.launcher, self.fabric,
                               self.wait_timeout_s, dict(self.env))
