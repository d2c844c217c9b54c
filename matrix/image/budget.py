"""Per-layer size budgets: no filesystem layer of a stack's image may grow past its budget.

A node pulls an image before its job starts, and Docker downloads a few layers at a time (three
by default: dockerd's ``--max-concurrent-downloads``,
https://docs.docker.com/reference/cli/dockerd/ section Options), so one giant layer is one serial
download that every node of every job pays for. AWS Batch's guidance is to keep layers small for
the same reason. A stack's ``layer_budget_mb`` in stacks.yaml (an integer, or ``default`` plus
per-component budgets where one package is bigger) is checked against ``docker history`` of each
of the stack's images after the build: the filesystem layers each component image adds on top of
its parent.
"""

from __future__ import annotations

from dataclasses import dataclass

import docker

from matrix.errors import UserError
from matrix.image.plan import Plan


@dataclass(frozen=True)
class Step:
    """One filesystem layer as ``docker history`` shows it."""

    size: int
    created_by: str


def added_steps(client: docker.DockerClient, ref: str, parent: str) -> list[Step]:
    """The history entries ``ref`` adds on top of ``parent`` (newest first)."""
    ours = client.api.history(ref)
    theirs = client.api.history(parent)
    return [Step(int(e.get("Size") or 0), str(e.get("CreatedBy") or ""))
            for e in ours[:max(len(ours) - len(theirs), 0)]]


def check(client: docker.DockerClient, plan: Plan, stacks: list[str]) -> None:
    """Raise one line for the first layer over its stack's budget (nothing when all fit)."""
    seen: set[tuple[str, int]] = set()
    for name in stacks:
        stack = plan.matrix.stack(name)
        for layer in plan.chain(name):
            limit = stack.layer_budget(layer.component)
            if not limit or (layer.ref, limit) in seen:
                continue
            seen.add((layer.ref, limit))
            for step in added_steps(client, layer.ref, layer.parent):
                if step.size > limit * 1_000_000:
                    raise UserError(
                        f"{stack.where}: stack {name}: layer {layer.name} ({layer.ref}) adds a "
                        f"{round(step.size / 1_000_000)} MB filesystem layer, over its "
                        f"layer_budget_mb of {limit} (step: {_short(step.created_by)}); split "
                        "what that step installs across steps or layers")


def _short(created_by: str) -> str:
    text = " ".join(created_by.replace("/bin/sh -c #(nop) ", "").split())
    return text if len(text) <= 100 else text[:97] + "..."
