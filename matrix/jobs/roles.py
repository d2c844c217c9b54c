"""Each role of a generated job as its scheduler starts it, read from the artefact itself.

One function per writer takes what that writer generated (the Batch job definition, the sbatch
script, the Kubeflow manifest) and yields every distinct role's container environment, arguments
and devices as the scheduler produces them from it, never from a second model of the job:

- AWS Batch (:func:`batch_roles`): the node range's ``containerProperties`` (``environment``,
  ``secrets``, ``command``, ``resourceRequirements`` GPUs, ``linuxParameters.devices``) plus the
  variables Batch adds to every node of a multi-node parallel job: ``AWS_BATCH_JOB_ID``,
  ``AWS_BATCH_JOB_ATTEMPT``, ``AWS_BATCH_JOB_NUM_NODES``, ``AWS_BATCH_JOB_NODE_INDEX``,
  ``AWS_BATCH_JOB_MAIN_NODE_INDEX``, and on child nodes only
  ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` (:data:`BATCH_SOURCE`). botocore's model of
  ``RegisterJobDefinition`` is the artefact's schema (``jobdef.validate_job_definition``).
- Slurm (:func:`slurm_roles`): the script's ``export`` lines (srun passes the batch script's
  environment to every task: ``--export=ALL`` is its default) plus what srun sets per task for
  the script's one srun line and ``#SBATCH`` lines: ``SLURM_PROCID``/``SLURM_LOCALID``/
  ``SLURM_NODEID`` and the step's counts and node list, GPUs where ``--gpus-per-node`` asks, and
  ``PMIX_RANK`` with ``--mpi=pmix`` (:data:`SLURM_SOURCE`, measured on Slurm 22.05 in the
  project's Slurm play). The step's ``MNP_SECRET`` is made by the script at run time: a
  placeholder of its length stands for it.
- Kubeflow (:func:`k8s_roles`): each pod template's container (``env``, ``args``, resource
  limits) plus what the operator injects per role: the training-operator's ``PET_*``,
  ``MASTER_*``, ``WORLD_SIZE``/``RANK`` for a PyTorchJob (:data:`PYTORCHJOB_SOURCE`), Kubeflow
  Trainer's torch plugin ``PET_*`` for a TrainJob (:data:`TRAINJOB_SOURCE`), and for an MPIJob
  ``K_MPI_JOB_ROLE``, the launcher's ``OMPI_MCA_*`` and mounted hostfile, and on the launcher
  (``runLauncherAsWorker`` unset) ``NVIDIA_VISIBLE_DEVICES`` and ``NVIDIA_DRIVER_CAPABILITIES``
  blanked, with no device at all (:data:`MPIJOB_SOURCE`).

The names the operators inject are the entrypoint's adapters' (``entrypoint/schedulers``), which
cite the same sources; every value here comes from the artefact.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from matrix.jobs import sbatch
from matrix.model.instances import get_instance_type

BATCH_SOURCE = ("https://docs.aws.amazon.com/batch/latest/userguide/job_env_vars.html "
                "(AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS: child nodes only)")
SLURM_SOURCE = ("https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES; "
                "https://slurm.schedmd.com/srun.html#OPT_export (ALL by default)")
PYTORCHJOB_SOURCE = ("kubeflow/training-operator pkg/controller.v1/pytorch/envvar.go setPodEnv, "
                     "master.go, elastic.go (release-1.9)")
TRAINJOB_SOURCE = ("kubeflow/trainer pkg/runtime/framework/plugins/torch/torch.go (master, as "
                   "entrypoint/schedulers/trainjob.py cites it)")
MPIJOB_SOURCE = ("kubeflow/mpi-operator pkg/controller/mpi_job_controller.go newLauncherPodTemplate"
                 " and newWorker (master, as entrypoint/schedulers/mpijob.py cites it)")
# The training-operator's default PyTorchJob port, and Trainer's torch plugin's master port.
PYTORCHJOB_PORT = "23456"
TRAINJOB_PORT = "29500"
MPI_HOSTFILE = "/etc/mpi/hostfile"  # where the MPI operator mounts the job's ConfigMap
SECRET_PLACEHOLDER = "0" * 64  # the length of the step secret the sbatch script makes
MAIN_ADDRESS = "10.0.0.1"  # Batch's main node, as its children are told it


@dataclass(frozen=True)
class Devices:
    """What the scheduler passes into the container."""

    gpus: int = 0
    hpus: int = 0
    efa: int = 0


@dataclass
class Role:
    """One role's container as started: ``argv`` is what the image's ENTRYPOINT gets (the
    container's command or args); ``files`` what the scheduler mounts (path: content)."""

    name: str
    env: dict[str, str]
    argv: list[str]
    devices: Devices
    instance_type: str
    files: dict[str, str] = field(default_factory=dict)


# -- AWS Batch --------------------------------------------------------------------------------

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


# -- Slurm ------------------------------------------------------------------------------------

def slurm_roles(script: str, instance_type: str, job_id: str = "1234") -> list[Role]:
    """Node 0's first task and the last node's last task, as srun starts them."""
    options = sbatch.directives(script)  # the writer's own reader of its #SBATCH lines
    nodes = int(options["--nodes"])
    per_node = int(options.get("--ntasks-per-node", "1"))
    gpus = int(options.get("--gpus-per-node", "0"))
    exports = _exports(script)
    srun, task = _srun_line(script)
    instance = get_instance_type(instance_type)
    tasks = nodes * per_node
    hosts = f"node[1-{nodes}]" if nodes > 1 else "node1"
    layout = f"{per_node}(x{nodes})" if nodes > 1 else str(per_node)
    roles = []
    for node, local in sorted({(0, 0), (nodes - 1, per_node - 1)}):
        rank = node * per_node + local
        env = dict(exports)
        env.update(SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_STEP_ID="0", SLURM_STEPID="0",
                   SLURM_NODEID=str(node), SLURM_PROCID=str(rank), SLURM_LOCALID=str(local),
                   SLURM_NTASKS=str(tasks), SLURM_NPROCS=str(tasks), SLURM_NNODES=str(nodes),
                   SLURM_JOB_NUM_NODES=str(nodes), SLURM_JOB_NODELIST=hosts,
                   SLURM_NODELIST=hosts, SLURM_STEP_NODELIST=hosts,
                   SLURM_STEP_NUM_NODES=str(nodes), SLURM_STEP_NUM_TASKS=str(tasks),
                   SLURM_STEP_TASKS_PER_NODE=layout, SLURM_TASKS_PER_NODE=layout,
                   SLURMD_NODENAME=f"node{node + 1}")
        if gpus:
            env.update(SLURM_GPUS_ON_NODE=str(gpus),
                       CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(gpus)))
        if "--mpi=pmix" in srun:
            env.update(PMIX_RANK=str(rank), PMIX_NAMESPACE=f"slurm.pmix.{job_id}.0")
        # --exclusive whole nodes through pyxis: the container shares the host's /dev
        devices = Devices(gpus, instance.hpus, instance.efa_interfaces)
        roles.append(Role(f"node {node} task {local}", env, task, devices, instance.name))
    return roles


def _exports(script: str) -> dict[str, str]:
    """The script's ``export NAME=value`` lines; a secret the script makes is a placeholder."""
    env = {}
    for line in script.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export "):].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        elif line.startswith("export "):  # `export MNP_SECRET` after the script made it
            env[line.split()[1]] = SECRET_PLACEHOLDER
    return env


def _srun_line(script: str) -> tuple[list[str], list[str]]:
    """The srun line's options and the task's argv (the words after the ENTRYPOINT path)."""
    text = script.replace("\\\n", " ")
    (line,) = [item for item in text.splitlines() if item.lstrip().startswith("srun ")]
    words = shlex.split(line.split(" || ")[0])
    first = next(i for i, word in enumerate(words) if not word.startswith("-") and i > 0)
    return words[:first], words[first + 1:]


# -- Kubeflow ---------------------------------------------------------------------------------

def k8s_roles(manifest: Mapping[str, Any], namespace: str = "default") -> list[Role]:
    """Each replica type's first pod (and an MPIJob's launcher)."""
    kind = manifest["kind"]
    if kind == "PyTorchJob":
        return _pytorchjob_roles(manifest)
    if kind == "TrainJob":
        return _trainjob_roles(manifest)
    return _mpijob_roles(manifest, namespace)


def _container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's env as the kubelet hands it over: ``$$`` is ``$`` (no ``$(NAME)`` in what
    the writers write: ``k8s.k8s_literal`` doubles every ``$``)."""
    return {e["name"]: e["value"].replace("$$", "$") for e in container.get("env", [])}


def _args(container: Mapping[str, Any]) -> list[str]:
    return [word.replace("$$", "$") for word in container.get("args", [])]


def _devices(limits: Mapping[str, str]) -> Devices:
    return Devices(int(limits.get("nvidia.com/gpu", 0)), int(limits.get("habana.ai/gaudi", 0)),
                   int(limits.get("vpc.amazonaws.com/efa", 0)))


def _pod_instance(pod: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
    selector = pod.get("spec", {}).get("nodeSelector") or {}
    return selector.get("node.kubernetes.io/instance-type") or \
        manifest["metadata"]["labels"]["mnp-stacks/instance-type"]


def _pytorchjob_roles(manifest: Mapping[str, Any]) -> list[Role]:
    spec = manifest["spec"]
    name = manifest["metadata"]["name"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(r["replicas"] for r in replicas.values())
    elastic = spec.get("elasticPolicy")
    roles = []
    for rtype, replica in replicas.items():
        pod = replica["template"]
        (container,) = pod["spec"]["containers"]
        env = _container_env(container)
        env["PYTHONUNBUFFERED"] = "0"
        env["PET_NPROC_PER_NODE"] = str(spec.get("nprocPerNode", "auto"))
        rank = 0 if rtype == "Master" else (1 if "Master" in replicas else 0)
        if "Master" in replicas:
            master = f"{name}-master-0"
            env.update(MASTER_ADDR=master, PET_MASTER_ADDR=master, MASTER_PORT=PYTORCHJOB_PORT,
                       PET_MASTER_PORT=PYTORCHJOB_PORT, WORLD_SIZE=str(total), RANK=str(rank),
                       PET_NODE_RANK=str(rank), PET_NNODES=str(total))
        if elastic:
            # the endpoint: rdzvHost:rdzvPort, each defaulting to the first worker and its port
            # (training-operator pkg/controller.v1/pytorch/elastic.go:151
            # generateEnvRDZVEndpoint, commit 1417bbc35b6e7840b3ecab1cec17dbf553ad9e85)
            host = elastic.get("rdzvHost", f"{name}-worker-0")
            port = elastic.get("rdzvPort", PYTORCHJOB_PORT)
            env.update(PET_RDZV_BACKEND=elastic["rdzvBackend"],
                       PET_RDZV_ENDPOINT=f"{host}:{port}",
                       PET_NNODES=f"{elastic['minReplicas']}:{elastic['maxReplicas']}")
            if "rdzvId" in elastic:
                env["PET_RDZV_ID"] = elastic["rdzvId"]
            if "maxRestarts" in elastic:
                env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
        limits = container.get("resources", {}).get("limits", {})
        roles.append(Role(f"{rtype.lower()}-{rank if rtype == 'Master' else 0}", env,
                          _args(container), _devices(limits), _pod_instance(pod, manifest)))
    return roles


def _trainjob_roles(manifest: Mapping[str, Any]) -> list[Role]:
    name = manifest["metadata"]["name"]
    trainer = manifest["spec"]["trainer"]
    nodes = trainer["numNodes"]
    pod = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"][0]["template"]["spec"]["template"]
    roles = []
    for rank in sorted({0, nodes - 1}):
        env = _container_env(trainer)
        env.update(PET_NNODES=str(nodes), PET_NPROC_PER_NODE=str(trainer["numProcPerNode"]),
                   PET_NODE_RANK=str(rank), JOB_COMPLETION_INDEX=str(rank),
                   PET_MASTER_ADDR=f"{name}-node-0-0.{name}", PET_MASTER_PORT=TRAINJOB_PORT)
        limits = trainer.get("resourcesPerNode", {}).get("limits", {})
        # the trainer's command is the image's ENTRYPOINT path: the entrypoint gets the args
        roles.append(Role(f"node-{rank}", env, _args(trainer), _devices(limits),
                          _pod_instance(pod, manifest)))
    return roles


def _mpijob_roles(manifest: Mapping[str, Any], namespace: str) -> list[Role]:
    name = manifest["metadata"]["name"]
    spec = manifest["spec"]
    specs = spec["mpiReplicaSpecs"]
    slots = spec.get("slotsPerWorker", 1)
    workers = specs["Worker"]["replicas"]
    (launcher,) = specs["Launcher"]["template"]["spec"]["containers"]
    env = _container_env(launcher)
    env.update(K_MPI_JOB_ROLE="launcher", OMPI_MCA_orte_default_hostfile=MPI_HOSTFILE,
               OMPI_MCA_orte_keep_fqdn_hostnames="true",
               OMPI_MCA_plm_rsh_args="-o ConnectionAttempts=10",
               OMPI_MCA_orte_set_default_slots=str(slots))
    if not spec.get("runLauncherAsWorker"):
        env.update(NVIDIA_VISIBLE_DEVICES="", NVIDIA_DRIVER_CAPABILITIES="")
    hostfile = "".join(f"{name}-worker-{i}.{name}.{namespace}.svc slots={slots}\n"
                       for i in range(workers))
    limits = launcher.get("resources", {}).get("limits", {})
    roles = [Role("launcher", env, _args(launcher), _devices(limits),
                  manifest["metadata"]["labels"]["mnp-stacks/instance-type"],
                  {MPI_HOSTFILE: hostfile})]
    worker_pod = specs["Worker"]["template"]
    (worker,) = worker_pod["spec"]["containers"]
    wenv = dict(_container_env(worker), K_MPI_JOB_ROLE="worker")
    roles.append(Role("worker-0", wenv, _args(worker),
                      _devices(worker.get("resources", {}).get("limits", {})),
                      _pod_instance(worker_pod, manifest)))
    return roles
