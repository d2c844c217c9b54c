"""Tasks that run or publish a built stack: ``push``, ``jobdef``, ``run``, ``explain``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from docker.errors import ImageNotFound

from matrix.cli.options import (
    LAUNCHERS,
    choose,
    console,
    default_stack,
    integer,
    load,
    one_stack,
    require,
    shown,
    stack_list,
)
from matrix.errors import UserError
from matrix.image.plan import plan
from matrix.model.entities import Matrix
from matrix.model.settings import ROOT

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
    outcome = publish.push_stack(client, result.chains[stack], result.final_ref(stack), stack,
                                 registry, _git_sha(), force=force, log=console.print)
    console.print(f"pushed {outcome.pushed} tag(s); image: {outcome.image_digest_uri}")


def jobdef(stacks_file: str, stacks: Any, nodes: Any, instance_type: str | None,
           image_uri: str | None, secret_arn: str | None, execution_role_arn: str | None,
           launcher: str, output: str | None, register: bool) -> dict[str, Any]:
    from matrix.deploy import jobdef as jd
    from matrix.model.instances import INSTANCE_TYPES

    count = integer(require(nodes, "--nodes", "2"), "--nodes", minimum=1)
    instance_type = choose(require(instance_type, "--instance-type", "c5n.18xlarge"),
                           INSTANCE_TYPES, "instance type", "--instance-type")
    launcher = choose(launcher, LAUNCHERS, "launcher", "--launcher")
    matrix = load(stacks_file)
    stack = one_stack(matrix, stacks)
    s = matrix.stack(stack)
    jd.check_pair(s, instance_type)  # before resolving the image: a bad pair needs no engine
    uri = jd.pin_image(image_uri) if image_uri else _local_digest_uri(matrix, stack)
    definition = jd.definition_for_stack(s, count, instance_type, uri, secret_arn=secret_arn,
                                         launcher=launcher, execution_role_arn=execution_role_arn)
    text = json.dumps(definition, indent=2)
    if output:
        Path(output).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {shown(Path(output))}")
    else:
        print(text)
    if register:
        answer = jd.register_job_definition(definition)
        print(f"registered {answer.get('jobDefinitionArn', '?')}")
    return definition


def _local_digest_uri(matrix: Matrix, stack: str) -> str:
    """The pushed digest of the stack's image, read only from an engine that already runs."""
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
             command: list[str]) -> int:
    from matrix.deploy import rehearse as rh
    from matrix.image import engine

    count = integer(nodes, "--nodes", minimum=1)
    late = None if late_node is None else integer(late_node, "--late-node")
    if not command:
        raise UserError("give the job command after --, e.g. invoke run --stack cpu-tcp "
                        "--nodes 3 -- python3 /opt/mnp/examples/allreduce.py")
    matrix = load(stacks_file)
    stack = one_stack(matrix, stacks)
    result = plan(matrix, [stack])
    image = result.chains[stack][-1]
    client = engine.ensure()
    try:
        client.images.get(image)
    except ImageNotFound:
        raise UserError(f"{image} is not built; run `invoke build --stack {stack}`") from None
    return rh.rehearse(client, image, count, command, late, {}, log=console.print)


def explain(stacks_file: str, stacks: Any, instance_type: str | None, nodes: Any, launcher: str,
            as_json: bool, command: list[str]) -> None:
    """Print the main node's plan. An unknown stack, instance or launcher, a pair jobdef refuses,
    or a bad --nodes, is one line on stderr and exit status 2 (the entrypoint's code for bad
    settings); a plan with problems (a real run stops there) is printed and exits 1."""
    from matrix.deploy import explain as ex
    from matrix.model.instances import INSTANCE_TYPES

    matrix = load(stacks_file)
    names = stack_list(stacks)
    try:
        if len(names) > 1:
            raise ex.ExplainError(f"--stack given {len(names)} times; explain takes one stack")
        stack = names[0] if names else default_stack(matrix)
        if instance_type is None:
            raise ex.ExplainError("missing option --instance-type (e.g. --instance-type p4d.24xlarge)")
        # the three names a user types, worded as every other task words them (choose)
        for option, what, value, known in (
                ("--stack", "stack", stack, matrix.stacks),
                ("--instance-type", "instance type", instance_type, INSTANCE_TYPES),
                ("--launcher", "launcher", launcher, LAUNCHERS)):
            try:
                choose(str(value), known, what, option)
            except UserError as exc:
                raise ex.ExplainError(str(exc)) from None
        result = ex.explain(matrix, stack, instance_type, ex.parse_nodes(nodes), launcher, command)
    except ex.ExplainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    if as_json:
        print(result.json())
    else:
        print(result.text())
    if result.plan.problems:
        # a real run stops at these: a script or CI calling explain must see it fail
        sys.exit(1)
