"""The entrypoint's own dry-run plan of a role derived from a generated artefact (``roles``):
:func:`plan_role` is what that role's node prints in its dry run, with the facts its image
declares (``explain.role_facts``) and the devices the scheduler passes in. Facts only a node can
probe stay placeholders (``explain.NODE_ONLY``)."""

from __future__ import annotations

from entrypoint.plan import make as ep_plan
from matrix.jobs import explain
from matrix.jobs.roles import Role
from matrix.model.entities import Matrix, Stack


def plan_role(matrix: Matrix, stack: Stack, role: Role) -> ep_plan.Plan:
    """The role's dry-run plan (``explain.role_dry_run``)."""
    return explain.role_dry_run(matrix, stack, role).plan
