"""Tasks that run or publish a built stack: ``push``, ``run``, and the image a writer's task names
(the writers' tasks and ``explain`` are made from their declarations: matrix/cli/jobtasks.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from matrix.cli import options
from matrix.cli.options import integer, load, one_stack, require
from matrix.errors import UsageError, UserError
from matrix.model.entities import Matrix
from matrix.model.settings import ROOT

# What `invoke run` without a command suggests: a program every stack's image has (hostname is
# an Essential package of Debian, https://www.debian.org/doc/debian-policy/ch-binary.html
# #essential-packages), run on every rank by the default launcher.
RUN_EXAMPLE = "hostname"

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
    from matrix.image.plan import plan

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


def image_uri(matrix: Matrix, stack: str, given: str | None) -> str:
    """``--image-uri`` (by digest), or the pushed digest of the stack's image."""
    from matrix.jobs import jobdef as jd

    return jd.pin_image(given) if given else _local_digest_uri(matrix, stack)


def _local_digest_uri(matrix: Matrix, stack: str) -> str:
    """The pushed digest of the stack's image, read only from an engine that already runs."""
    from docker.errors import ImageNotFound

    from matrix.deploy.digest_uri import default_image_uri
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
    # never a digest only this machine can pull (a loopback registry); a private one is said
    chosen = default_image_uri(image, digests)
    if chosen.note:
        print(f"note: {chosen.note}", file=sys.stderr)
    return chosen.uri


def rehearse(stacks_file: str, stacks: Any, nodes: Any, late_node: Any,
             command: list[str], mounts: Any = None, attempts: Any = None,
             env: Any = None) -> int:
    """``invoke run``: the job's status. The nodes' output is passed on byte for byte and the
    rehearsal's own lines are one line each (``rehearse.say``), to a terminal or a pipe."""
    from docker.errors import ImageNotFound

    from matrix.image import engine
    from matrix.image.plan import plan
    from matrix.jobs import rehearse as rh
    from matrix.jobs.mounts import parse_all
    from matrix.jobs.request import refuse_image_folders
    from matrix.jobs.spec import MAX_ATTEMPTS

    count = options.nodes(nodes)
    parsed_mounts, _ = parse_all(mounts)
    late = None if late_node is None else integer(late_node, "--late-node")
    if late is not None and not 0 <= late < count:
        raise UsageError(f"--late-node {late}: a node index from 0 to {count - 1} of --nodes "
                         f"{count}")
    tries = 1 if attempts is None else integer(attempts, "--attempts", 1)
    if tries > MAX_ATTEMPTS:
        raise UsageError(f"--attempts {tries}: expected a whole number from 1 to {MAX_ATTEMPTS} "
                         "(AWS Batch's retryStrategy)")
    if not command:
        raise UsageError(f"give the job command after --, e.g. invoke run --stack "
                         f"{stacks[0] if stacks else 'cpu-tcp'} --nodes {count} -- {RUN_EXAMPLE}")
    matrix = load(stacks_file)
    stack = one_stack(matrix, stacks)
    # a mount over the image's folders is a usage mistake (2), said before a missing host folder
    refuse_image_folders(matrix, matrix.stack(stack), parsed_mounts, ())
    rh.check_mounts(parsed_mounts)  # before the engine: a typo needs no Docker to be found
    settings = rh.parse_env(list(env or []), count)
    result = plan(matrix, [stack])
    image = result.chains[stack][-1]
    client = engine.ensure()
    try:
        client.images.get(image)
    except ImageNotFound:
        raise UserError(f"{image} is not built; run `invoke build --stack {stack}`") from None
    return rh.rehearse(client, image, count, command, late, settings, log=rh.say,
                       mounts=parsed_mounts, attempts=tries, out=rh.write_out)
