"""Tasks that run or publish a built stack: ``push``, ``jobdef``, ``sbatch``, ``k8s``, ``run``,
``explain``."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrix.cli import options
from matrix.cli.options import (
    LAUNCHERS,
    choose,
    default_stack,
    integer,
    load,
    one_stack,
    require,
    shown,
    stack_list,
)
from matrix.cli.output import FILE_NAMES, output_path, write_whole
from matrix.errors import EXIT_CANNOT, SEPARATOR, UsageError, UserError
from matrix.image.plan import plan
from matrix.model.entities import Matrix
from matrix.model.settings import ROOT

if TYPE_CHECKING:  # the writers are imported where used: listing the tasks stays quick
    from matrix.jobs.spec import JobSpec
    from matrix.jobs.writer import Writer

# --- push, jobdef, run ---------------------------------------------------------------------------

def _git_sha() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise UserError("cannot read the git commit for the <stack>-<sha> tag (not a git clone?)")
    return proc.stdout.strip()


def push(stacks_file: str, stacks: Any, registry: str | None, force: bool) -> None:
    from matrix.deploy import publish
    from matrix.image import engine

    registry = require(registry, "--registry", "123456789012.dkr.ecr.us-east-1.amazonaws.com")
    matrix = load(stacks_file)
    stack = one_stack(matrix, stacks)
    result = plan(matrix, [stack])
    client = engine.ensure()
    # push_stack's last line is its summary (counts and the image by digest): nothing follows it
    pushed = publish.push_stack(client, result.chains[stack], result.final_ref(stack), stack,
                                registry, _git_sha(), force=force, log=_push_line, summary=False)
    from matrix.cli.images import sbom_beside

    sbom_beside(client, matrix, stack, result.final_ref(stack), pushed, _push_line)
    _push_line(pushed.summary())


def _push_line(line: str) -> None:
    """One line of the push as it is: never folded at the console's width (a tag or digest
    cut in two can no longer be copied, and the summary would not be the last line)."""
    print(line, flush=True)


JOB_COMMAND_EXAMPLE = "-- python3 train.py"


@dataclass
class Generated:
    """What every generator (jobdef, sbatch, k8s) checked before building: the stack, its pair,
    the node count, the command, the mounts and where to write."""

    matrix: Matrix
    stack: str
    nodes: int
    instance_type: str
    command: list[str]
    mounts: list[Any]
    claims: list[Any]
    target: Path | None


def _writer(task: str) -> Writer:
    """The writer (matrix/jobs/writers.py) whose artefact the task ``task`` writes."""
    from matrix.jobs import writers

    return writers.for_task(task)


def _generator_input(writer: Writer, stacks_file: str, stacks: Any, nodes: Any,
                     instance_type: str | None, launcher: str, output: str | None,
                     command: list[str], mounts: Any, claims: Any = None,
                     scheduler: str = "batch") -> Generated:
    """The checks every generator makes, in the order a user fixes them: the command line
    first (exit 2), then the stack on the instance and the plan (exit 1), nothing written."""
    from matrix.jobs import spec
    from matrix.jobs.mounts import parse_all, refuse_image_folders
    from matrix.model.instances import INSTANCE_TYPES

    count = options.nodes(require(nodes, "--nodes", "2"))
    instance_type = choose(require(instance_type, "--instance-type", "c5n.18xlarge"),
                           INSTANCE_TYPES, "instance type", "--instance-type")
    if not command:
        raise UsageError(f"give the training command after --, e.g. invoke {writer.task} "
                         f"--nodes {count} --instance-type {instance_type} "
                         f"{JOB_COMMAND_EXAMPLE} (it becomes {writer.what}, word for word)")
    parsed_mounts, parsed_claims = parse_all(mounts, claims)
    target = output_path(output, FILE_NAMES[writer.task]) if output else None
    matrix = load(stacks_file)
    stack = one_stack(matrix, stacks)
    refuse_image_folders(matrix, stack, parsed_mounts, parsed_claims)
    # before the image: no engine needed; a refusal names the scheduler the task writes for
    spec.check_pair(matrix.stack(stack), instance_type, writer.scheduler_name)
    _refuse_problems(matrix, stack, instance_type, count, launcher, command, scheduler)
    return Generated(matrix, stack, count, instance_type, command, parsed_mounts, parsed_claims,
                     target)


def notices_for(stack: Any, instance_type: str | None = None) -> list[str]:
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


def _image(given: Generated, image_uri: str | None) -> str:
    from matrix.jobs import jobdef as jd

    return jd.pin_image(image_uri) if image_uri else _local_digest_uri(given.matrix, given.stack)


def _emit(given: Generated, text: str, output: str | None) -> None:
    """``text`` to ``--output`` (whole or not at all) or to stdout."""
    if given.target:
        write_whole(given.target, text if text.endswith("\n") else text + "\n", output or "")
        print(f"wrote {shown(given.target)}")
    else:
        print(text, end="" if text.endswith("\n") else "\n")


def _spec(given: Generated, uri: str, launcher: str, *, attempts: int,
          elastic: tuple[int, int] | None = None) -> JobSpec:
    """The job every writer renders, checked once (``matrix.jobs.spec.JobSpec``)."""
    from matrix.jobs.spec import JobSpec

    stack = given.matrix.stack(given.stack)
    return JobSpec.of(stack, given.instance_type, given.nodes, uri, launcher, given.command,
                      mounts=given.mounts, claims=given.claims, attempts=attempts,
                      elastic=elastic, notices=notices_for(stack, given.instance_type))


def jobdef(stacks_file: str, stacks: Any, nodes: Any, instance_type: str | None,
           image_uri: str | None, secret_arn: str | None, execution_role_arn: str | None,
           launcher: str, output: str | None, register: bool, command: list[str],
           region: str | None = None, profile: str | None = None,
           mounts: Any = None, attempts: Any = None) -> dict[str, Any]:
    """Write (and with ``register`` register) the job definition. The training command is the
    definition's ``command``, word for word: without one the image's default would run.
    ``attempts`` (default 2) bounds the runs; only infrastructure failures are retried."""
    from matrix.jobs import jobdef as jd
    from matrix.jobs import spec

    writer = _writer("jobdef")
    launcher = choose(launcher, LAUNCHERS, "launcher", "--launcher")
    tries = attempts_option(attempts, spec.MAX_ATTEMPTS)
    given = _generator_input(writer, stacks_file, stacks, nodes, instance_type, launcher, output,
                             command, mounts)
    uri = _image(given, image_uri)
    definition = writer.render(_spec(given, uri, launcher, attempts=tries),
                               jd.BatchOptions(secret_arn, execution_role_arn))
    # the AWS session first: a missing region or profile is said before anything is written
    client = jd.batch_client_for(region, profile) if register else None
    _emit(given, writer.text(definition), output)
    if client is not None:
        answer = jd.register_job_definition(definition, client)
        print(f"registered {answer.get('jobDefinitionArn', '?')}")
    return definition


def attempts_option(value: Any, maximum: int) -> int:
    """``--attempts``: 1 (no retry) to ``maximum``; 2 when not given (one retry after an
    infrastructure failure)."""
    from matrix.jobs import spec

    if value is None:
        return spec.DEFAULT_ATTEMPTS
    count = integer(value, "--attempts", 1)
    if count > maximum:
        raise UsageError(f"--attempts {count}: at most {maximum}")
    return count


def sbatch(stacks_file: str, stacks: Any, nodes: Any, instance_type: str | None,
           image_uri: str | None, launcher: str, output: str | None, command: list[str],
           mounts: Any = None, attempts: Any = None, ranks: str = "srun") -> str:
    """Write a Slurm batch script (pyxis/enroot) that runs the command on every node;
    ``attempts`` (default 2) bounds its requeues, which only infrastructure failures get;
    ``ranks`` says who starts an mpirun job's ranks (srun, or mpirun from node 0)."""
    from matrix.jobs import sbatch as sb
    from matrix.jobs import spec

    writer = _writer("sbatch")
    tries = attempts_option(attempts, spec.MAX_ATTEMPTS)

    launcher = choose(launcher, LAUNCHERS, "launcher", "--launcher")
    ranks = choose(ranks, sb.RANKS, "rank starter", "--ranks")
    slurm = sb.SlurmOptions(ranks)
    writer.check(launcher, options_nodes(nodes), command, slurm)  # --ranks, a launcher command
    given = _generator_input(writer, stacks_file, stacks, nodes, instance_type, launcher, output,
                             command, mounts, scheduler=sb.plan_scheduler(launcher, ranks))
    uri = _image(given, image_uri)
    script = writer.render(_spec(given, uri, launcher, attempts=tries), slurm)
    _emit(given, writer.text(script), output)
    return script


def options_nodes(nodes: Any) -> int:
    """``--nodes`` as the tasks read it (one line, exit 2, when it is missing or bad)."""
    return options.nodes(require(nodes, "--nodes", "2"))


def k8s(stacks_file: str, stacks: Any, kind: str | None, nodes: Any, instance_type: str | None,
        image_uri: str | None, elastic: str | None, output: str | None, command: list[str],
        mounts: Any = None, claims: Any = None, attempts: Any = None) -> dict[str, Any]:
    """Write a Kubeflow PyTorchJob, TrainJob or MPIJob, checked against the vendored CRD."""
    from matrix.jobs import k8s as kube
    from matrix.jobs import spec

    writer = _writer("k8s")
    kind = choose(require(kind, "--kind", "pytorchjob"), kube.KINDS, "kind", "--kind")
    tries = attempts_option(attempts, spec.MAX_ATTEMPTS)
    if kind != "pytorchjob" and attempts is not None and tries > 1:
        raise UsageError(f"--attempts {tries}: a {kind} cannot retry by exit code (its operator "
                         "retries every failure alike; docs/entrypoint.md Retries): give 1 or "
                         "leave it out")
    if kind != "pytorchjob":
        tries = 1
    count = options_nodes(nodes)
    if elastic is not None and kind != "pytorchjob":
        raise UsageError(f"--elastic {elastic}: only --kind pytorchjob has elastic bounds")
    bounds = kube.parse_elastic(elastic, count)
    given = _generator_input(writer, stacks_file, stacks, count, instance_type,
                             kube.LAUNCHER[kind], output, command, mounts, claims,
                             scheduler=kind)
    uri = _image(given, image_uri)
    manifest = writer.render(_spec(given, uri, kube.LAUNCHER[kind], attempts=tries,
                                   elastic=bounds), kube.KubeflowOptions(kind))
    _emit(given, writer.text(manifest), output)
    return manifest


def _refuse_problems(matrix: Matrix, stack: str, instance_type: str, nodes: int, launcher: str,
                     command: list[str], scheduler: str = "batch") -> None:
    """The check ``invoke explain --scheduler`` makes: a plan with PROBLEM lines stops every
    node at start, so nothing is written for it."""
    from matrix.jobs import explain as ex

    problems = ex.explain(matrix, stack, instance_type, nodes, launcher, command,
                          scheduler=scheduler).stops()
    if problems:
        raise UserError(f"stack {stack} with launcher {launcher} on {nodes} x {instance_type} "
                        f"under {scheduler}: " + SEPARATOR.join(problems) + " (a real run stops "
                        f"there; see invoke explain --stack {stack} --instance-type "
                        f"{instance_type} --launcher {launcher} --scheduler {scheduler})")


def _local_digest_uri(matrix: Matrix, stack: str) -> str:
    """The pushed digest of the stack's image, read only from an engine that already runs."""
    from docker.errors import ImageNotFound

    from matrix.image import engine

    image = f"{matrix.repository}:{stack}"
    ask = "pass --image-uri REPO@sha256:... (the digest `invoke push` printed)"
    try:
        client = engine.connect(timeout=20)
    except UserError:
        raise UserError(f"no --image-uri given and no Docker engine answers to read the pushed "
                        f"digest of {image}; {ask}") from None
    try:
        digests = client.images.get(image).attrs.get("RepoDigests", [])
    except ImageNotFound:
        digests = []
    if not digests:
        raise UserError(f"no pushed digest for {image} in the local engine; push it first "
                        f"(`invoke push`) or {ask}")
    return digests[0]


def rehearse(stacks_file: str, stacks: Any, nodes: Any, late_node: Any,
             command: list[str], mounts: Any = None, attempts: Any = None,
             env: Any = None) -> int:
    """``invoke run``: the job's status. The nodes' output is passed on byte for byte and the
    rehearsal's own lines are one line each (``rehearse.say``), to a terminal or a pipe."""
    from docker.errors import ImageNotFound

    from matrix.image import engine
    from matrix.jobs import rehearse as rh
    from matrix.jobs.mounts import parse_all, refuse_image_folders

    count = options.nodes(nodes)
    parsed_mounts, _ = parse_all(mounts)
    late = None if late_node is None else integer(late_node, "--late-node")
    tries = 1 if attempts is None else integer(attempts, "--attempts", 1)
    if not command:
        raise UsageError("give the job command after --, e.g. invoke run --stack cpu-tcp "
                         "--nodes 3 -- python3 /opt/mnp/examples/allreduce.py")
    settings = rh.parse_env(list(env or []), count)
    matrix = load(stacks_file)
    stack = one_stack(matrix, stacks)
    refuse_image_folders(matrix, stack, parsed_mounts)
    rh.check_mounts(parsed_mounts)  # before the engine: a typo needs no Docker to be found
    result = plan(matrix, [stack])
    image = result.chains[stack][-1]
    client = engine.ensure()
    try:
        client.images.get(image)
    except ImageNotFound:
        raise UserError(f"{image} is not built; run `invoke build --stack {stack}`") from None
    return rh.rehearse(client, image, count, command, late, settings, log=rh.say,
                       mounts=parsed_mounts, attempts=tries, out=rh.write_out)


def explain(stacks_file: str, stacks: Any, instance_type: str | None, nodes: Any,
            launcher: str | None, as_json: bool, command: list[str], scheduler: str = "batch",
            rdzv: str | None = None) -> None:
    """Print each role's dry-run plan. A mistake in the command line (an unknown stack, instance or
    launcher, a bad --nodes) is one line and exit status 2; a pair jobdef refuses is one line
    and 1; a plan with problems (a real run stops there) is printed and exits 1."""
    from matrix.jobs import explain as ex
    from matrix.model.instances import INSTANCE_TYPES

    matrix = load(stacks_file)
    names = stack_list(stacks)
    if len(names) > 1:
        raise UsageError(f"--stack given {len(names)} times; explain takes one stack")
    stack = names[0] if names else default_stack(matrix)
    require(instance_type, "--instance-type", "p4d.24xlarge")
    count = options.nodes(nodes)
    # the three names a user types, worded as every other task words them (choose)
    for option, what, value, known in (
            ("--stack", "stack", stack, matrix.stacks),
            ("--instance-type", "instance type", instance_type, INSTANCE_TYPES),
            ("--launcher", "launcher", launcher, LAUNCHERS),
            ("--scheduler", "scheduler", scheduler, ex.SCHEDULERS),
            ("--rdzv", "rendezvous backend", rdzv, ex.RDZV_BACKENDS)):
        if value is not None:
            choose(str(value), known, what, option)
    if rdzv is not None and scheduler != "pytorchjob":
        raise UsageError(f"--rdzv {rdzv}: an elastic PyTorchJob's rendezvous; add --scheduler "
                         "pytorchjob")
    result = ex.explain(matrix, stack, str(instance_type), count, launcher, command,
                        scheduler=scheduler, rdzv=rdzv)
    if as_json:
        print(result.json())
    else:
        print(result.text())
    if result.stops():
        # a real run stops at these: a script or CI calling explain must see it fail
        sys.exit(EXIT_CANNOT)
