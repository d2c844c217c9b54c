"""The entrypoint's own plan run on a role derived from a generated artefact (``roles``).

:func:`plan_role` is what that role's node would print in its dry run, with the node facts the
dry run would probe taken from the stack's declarations (``explain.stack_facts``: versions,
programs, plugin) and the devices the scheduler passes in (``Role.devices``). Facts only a node
can probe stay declared: its address and interface, ``fi_info``'s answer, the real device count
beyond what the scheduler passes, ``/dev/shm`` and free space (no health check reads them here).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from entrypoint.plan import make as ep_plan
from entrypoint.probe.facts import NodeFacts
from matrix.jobs import explain
from matrix.jobs.roles import Role
from matrix.model.entities import Stack
from matrix.model.instances import get_instance_type


def role_facts(stack: Stack, role: Role) -> NodeFacts:
    """The stack's declared facts on the role's instance type, with the role's own devices."""
    facts = copy.copy(explain.stack_facts(stack, get_instance_type(role.instance_type)))
    devices = role.devices
    facts.gpus, facts.hpus = devices.gpus, devices.hpus
    facts.efa_devices = [f"uverbs{i}" for i in range(devices.efa)]
    facts.slots = devices.gpus or devices.hpus or 1
    facts.slots_source = (f"the scheduler passed {devices.gpus} GPUs" if devices.gpus
                          else f"the scheduler passed {devices.hpus} HPUs" if devices.hpus
                          else "no GPU or HPU passed in: 1")
    return facts


def plan_role(stack: Stack, role: Role) -> ep_plan.Plan:
    """The role's dry-run plan: the image's variables, then the role's, then ``make_plan``."""
    env = dict(explain.IMAGE_ENV, **role.env)
    facts = role_facts(stack, role)
    with tempfile.TemporaryDirectory() as tmp:
        for index, (path, content) in enumerate(sorted(role.files.items())):
            local = Path(tmp) / f"file{index}"
            local.write_text(content)
            env = {k: (str(local) if v == path else v) for k, v in env.items()}
        return explain.plan_for(env, facts, role.argv)
