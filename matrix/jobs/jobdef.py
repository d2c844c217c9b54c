"""AWS Batch multi-node parallel (MNP) job definitions for a stack.

:class:`BatchWriter` (``WRITER``, see ``matrix/jobs/writer.py``) renders a job spec, for
``invoke jobdef`` and ``invoke explain``, into the request body of Batch
``RegisterJobDefinition``: a ``multinode`` job whose one node range (``0:``) runs the stack
image, pinned by digest, on every node, with the instance type's GPUs, vCPUs and memory, one
``/dev/infiniband/uverbsN`` device per EFA interface (fabric ``efa`` only), an unlimited memlock
ulimit, a sized ``/dev/shm`` and the ``MNP_*`` settings the in-container entrypoint reads. The
result is checked against botocore's own Batch model before it is returned, so a malformed
definition fails here and not at ``RegisterJobDefinition`` time. :func:`batch_roles` reads each
node back from the definition as Batch starts it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from entrypoint.core.errors import INFRASTRUCTURE_EXIT
from entrypoint.launchers import NAMES as LAUNCHER_NAMES
from entrypoint.launchers import UNITS, command_unit
from matrix.errors import UsageError, UserError
from matrix.jobs.mounts import Mount, batch_volumes
from matrix.jobs.roles import Devices, Role
from matrix.jobs.runopts import Option, RunOpts
from matrix.jobs.spec import (
    DEFAULT_ATTEMPTS,
    MAX_ATTEMPTS,
    SECRET_ENV_NAME,
    JobSpec,
    batch_tags,
    check_launcher_command,
    is_pinned,
)
from matrix.jobs.writer import Prepared, Variant, Writer
from matrix.model.instances import InstanceType, get_instance_type, job_memory_mib

if TYPE_CHECKING:
    from botocore.model import Shape

# botocore is imported where a definition is checked or registered, not here: explain and every
# other writer import this module, and botocore's import alone took 0.28 s of each command.

# Batch's status reason when the instance under the job went away (a Spot reclaim, a host
# failure): "Host EC2 (instance i-...) terminated." This glob is the AWS Compute blog's, which
# retries on it for an EC2 Spot interruption ("Introducing retry strategies for AWS Batch",
# https://aws.amazon.com/blogs/compute/introducing-retry-strategies-for-aws-batch/); the Batch
# user guide's example (job_retries.html) matches AGENT and "Task failed to start" instead.
HOST_FAILURE_REASON = "Host EC2*"

# Batch containers: ulimits as set by aws-samples/awsome-distributed-training's Batch templates.
ULIMITS = (
    {"name": "memlock", "softLimit": -1, "hardLimit": -1},
    {"name": "stack", "softLimit": 67108864, "hardLimit": 67108864},
    {"name": "nofile", "softLimit": 1024000, "hardLimit": 1024000},
)

_SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:(secretsmanager|ssm):[a-z0-9-]+:\d{12}:\S+$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/\S+$")


def pin_image(image_uri: str, client: Any = None, auth_config: dict | None = None) -> str:
    """``image_uri`` by digest: returned as is when pinned, else resolved from the registry.

    Resolution asks the Docker engine (``client``, a ``docker.DockerClient``) for the registry's
    current manifest digest of the tag, so the job definition names exactly the image the tag
    points at now; later tag moves do not change what the job runs.
    """
    if is_pinned(image_uri):
        return image_uri
    if client is None:  # as typed on the command line: a usage mistake (exit 2)
        raise UsageError(
            f"--image-uri {image_uri!r} has no digest; give it as repo@sha256:<digest> "
            "(the digest `invoke push` printed)"
        )
    import docker.errors
    from docker.utils import parse_repository_tag

    repo, _tag = parse_repository_tag(image_uri)
    try:
        digest = client.images.get_registry_data(image_uri, auth_config=auth_config).id
    except docker.errors.APIError as exc:
        reason = exc.explanation or str(exc)
        raise UserError(f"--image-uri {image_uri!r}: cannot resolve its digest: {reason}") from None
    return f"{repo.split('@', 1)[0]}@{digest}"


def _efa_devices(count: int) -> list[dict[str, Any]]:
    """One device entry per EFA interface; containerPath must equal hostPath (Batch efa.html)."""
    return [
        {
            "hostPath": f"/dev/infiniband/uverbs{index}",
            "containerPath": f"/dev/infiniband/uverbs{index}",
            "permissions": ["READ", "WRITE", "MKNOD"],
        }
        for index in range(count)
    ]


def _resources(instance: InstanceType) -> list[dict[str, str]]:
    """Batch resourceRequirements: whole-instance VCPU and MEMORY, plus GPU on NVIDIA types."""
    resources = [
        {"type": "VCPU", "value": str(instance.vcpus)},
        {"type": "MEMORY", "value": str(job_memory_mib(instance))},
    ]
    if instance.gpus:
        resources.append({"type": "GPU", "value": str(instance.gpus)})
    return resources


def retry_strategy(attempts: int) -> dict[str, Any]:
    """Batch's ``retryStrategy``: up to ``attempts`` runs; retry on the entrypoint's
    infrastructure code (``entrypoint.core.errors.INFRASTRUCTURE_EXIT``: a node never joined, a
    peer was lost, a health check failed) and on a host that went away; exit on everything else,
    so a bug in the training command is never run twice. The last rule is needed: when no rule
    matches, Batch retries (https://docs.aws.amazon.com/batch/latest/APIReference/
    API_EvaluateOnExit.html)."""
    if not 1 <= attempts <= MAX_ATTEMPTS:
        raise UserError(f"--attempts {attempts}: Batch runs a job 1 to {MAX_ATTEMPTS} times")
    if attempts == 1:
        return {"attempts": 1}
    return {"attempts": attempts, "evaluateOnExit": [
        {"onExitCode": str(INFRASTRUCTURE_EXIT), "action": "RETRY"},
        {"onStatusReason": HOST_FAILURE_REASON, "action": "RETRY"},
        {"onReason": "*", "action": "EXIT"},
    ]}


def default_job_definition_name(stack: str, nodes: int, instance_type: str) -> str:
    """``mnp-<stack>-<N>x-<type>`` with characters Batch does not allow replaced by ``-``."""
    raw = f"mnp-{stack}-{nodes}x-{instance_type}"
    return re.sub(r"[^A-Za-z0-9_-]", "-", raw)[:128]


@dataclass(frozen=True)
class BatchOptions:
    """What a Batch job definition takes besides the :class:`JobSpec`: ``secret_arn`` (a Secrets
    Manager or SSM parameter ARN, the ``MNP_SECRET`` variable), the IAM roles, the definition's
    name (default :func:`default_job_definition_name`) and the per-attempt timeout."""

    secret_arn: str | None = None
    execution_role_arn: str | None = None
    job_role_arn: str | None = None
    name: str | None = None
    attempt_timeout_s: int | None = None


def _definition(stack: str, nodes: int, instance: InstanceType, image_uri: str,
                environment: Mapping[str, str], fabric: str, options: BatchOptions,
                command: Sequence[str], mounts: Sequence[Mount], attempts: int,
                notices: Sequence[str]) -> dict[str, Any]:
    """The definition from checked parts (a :class:`JobSpec`'s), validated against botocore's
    Batch model."""
    container = _base_container(instance, image_uri, fabric, environment)
    if command:
        container["command"] = list(command)
    if mounts:
        container["volumes"], container["mountPoints"] = batch_volumes(mounts)
    _add_secret_and_roles(container, options.secret_arn, options.execution_role_arn,
                          options.job_role_arn)
    definition = _multinode_definition(
        options.name or default_job_definition_name(stack, nodes, instance.name),
        stack, nodes, instance.name, container)
    definition["retryStrategy"] = retry_strategy(attempts)
    definition["tags"].update(batch_tags(notices))  # what the submitter must know (spec.py)
    if options.attempt_timeout_s is not None:
        definition["timeout"] = {"attemptDurationSeconds": options.attempt_timeout_s}
    validate_job_definition(definition)
    return definition


def _base_container(instance: InstanceType, image_uri: str, effective_fabric: str,
                    environment: Mapping[str, str]) -> dict[str, Any]:
    """The node container's image, resources, devices, limits and ``MNP_*`` environment."""
    container: dict[str, Any] = {
        "image": image_uri,
        "instanceType": instance.name,
        "resourceRequirements": _resources(instance),
        "linuxParameters": {
            # EFA devices are passed in only when the entrypoint is told fabric efa
            "devices": _efa_devices(
                instance.efa_interfaces if effective_fabric == "efa" else 0),
            "sharedMemorySize": instance.shm_mib,
        },
        "ulimits": [dict(limit) for limit in ULIMITS],
        "environment": [
            {"name": key, "value": value} for key, value in sorted(environment.items())
        ],
    }
    if not container["linuxParameters"]["devices"]:
        del container["linuxParameters"]["devices"]
    if instance.hpus:
        # Gaudi devices are not a Batch resource; the DL1 workshop job runs privileged.
        container["privileged"] = True
    return container


def _check_secret_and_role(secret_arn: str | None, execution_role_arn: str | None) -> None:
    """Each ARN of its kind, and a secret only with the execution role Batch reads it with."""
    if secret_arn:
        _check_secret(secret_arn)
        if not execution_role_arn:
            raise UsageError("--secret-arn needs --execution-role-arn: Batch reads secrets with "
                             "the job's execution role")
    if execution_role_arn:
        _check_role(execution_role_arn, "--execution-role-arn")


def _add_secret_and_roles(container: dict[str, Any], secret_arn: str | None,
                          execution_role_arn: str | None, job_role_arn: str | None) -> None:
    """Set the container's ``secrets`` and IAM roles, refusing a secret without an execution role."""
    _check_secret_and_role(secret_arn, execution_role_arn)
    if secret_arn:
        container["secrets"] = [{"name": SECRET_ENV_NAME, "valueFrom": secret_arn}]
    if execution_role_arn:
        container["executionRoleArn"] = execution_role_arn
    if job_role_arn:
        container["jobRoleArn"] = _check_role(job_role_arn, "--job-role-arn")


def _multinode_definition(name: str, stack: str, nodes: int, instance_name: str,
                          container: dict[str, Any]) -> dict[str, Any]:
    """A ``multinode`` definition whose one node range (``0:``) runs ``container`` on every node."""
    return {
        "jobDefinitionName": name,
        "type": "multinode",
        "platformCapabilities": ["EC2"],
        "propagateTags": True,
        "tags": {"mnp:stack": stack, "mnp:instance-type": instance_name},
        "nodeProperties": {
            "numNodes": nodes,
            "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": container}],
        },
    }


def _check_secret(arn: str) -> str:
    """``arn`` if it looks like a Secrets Manager / SSM parameter ARN, else a UserError."""
    if not _SECRET_ARN.match(arn):
        raise UsageError(f"--secret-arn {arn!r} is not a Secrets Manager or SSM parameter ARN")
    return arn


def _check_role(arn: str, flag: str) -> str:
    """``arn`` if it looks like an IAM role ARN, else a UserError naming ``flag``."""
    if not _ROLE_ARN.match(arn):
        raise UsageError(f"{flag} {arn!r} is not an IAM role ARN (arn:aws:iam::<account>:role/...)")
    return arn


@lru_cache(maxsize=1)
def _register_input_shape() -> Shape:
    """The Batch ``RegisterJobDefinition`` input shape from botocore's bundled service model."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("batch")
    return model.operation_model("RegisterJobDefinition").input_shape


def _enum_errors(value: Any, shape: Shape, path: str) -> list[str]:
    """Values outside the model's enums (botocore's validator leaves enums to the service)."""
    if shape.type_name == "structure" and isinstance(value, Mapping):
        return [
            error
            for key, item in value.items()
            if key in shape.members
            for error in _enum_errors(item, shape.members[key], f"{path}.{key}")
        ]
    if shape.type_name == "list" and isinstance(value, list):
        return [
            error
            for index, item in enumerate(value)
            for error in _enum_errors(item, shape.member, f"{path}[{index}]")
        ]
    if shape.type_name == "map" and isinstance(value, Mapping):
        return [
            error
            for key, item in value.items()
            for error in _enum_errors(item, shape.value, f"{path}.{key}")
        ]
    enum = getattr(shape, "enum", None)
    if enum and value not in enum:
        return [f"Invalid value for parameter {path}: {value!r}, valid values: {enum}"]
    return []


def validate_job_definition(definition: Mapping[str, Any]) -> None:
    """Check ``definition`` against botocore's Batch model: botocore's own parameter validation
    (types, required keys, lengths, ranges), then the model's enums.

    Also checks the MNP rules the model cannot express: a ``multinode`` type, ``mainNode``
    inside ``numNodes``, and node ranges present.
    """
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    shape = _register_input_shape()
    try:
        validate_parameters(dict(definition), shape)
    except ParamValidationError as exc:
        detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise UserError(
            f"job definition fails Batch RegisterJobDefinition validation: {detail}"
        ) from None
    enum_errors = _enum_errors(definition, shape, "definition")
    if enum_errors:
        raise UserError(
            f"job definition fails Batch RegisterJobDefinition validation: {enum_errors[0]}"
        )
    nodes = definition.get("nodeProperties") or {}
    if definition.get("type") != "multinode" or not nodes.get("nodeRangeProperties"):
        raise UserError("job definition is not a multinode definition with node ranges")
    if not 0 <= nodes.get("mainNode", -1) < nodes.get("numNodes", 0):
        raise UserError("job definition: mainNode must be a node index below numNodes")


def batch_client_for(region: str | None = None, profile: str | None = None) -> Any:
    """A Batch client from a boto3 session (``--profile``, ``--region``, else the usual AWS
    configuration); one line when no region is configured or the profile is unknown."""
    import boto3
    from botocore.exceptions import NoRegionError, ProfileNotFound

    try:
        session = boto3.session.Session(profile_name=profile, region_name=region)
        return session.client("batch")
    except ProfileNotFound:
        raise UserError(f"--profile {profile!r}: no AWS profile of that name in the AWS config "
                        "files") from None
    except NoRegionError:
        raise UserError("no AWS region for --register: pass --region (e.g. --region us-east-1) "
                        "or set AWS_REGION / a region in the AWS profile") from None


def register_job_definition(definition: Mapping[str, Any], batch_client: Any = None) -> dict:
    """Register ``definition`` with AWS Batch; returns ``{jobDefinitionName, jobDefinitionArn,
    revision}``. ``batch_client`` defaults to :func:`batch_client_for` (region and credentials
    from the usual AWS configuration)."""
    from botocore.exceptions import BotoCoreError, ClientError

    validate_job_definition(definition)
    if batch_client is None:
        batch_client = batch_client_for()
    try:
        response = batch_client.register_job_definition(**definition)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise UserError(
            f"Batch RegisterJobDefinition refused: {error.get('Code')}: {error.get('Message')}"
        ) from None
    except BotoCoreError as exc:
        raise UserError(f"Batch RegisterJobDefinition failed: {exc}") from None
    return {key: response[key] for key in ("jobDefinitionName", "jobDefinitionArn", "revision")}


# -- the roles of a job definition ----------------------------------------------------------------
# The node range's ``containerProperties`` (``environment``, ``secrets``, ``command``,
# ``resourceRequirements`` GPUs, ``linuxParameters.devices``) plus the variables Batch adds to
# every node of a multi-node parallel job: ``AWS_BATCH_JOB_ID``, ``AWS_BATCH_JOB_ATTEMPT``,
# ``AWS_BATCH_JOB_NUM_NODES``, ``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX``,
# and on child nodes only ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` (BATCH_SOURCE).
# botocore's model of ``RegisterJobDefinition`` is the artefact's schema
# (:func:`validate_job_definition`).
BATCH_SOURCE = ("https://docs.aws.amazon.com/batch/latest/userguide/job_env_vars.html "
                "(AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS: child nodes only)")
MAIN_ADDRESS = "10.0.0.1"  # Batch's main node, as its children are told it


def batch_roles(definition: Mapping[str, Any], job_id: str = "job-1") -> list[Role]:
    """The main node and one child (the roles every other child repeats)."""
    props = definition["nodeProperties"]
    count, main = props["numNodes"], props["mainNode"]
    indexes = sorted({main, *[i for i in range(count) if i != main][:1]})
    return [_batch_node(props, index, count, main, job_id) for index in indexes]


def _batch_node(props: Mapping[str, Any], index: int, count: int, main: int,
                job_id: str) -> Role:
    container = _node_range(props["nodeRangeProperties"], index, count)
    env = {e["name"]: e["value"] for e in container.get("environment", [])}
    for secret in container.get("secrets", []):
        env[secret["name"]] = f"<{secret['valueFrom']}>"
    env.update(AWS_BATCH_JOB_ID=job_id, AWS_BATCH_JOB_ATTEMPT="1",
               AWS_BATCH_JOB_NUM_NODES=str(count), AWS_BATCH_JOB_NODE_INDEX=str(index),
               AWS_BATCH_JOB_MAIN_NODE_INDEX=str(main))
    if index != main:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = MAIN_ADDRESS
    gpus = sum(int(r["value"]) for r in container.get("resourceRequirements", [])
               if r["type"] == "GPU")
    devices = container.get("linuxParameters", {}).get("devices", [])
    efa = sum(1 for d in devices if d["hostPath"].startswith("/dev/infiniband/uverbs"))
    instance = get_instance_type(container["instanceType"])
    # a privileged container sees every device of the host (the Gaudi cards)
    hpus = instance.hpus if container.get("privileged") else 0
    name = "main node" if index == main else f"child node {index}"
    return Role(name, env, list(container.get("command", [])), Devices(gpus, hpus, efa),
                instance.name)


def _node_range(ranges: list[Mapping[str, Any]], index: int, count: int) -> Mapping[str, Any]:
    """The container of the node range ``start:[end]`` that holds node ``index``."""
    for item in ranges:
        start, _, end = item["targetNodes"].partition(":")
        low = int(start or 0)
        high = int(end) if end else count - 1
        if low <= index <= high:
            return item["container"]
    raise ValueError(f"no node range holds node {index}")


# -- the writer -------------------------------------------------------------------------------------

# AWS Batch's own default is lower than the entrypoint's node limit, but AWS raises it on
# request, so above it is a note, not an error: "You can have up to 1,000 nodes in a single job.
# This is the default limit ... You can request to increase this limit." (AWS Batch User Guide,
# "Node groups", https://docs.aws.amazon.com/batch/latest/userguide/mnp-node-groups.html).
BATCH_DEFAULT_MAX_NODES = 1000
BATCH_NODES_SOURCE = ("AWS Batch User Guide, \"Node groups\": "
                      "https://docs.aws.amazon.com/batch/latest/userguide/mnp-node-groups.html")

BATCH_OPTIONS = RunOpts((
    Option("launcher", "the launcher the main node runs (MNP_LAUNCHER); none runs the command "
           "itself on the main node, with SSH to the others ready", choices=tuple(LAUNCHER_NAMES),
           default="mpirun", example="mpirun", what="launcher",
           variable="MNP_LAUNCHER"),
    Option("attempts", "runs of the job, a retryStrategy: infrastructure failures (exit 200, a "
           "terminated host) are retried, a failing command never", kind=int,
           default=DEFAULT_ATTEMPTS, minimum=1, maximum=MAX_ATTEMPTS, example="2"),
    Option("secret_arn", "Secrets Manager or SSM parameter ARN given to every node as MNP_SECRET",
           example="arn:aws:secretsmanager:..."),
    Option("execution_role_arn", "the IAM role Batch reads the secret with",
           example="arn:aws:iam::123456789012:role/NAME"),
    Option("register", "call batch:RegisterJobDefinition with it", kind=bool, action=True),
    Option("region", "AWS region for --register", default_text="the AWS configuration's",
           example="us-east-1", action=True),
    Option("profile", "AWS profile for --register", default_text="the AWS configuration's",
           example="default", action=True),
))


class BatchWriter(Writer):
    """AWS Batch multi-node parallel jobs: ``invoke jobdef``."""

    task = "jobdef"
    summary = "AWS Batch multi-node job definition of a stack, checked with botocore"
    file_name = "jobdef.json"
    scheduler_name = "AWS Batch"
    schedulers = ("batch",)
    what = "the job definition's command"

    def run_options(self) -> RunOpts:
        return BATCH_OPTIONS

    def prepare(self, values: dict[str, Any]) -> Prepared:
        """The secret and roles checked as Batch takes them (a secret needs the role that reads
        it), before anything else is looked at."""
        secret, role = values.get("secret_arn"), values.get("execution_role_arn")
        _check_secret_and_role(secret, role)
        return Prepared(values["launcher"], BatchOptions(secret, role), values["attempts"])

    def action(self, values: dict[str, Any]) -> Any:
        """``--register``: batch:RegisterJobDefinition, with a session made before writing."""
        if not values.get("register"):
            return None
        client = batch_client_for(values.get("region"), values.get("profile"))

        def register(definition: dict[str, Any]) -> str:
            answer = register_job_definition(definition, client)
            return f"registered {answer.get('jobDefinitionArn', '?')}"

        return register

    def notes(self, nodes: int) -> list[str]:
        if nodes > BATCH_DEFAULT_MAX_NODES:
            return [f"--nodes {nodes} is above AWS Batch's default limit of "
                    f"{BATCH_DEFAULT_MAX_NODES} nodes in a job, which AWS raises on request "
                    f"({BATCH_NODES_SOURCE})"]
        return []

    def variants(self) -> tuple[Variant, ...]:
        """Every launcher unit: Batch starts one entrypoint per node, the main node launches."""
        return tuple(Variant(name, name, BatchOptions(), "batch")
                     for name in LAUNCHER_NAMES)

    def check(self, launcher: str, nodes: int, command: Sequence[str], options: Any) -> None:
        """A command that is itself a launcher under another: the main node would nest them.
        ``--launcher none`` runs it as is on the main node (with the hostfile and SSH ready for
        a launcher that reaches the hosts; one that does not would run there alone)."""
        unit = command_unit(list(command))
        as_is = (", or --launcher none to run the command as is on the main node, with the "
                 "job's hostfile and SSH ready" if unit is None or UNITS[unit].reaches_hosts
                 else "")
        check_launcher_command(
            launcher, command, f"under AWS Batch the main node would start {launcher} around it",
            f"give the program alone (e.g. -- python3 train.py) with --launcher "
            f"{unit or launcher}{as_is}")

    def render(self, spec: JobSpec, options: Any = None) -> dict[str, Any]:
        if spec.elastic is not None:
            raise UserError("--elastic: only a pytorchjob has elastic bounds, not an AWS Batch "
                            "job")
        return _definition(spec.stack.name, spec.nodes, spec.instance, spec.image_uri,
                           spec.environment(), spec.effective_fabric, options or BatchOptions(),
                           spec.command, spec.mounts, spec.attempts, spec.notices)

    def text(self, artefact: dict[str, Any]) -> str:
        """The ``RegisterJobDefinition`` request as JSON (``aws batch register-job-definition
        --cli-input-json``)."""
        return json.dumps(artefact, indent=2)

    def roles(self, artefact: dict[str, Any]) -> list[Role]:
        return batch_roles(artefact)


WRITER = BatchWriter()
