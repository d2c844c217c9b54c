"""What every job writer shares, so that no writer imports another: the image reference rule,
the ``MNP_*`` settings the entrypoint reads, the attempts bounds, and the notices for the
scheduler's user.

``notices`` are lines a writer must carry to whoever submits the artefact (a stack's minimum
NVIDIA driver, a cluster requirement): each writer renders them in its own format
(:func:`batch_tags` for a Batch definition's tags, :func:`comment_lines` for the sbatch script's
head and the YAML's first comments, :func:`annotation` for a Kubeflow manifest), so adding one is
one line where the notices are gathered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from matrix.errors import UserError
from matrix.model.instances import InstanceType

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
            raise UserError(f"--env {name!r}: not a valid environment variable name")
        if name.startswith("AWS_BATCH_"):
            raise UserError(f"--env {name}: the AWS_BATCH_ prefix is reserved by AWS Batch")
        if name == SECRET_ENV_NAME:
            raise UserError(f"--env {name}: pass the secret with --secret-arn, not in plain text")
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
