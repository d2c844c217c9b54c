"""``invoke explain``: the plan the main node of a stack would run on an instance type, without
hardware, without an image and without a build.

The settings are the ones ``invoke jobdef`` writes into the job definition
(:func:`matrix.jobs.jobdef.mnp_environment`, with the stack's fabric) plus the Batch variables of the
main node (index 0 of N). The node facts come from the stack's declared versions
(:meth:`matrix.model.entities.Stack.versions`: components, and what bases and components ``provide``) and
from the instance table (:data:`matrix.model.instances.INSTANCE_TYPES`). Then the entrypoint's own
:func:`entrypoint.plan.make_plan` decides, exactly as it does on the node.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrypoint import launchers, schedulers
from entrypoint import schedulers as ep_schedulers
from entrypoint.core.limits import MAX_NODES
from entrypoint.plan import make as ep_plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config
from matrix.errors import UsageError
from matrix.model.drivers import driver_floor
from matrix.model.entities import Matrix, Stack, comparable
from matrix.model.instances import INSTANCE_TYPES, InstanceType

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
# Where components put the files the plan looks for (as their Dockerfile.j2 install them).
EFA_LIBDIRS = ("/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib")
# The EFA installer's own copy of aws-ofi-nccl (installers >= 1.38.0).
EFA_PLUGIN_DIR = "/opt/amazon/ofi-nccl/lib"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# what the image gives every job: its PATH, root's HOME, and the PYTHONPATH that
# /usr/local/bin/mnp-entrypoint sets (docs/entrypoint.md "Image contract")
IMAGE_ENV = {"PATH": PATH, "HOME": "/root", "PYTHONPATH": "/opt/mnp/lib"}
PLACEHOLDER_COMMAND = ["python3", "train.py"]
# What ``--scheduler`` accepts: the schedulers a job is submitted to (``rank`` and ``single`` are
# what the entrypoint finds inside a job, not schedulers to explain a job for).
# The schedulers a job is submitted to: the entrypoint's adapters that say so (a new adapter
# module is one more, with no edit here).
SCHEDULERS = tuple(adapter.NAME for adapter in ep_schedulers.ORDER if adapter.SUBMITTED)
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")  # an elastic PyTorchJob's rdzvBackend


class ExplainError(UsageError):
    """Unknown stack, instance type or launcher, or a bad node count: one line, exit status 2
    (a pair the rules refuse is :func:`matrix.jobs.jobdef.check_pair`'s UserError: 1)."""


@dataclass(frozen=True)
class Explained:
    plan: ep_plan.Plan
    header: str

    def text(self) -> str:
        return self.plan.text(header=self.header)

    def json(self) -> str:
        return json.dumps(self.plan.to_dict(), indent=2, sort_keys=True)


def _version_at_least(version: str | None, minimum: str) -> bool:
    return bool(version) and comparable(version) >= comparable(minimum)


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


def _plugin_path(stack: Stack) -> str | None:
    """Where the stack's aws-ofi-nccl plugin is: its own layer's prefix, or the EFA installer's
    bundled copy when the efa layer ``provides`` it (EFA changelog 1.38.0: bundled under
    /opt/amazon/ofi-nccl, a directory the entrypoint searches, ``entrypoint.fabric.PLUGIN_GLOBS``;
    plugins >= 1.15 keep a libnccl-net.so name beside libnccl-net-ofi.so, changelog 1.42.0)."""
    plugin = stack.layer("aws-ofi-nccl")
    if plugin:
        return (plugin.spec.get("options", {}).get("prefix", "/opt/aws-ofi-nccl")
                + "/lib/libnccl-net.so")
    efa = stack.layer("efa")
    if efa and "aws-ofi-nccl" in (efa.spec.get("provides") or {}):
        return EFA_PLUGIN_DIR + "/libnccl-net.so"
    return None


def _openmpi_tool(stack: Stack, tool: str) -> str | None:
    """Where the stack's own Open MPI layer puts ``tool``: under the prefix it is built into
    from the release tarball (options.prefix, e.g. /opt/openmpi: images/openmpi/Dockerfile.j2
    puts prefix/bin on PATH), else the distribution's /usr/bin; None without such a layer."""
    layer = stack.layer("openmpi")
    if layer is None:
        return None
    prefix = (layer.spec.get("options") or {}).get("prefix")
    return f"{prefix}/bin/{tool}" if prefix else f"/usr/bin/{tool}"


def stack_facts(stack: Stack, instance: InstanceType) -> NodeFacts:
    """What a node of ``stack`` on ``instance`` has, from declarations only."""
    components = {layer.component for layer in stack.layers}
    versions, sources = _declared_versions(stack)
    efa_software = "efa" in components or "synapseai" in components
    binaries = _binaries(components, versions, efa_software, _openmpi_tool(stack, "mpirun"))
    plugin_path = _plugin_path(stack)
    wrapper = stack.layer("hccl-ofi-wrapper")
    # invoke jobdef passes the uverbs devices in only when the stack's fabric is efa
    efa_devices = ([f"uverbs{i}" for i in range(instance.efa_interfaces)]
                   if stack.fabric == "efa" else [])
    accel = instance.accelerators
    return NodeFacts(
        instance_type=instance.name,
        instance_source="MNP_INSTANCE_TYPE (set by invoke jobdef)",
        gpus=instance.gpus, hpus=instance.hpus, efa_devices=efa_devices,
        fi_info_efa=True if efa_software else None,
        # AWS Batch MNP runs awsvpc: the container's eth0 is its own ENI, an ENA device.
        nic_vendor="0x1d0f", interface="eth0", address="<node-0>",
        address_reason="route lookup on the node (placeholder: nothing probed)",
        slots=accel or 1,
        slots_source=(f"instance table: {instance.gpus} GPUs" if instance.gpus else
                      f"instance table: {instance.hpus} HPUs" if instance.hpus else
                      "no GPU or HPU on this instance type: 1"),
        versions=versions, version_sources=sources, binaries=binaries,
        plugin_path=plugin_path,
        hccl_wrapper=(wrapper.spec.get("options", {}).get("install_dir", "/usr/lib/habanalabs")
                      + "/libhccl_ofi_wrapper.so") if wrapper else None,
        libdirs=list(EFA_LIBDIRS) if efa_software else [],
        is_root=True, user="root", home="/root",
        origin=f"declared: stacks.yaml stack {stack.name} and the instance table row "
               f"{instance.name} (no hardware, image or build)",
    )


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


def _binaries(components: set[str], versions: dict[str, str], efa_software: bool,
              own_mpirun: str | None) -> dict[str, str | None]:
    """Where the stack's layers put each program the entrypoint looks for (None: absent);
    ``own_mpirun``: the stack's own Open MPI layer's mpirun, if it has one."""
    return {
        "python3": "/usr/bin/python3",
        "mpirun": "/opt/amazon/openmpi/bin/mpirun" if efa_software else own_mpirun,
        "sshd": "/usr/sbin/sshd" if "ssh" in components else None,
        "deepspeed": "/usr/local/bin/deepspeed" if versions.get("deepspeed") else None,
        "torchrun": "/usr/local/bin/torchrun"
        if _version_at_least(versions.get("pytorch"), "1.10.0") else None,
        "pdsh": "/usr/bin/pdsh" if "pdsh" in components else None,
        "fi_info": "/opt/amazon/efa/bin/fi_info" if efa_software else (
            "/usr/bin/fi_info" if "libfabric" in components else None),
    }


def explain(matrix: Matrix, stack_name: str, instance_type: str, nodes: int,
            launcher: str | None = "mpirun", command: list[str] | None = None,
            scheduler: str = "batch", rdzv: str | None = None) -> Explained:
    """The main node's plan under ``scheduler``: the environment that scheduler's adapter says
    node 0 gets (``example(nodes, 0)``; an MPIJob's launcher). ``launcher=None`` leaves
    ``MNP_LAUNCHER`` unset, so the scheduler's role picks it (mpirun on Batch and for a launcher,
    torchrun on a node of Slurm, a PyTorchJob or a TrainJob). ``rdzv`` (c10d, etcd, etcd-v2)
    makes the PyTorchJob elastic, with that rendezvous backend. Raises :class:`ExplainError` for
    unknown names or bad numbers, and :func:`matrix.jobs.jobdef.check_pair`'s UserError for a
    pair it refuses."""
    from matrix.jobs import jobdef

    _check_request(matrix, stack_name, instance_type, nodes, launcher, scheduler, rdzv)
    stack = matrix.stacks[stack_name]
    instance = INSTANCE_TYPES[instance_type]
    # the check invoke jobdef makes: the stack's rules as if it targeted only this type
    jobdef.check_pair(stack, instance_type)
    settings = jobdef.mnp_environment(instance, launcher or "mpirun", stack.fabric,
                                      jobdef.DEFAULT_WAIT_TIMEOUT_S, None)
    env = _main_node_environment(settings, nodes, launcher, scheduler, rdzv)
    facts = stack_facts(stack, instance)
    plan = _scheduled_plan(env, facts, list(command or PLACEHOLDER_COMMAND), scheduler, nodes,
                           instance.slots_per_node())
    if not command:
        plan.notes.append("no command given after --: python3 train.py shown")
    floor = driver_floor(stack)
    if floor:
        plan.notes.append("hosts need " + floor.line())
    if instance_type not in stack.instances:
        plan.notes.append(f"{instance_type} is not one of {stack_name}'s instances "
                          f"({', '.join(stack.instances)}): shown as asked")
    who = "the launcher" if plan.role["mode"] == "launcher" else "main node"
    header = (f"invoke explain: {who} of stack {stack_name} on {nodes} x {instance_type} under "
              f"{scheduler}, launcher {plan.launcher['unit']} (settings as invoke jobdef writes "
              "them, the scheduler's variables from its adapter's example; facts from "
              "stacks.yaml and the instance table; nothing probed)")
    return Explained(plan, header)


def _check_request(matrix: Matrix, stack_name: str, instance_type: str, nodes: int,
                   launcher: str | None, scheduler: str, rdzv: str | None) -> None:
    """Refuse an unknown name or a bad number with an :class:`ExplainError` naming the option."""
    if scheduler not in SCHEDULERS:
        raise ExplainError(f"--scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")
    if rdzv is not None and (scheduler != "pytorchjob" or rdzv not in RDZV_BACKENDS):
        raise ExplainError(f"--rdzv {rdzv!r}: an elastic PyTorchJob's backend, one of "
                           f"{', '.join(RDZV_BACKENDS)}, with --scheduler pytorchjob")

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


def _main_node_environment(settings: dict[str, str], nodes: int, launcher: str | None,
                           scheduler: str, rdzv: str | None) -> dict[str, Any]:
    """What node 0 sees: the image's variables, the ``MNP_*`` ``settings`` invoke jobdef writes
    and the variables ``scheduler``'s adapter example gives it."""
    env: dict[str, Any] = dict(IMAGE_ENV)
    env.update(settings)
    if launcher is None:
        del env["MNP_LAUNCHER"]
    if rdzv:
        env.update(schedulers.pytorchjob.elastic_example(nodes, rdzv))
    elif scheduler != "batch" or nodes > 1:
        env.update(schedulers.MODULES[scheduler].example(nodes, 0))
    if scheduler == "batch" and nodes > 1:
        env["AWS_BATCH_JOB_ID"] = "<job-id>"
    return env


def _scheduled_plan(env: dict[str, Any], facts: NodeFacts, command: list[str], scheduler: str,
                    nodes: int, slots: int) -> ep_plan.Plan:
    """``make_plan`` on the scheduler's environment. An MPIJob launcher reads the operator's
    hostfile (one ``<job>-worker-<i>.<job>.default.svc slots=N`` line per worker): written to a
    temporary directory for the plan, then named by the path the operator mounts."""
    if scheduler != "mpijob":
        return _plan(env, facts, command)
    mounted = env["OMPI_MCA_orte_default_hostfile"]
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "hostfile")
        Path(path).write_text("".join(f"job-worker-{i}.job.default.svc slots={slots}\n"
                                      for i in range(nodes)))
        plan = _plan(dict(env, OMPI_MCA_orte_default_hostfile=path), facts, command)
    text = json.dumps(plan.to_dict()["role"]).replace(path, mounted)
    plan.role = json.loads(text)
    plan.environment["OMPI_MCA_orte_default_hostfile"] = mounted
    return plan


def plan_for(env: dict[str, Any], facts: NodeFacts, command: list[str]) -> ep_plan.Plan:
    """``make_plan`` on ``env`` and ``facts``, with the hostfiles the node's dry run names."""
    return _plan(env, facts, command)


def _plan(env: dict[str, Any], facts: NodeFacts, command: list[str]) -> ep_plan.Plan:
    cfg = config.load(env)
    hostfiles = None if (cfg.mode == "child" or not (cfg.rendezvous or cfg.mode == "single")) \
        else {"openmpi": f"{cfg.state_dir}/hostfile", "plain": f"{cfg.state_dir}/hostfile.plain",
              "intel": f"{cfg.state_dir}/hostfile.intel"}
    return ep_plan.make_plan(cfg, facts, command, env, None, hostfiles)


def parse_nodes(raw: Any) -> int:
    """``--nodes`` as an int, or an :class:`ExplainError`."""
    try:
        return int(str(raw), 10)
    except ValueError:
        raise ExplainError(f"--nodes {raw!r} is not a whole number") from None
