"""Kubeflow manifests for a stack: PyTorchJob (static or elastic), TrainJob and MPIJob.

:class:`KubeflowWriter` (``WRITER``) renders a job spec into one manifest, checked against its
vendored CRD (``crds.py``) before it is returned. Every kind follows the same rules:

- the image by digest, and the training command as ``args:``, never ``command:``: in Kubernetes
  ``command:`` replaces the image's ENTRYPOINT, so ``mnp-entrypoint`` would never run (a TrainJob
  names the entrypoint as its ``command``, because its runtime sets a command of its own);
- per pod (one pod per node) the instance's ``nvidia.com/gpu`` (or ``habana.ai/gaudi``) and, on
  the efa fabric, its ``vpc.amazonaws.com/efa`` interfaces, with ``hugepages-2Mi`` as the EFA
  device plugin's examples ask (libfabric's EFA provider uses huge pages for its buffers);
- ``/dev/shm`` as a memory-backed ``emptyDir`` of the instance table's size (a container's default
  is 64 MB, too small for NCCL and DataLoader workers);
- the job's ``--mount`` folders as ``hostPath`` volumes and ``--pvc`` claims (e.g. an FSx for
  Lustre ``fsx-pvc``) as ``persistentVolumeClaim`` volumes;
- the ``MNP_*`` settings the entrypoint reads; the operators' own variables (``PET_*``,
  ``MASTER_ADDR``, ``K_MPI_JOB_ROLE`` ...) are left to the operators;
- every ``$`` of the command and of env values written as ``$$`` (:func:`k8s_literal`): the
  kubelet expands ``$(NAME)`` and turns ``$$`` into ``$`` in both before the container starts,
  so the container gets the command word for word as typed.

MPIJob workers: the MPI operator starts a worker with ``/usr/sbin/sshd -De`` only when its
template gives neither ``command`` nor ``args`` (mpi-operator ``mpi_job_controller.go``,
``newWorker``). Our images hold no SSH host keys (each job makes its own), so that sshd would exit
at once. The generated workers therefore get the job's command as ``args`` like every other pod:
the ENTRYPOINT runs, sees ``K_MPI_JOB_ROLE=worker`` and serves SSH with a fresh host key and the
operator's ``authorized_keys``, never running the command itself (as a Batch child node does). It
listens on port 22, where the operator's launcher reaches workers with plain ``ssh``; a readiness
probe on that port lets ``launcherCreationPolicy: WaitForWorkersReady`` start the launcher only
once every worker accepts connections.

:class:`KubeflowWriter` (``WRITER``, see ``matrix/jobs/writer.py``) renders a job spec so for
``invoke k8s`` and ``invoke explain``, and :func:`k8s_roles` reads each role back from the
manifest as its operator starts it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from entrypoint import launchers
from entrypoint.schedulers import pytorchjob as pytorchjob_adapter
from matrix.errors import UsageError
from matrix.jobs import crds
from matrix.jobs.mounts import Claim, Mount, k8s_volumes
from matrix.jobs.roles import Devices, Role
from matrix.jobs.runopts import Option, RunOpts
from matrix.jobs.spec import (
    DEFAULT_ATTEMPTS,
    MAX_ATTEMPTS,
    NOTICE_ANNOTATION,
    JobSpec,
    annotation,
    check_elastic,
    check_launcher_command,
    comment_lines,
)
from matrix.jobs.writer import Prepared, Variant, Writer
from matrix.model.instances import InstanceType

KINDS = {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob", "mpijob": "MPIJob"}
# The launcher unit the entrypoint runs under each kind (MNP_LAUNCHER).
LAUNCHER = {"pytorchjob": "torchrun", "trainjob": "torchrun", "mpijob": "mpirun"}
# The EKS user guide's EFA example (an MPIJob running nccl-tests) gives each worker
# hugepages-2Mi: 5120Mi (https://docs.aws.amazon.com/eks/latest/userguide/node-efa.html, the
# example test's manifest); Kubernetes accepts huge pages only with a cpu or memory request
# (https://kubernetes.io/docs/tasks/manage-hugepages/scheduling-hugepages/), which every node pod
# has (NODE_SHARE below).
HUGEPAGES = "5120Mi"
# Every node pod requests this share of the instance's vCPUs and memory (the instance table's
# `vcpus` and `memory_gib`), as requests only: the job owns the node and may use all of it.
# - More than half, so the scheduler never puts two of the job's pods on one node: without
#   requests, a CPU stack's pods ask for nothing and two 36-slot workers can share one
#   c5n.18xlarge (issue 25).
# - Under what the kubelet leaves to pods, Allocatable = Capacity - kube-reserved -
#   system-reserved - eviction threshold (https://kubernetes.io/docs/tasks/administer-cluster/
#   reserve-compute-resources/, "Node Allocatable"), less the node's DaemonSets (CNI, kube-proxy,
#   device plugins). EKS's AMI reserves 11 MiB x maxPods + 255 MiB of memory and well under one
#   vCPU (awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go,
#   getMemoryMebibytesToReserve and getCPUMillicoresToReserve); the largest of those in the table
#   is c5n.18xlarge's, maxPods 737 (amazon-eks-ami files/eni-max-pods.txt): 8.2 GiB, 4 % of its
#   192 GiB. The 10 % left over also covers the kernel's memory (a node's capacity is what the
#   kernel reports, below the instance's nominal memory). Project choice; a cluster that
#   reserves more needs a smaller share.
NODE_SHARE_TENTHS = 9
# The well-known label the kubelet sets to the cloud provider's instance type
# (https://kubernetes.io/docs/reference/labels-annotations-taints/#nodekubernetesioinstance-type;
# https://kubernetes.io/docs/reference/node/node-labels/, "Preset labels"): each node pod is
# pinned to nodes of --instance-type, whose GPUs, EFA interfaces and slots the plan assumes.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# The kubelet sets it to Go's runtime.GOARCH ("handy if you are mixing arm and x86 nodes",
# https://kubernetes.io/docs/reference/labels-annotations-taints/#kubernetes-io-arch): every pod
# selects the architecture its image was built for (the stack's platform, which the rule class
# instance-platform holds equal to the instance table's `arch` of every node pod's type), so no
# pod lands on a node that cannot execute its image: not a node pod whatever the instance-type
# label says, and not an MPIJob launcher, which runs the same image on any node with room.
ARCH_LABEL = "kubernetes.io/arch"
# Habana's device plugin names Gaudi cards habana.ai/gaudi (https://docs.habana.ai/en/latest/
# Orchestration/Gaudi_Kubernetes/Device_Plugin_for_Kubernetes.html).
GAUDI = "habana.ai/gaudi"
# torchrun restarts the worker group this many times before the job fails (project choice: a
# node lost mid-run is replaced by the operator; the default of 0 would fail on the first loss).
ELASTIC_MAX_RESTARTS = 3
# The training-operator passes elasticPolicy.rdzvId to torchrun as PET_RDZV_ID only when the
# manifest sets it (kubeflow/training-operator pkg/controller.v1/pytorch/elastic.go,
# ElasticEnvVarGenerator.Generate, "if elasticPolicy.RDZVID != nil", at commit
# 1417bbc35b6e7840b3ecab1cec17dbf553ad9e85). Without it every job gets torchrun's --rdzv-id
# default, "none" (pytorch/pytorch torch/distributed/run.py, get_args_parser), and two jobs on one
# rendezvous store (a shared etcd) join one rendezvous. So each manifest gets an id of its own:
# the job name and random hex, new every time `invoke k8s` writes one.
RDZV_ID_HEX_BYTES = 4
# The ClusterTrainingRuntime Kubeflow Trainer installs for torchrun jobs
# (https://github.com/kubeflow/trainer/blob/master/manifests/base/runtimes/torch_distributed.yaml).
# Up to v2.0 its node container had a `command:` of its own (`/bin/bash -c` printing the PET_
# variables; commit 0c78efb0ccfce7b35fc2867b832f5cfed7750460), which would replace the image's
# ENTRYPOINT and take our args as its own; from v2.1.0 it has none. A TrainJob, and only a
# TrainJob, names the entrypoint as the trainer's command (the image's ENTRYPOINT path): right
# under both, and under a cluster whose runtime someone gave a command again.
TRAIN_RUNTIME = "torch-distributed"
# The volumes (/dev/shm, --mount, --pvc) reach a TrainJob's pods only through spec.runtimePatches,
# which Kubeflow Trainer has from v2.2.0 on: its changelog's "Breaking Changes" (kubeflow/trainer
# CHANGELOG/CHANGELOG-2.2.md, v2.2.0 of 2026-03-19: "Replace PodTemplateOverrides with
# RuntimePatches API", PR 3309; the field is TrainJobSpec.RuntimePatches in
# pkg/apis/trainer/v1alpha1/trainjob_types.go). An older Trainer's API server prunes the field,
# and the pods start with a 64 MB /dev/shm and none of the mounts, so the manifest says so in an
# annotation (kept by the API server) and a comment at the top of the YAML.
TRAINER_RELEASE = "v2.2.0"
REQUIRES = "mnp-stacks/requires"
TRAINER_REQUIREMENT = (f"Kubeflow Trainer {TRAINER_RELEASE} or later: older releases have no "
                       "spec.runtimePatches and drop it, with /dev/shm and the volumes")
ENTRYPOINT = "/usr/local/bin/mnp-entrypoint"
MPI_SSH_PORT = 22  # the entrypoint's MPIJob worker sshd: the port the operator's ssh uses
SSH_AUTH_MOUNT = "/root/.ssh"
_ELASTIC = re.compile(r"^(\d+):(\d+)$")
# The kubelet runs every container's command and args, and every env value, through Kubernetes'
# dependent-variable expansion before the container starts (kubernetes/kubernetes
# pkg/kubelet/container/helpers.go, ExpandContainerCommandAndArgs, and
# pkg/kubelet/kubelet_pods.go, makeEnvironmentVariables): third_party/forked/golang/expansion/
# expand.go (Expand and tryReadVariableName, at commit fde22c3f9aacfd260225a9741de123a41157b7c0)
# replaces `$(NAME)` by NAME's value when NAME is set and turns `$$` into `$`. A `$` written as
# `$$` comes out as one `$` and can never start a reference, so the container sees exactly what
# was typed (tests/publish/test_k8s_expansion.py runs a port of Expand over arbitrary commands).
_DOLLAR = "$"
# Retries (issues 24, 32): what bounds a PyTorchJob's runs is what the training-operator counts.
# - It recreates a pod of an `ExitCode` replica that ended 128-255 and never counts that against
#   runPolicy.backoffLimit: ReconcilePods deletes the failed pod (pkg/controller.v1/common/pod.go,
#   "Check if the pod is retryable", :349-366 at 5b2c6c8943fe6a1f8803f268f71ca714316fa6bc) and
#   PastBackoffLimit sums only the RestartCount of the containers of Running pods (pkg/core/
#   job.go; older commits' pkg/controller.v1/common/job.go pastBackoffLimit skips every replica
#   whose policy is not OnFailure or Always), and a recreated pod's containers start at 0
#   (kubeflow/trainer issue 2045). A trainer killed by the
#   OOM killer (137) would be recreated without end, so `ExitCode` is not used.
# - `Never` (--attempts 1): the operator sets the pod's restartPolicy from the replica's
#   (pkg/core/pod.go SetRestartPolicy: ExitCode becomes Never, the others are copied) and
#   neither recreates nor restarts a pod that failed under Never: the first failure fails the job.
# - `OnFailure` (--attempts N > 1): the kubelet restarts the failed container in place, each
#   restart adds 1 to its RestartCount, and the operator fails the job once the sum over the
#   job's running pods reaches backoffLimit ("result >= *runPolicy.BackoffLimit", pkg/core/job.go
#   PastBackoffLimit, :95 at kubeflow/training-operator commit
#   5b2c6c8943fe6a1f8803f268f71ca714316fa6bc, as kubeflow/trainer issue 2045 cites it, and at
#   7c7aa9911c73efdab8a33281c58af51c69861678; the same test in pkg/controller.v1/common/job.go
#   pastBackoffLimit of older commits). A failure that stops every pod restarts each of
#   them, so backoffLimit is (N - 1) x pods + 1: N - 1 whole restarts run, the N-th failure ends
#   the job. Limits, from the same source: OnFailure restarts every failure, a bug (1-127) and a
#   bad setting (2) included, up to the bound; it restarts on the same node (a broken node is not
#   replaced, so its health check fails again and uses the attempts up); and a pod the node lost
#   (evicted, phase Failed) is recreated and not counted. runPolicy.activeDeadlineSeconds
#   (pkg/core/job.go PastActiveDeadline) bounds the job's time on top, where a user wants one.
RESTART_NEVER = "Never"
RESTART_ON_FAILURE = "OnFailure"
# The MPI operator turns ExitCode into a pod restartPolicy Never and lets the launcher's batch Job
# retry every failure up to backoffLimit (kubeflow/mpi-operator pkg/controller/
# mpi_job_controller.go, setRestartPolicy and newLauncherJob): it cannot tell a lost node from a
# bug, so an MPIJob is never retried (backoffLimit 0) rather than rerun a bug.
MPIJOB_BACKOFF_LIMIT = 0


@dataclass(frozen=True)
class Job:
    """What every kind's manifest is made of, resolved once."""

    name: str
    stack: str
    nodes: int
    instance: InstanceType
    image: str
    command: list[str]
    env: list[dict[str, str]]
    fabric: str
    # The image's OCI platform (the stack's, linux/arm64): what every pod selects as its arch.
    platform: str
    mounts: tuple[Mount, ...] = ()
    claims: tuple[Claim, ...] = ()
    namespace: str | None = None

    @property
    def arch(self) -> str:
        """The image's architecture as Kubernetes' kubernetes.io/arch says it (GOARCH)."""
        return self.platform.split("/", 1)[1]


def job_name(stack: str) -> str:
    """``mnp-<stack>`` as a DNS label: pods are ``<name>-worker-<i>``, so kept to 40 characters."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", f"mnp-{stack}".lower()))[:40].strip("-")


def k8s_literal(text: str) -> str:
    """``text`` with every ``$`` doubled: what Kubernetes' expansion turns back into ``text``."""
    return text.replace(_DOLLAR, _DOLLAR * 2)


def rdzv_id(name: str) -> str:
    """An elastic job's rendezvous id: ``<job name>-<8 random hex digits>``."""
    return f"{name}-{secrets.token_hex(RDZV_ID_HEX_BYTES)}"


def parse_elastic(text: str | None, nodes: int) -> tuple[int, int] | None:
    """``--elastic MIN:MAX`` with ``MIN <= nodes <= MAX`` (the pods started at first)."""
    if text is None:
        return None
    match = _ELASTIC.match(str(text).strip())
    if not match:
        raise UsageError(f"--elastic {text!r}: expected MIN:MAX node counts, e.g. --elastic 2:4")
    low, high = int(match.group(1)), int(match.group(2))
    check_elastic(low, high, nodes, text)
    return low, high


def node_requests(instance: InstanceType) -> dict[str, str]:
    """A node pod's ``cpu`` and ``memory`` requests: NODE_SHARE_TENTHS of the instance."""
    cpus = instance.vcpus * NODE_SHARE_TENTHS // 10
    memory_gib = instance.memory_mib * NODE_SHARE_TENTHS // 10 // 1024
    return {"cpu": str(cpus), "memory": f"{memory_gib}Gi"}


def resources(instance: InstanceType, fabric: str) -> dict[str, dict[str, str]]:
    """A node pod's ``resources``: most of the instance's CPUs and memory (requests only), and
    its accelerators, EFA interfaces and huge pages (requests equal to limits, as Kubernetes
    requires for extended resources and huge pages)."""
    limits: dict[str, str] = {}
    if instance.gpus:
        limits["nvidia.com/gpu"] = str(instance.gpus)
    if instance.hpus:
        limits[GAUDI] = str(instance.hpus)
    if fabric == "efa" and instance.has_efa:
        limits["vpc.amazonaws.com/efa"] = str(instance.efa_interfaces)
        limits["hugepages-2Mi"] = HUGEPAGES
    shape: dict[str, dict[str, str]] = {"requests": {**node_requests(instance), **limits}}
    if limits:
        shape["limits"] = limits
    return shape


def _volumes(job: Job) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory",
                                        "sizeLimit": f"{job.instance.shm_mib}Mi"}}
    volumes, points = k8s_volumes(job.mounts, job.claims)
    return [shm, *volumes], [{"name": "dshm", "mountPath": "/dev/shm"}, *points]


def _args(job: Job) -> list[str]:
    return [k8s_literal(word) for word in job.command]


def _container(job: Job, name: str, node: bool = True) -> dict[str, Any]:
    """The job's container; a ``node`` container (one of the job's nodes) gets the instance's
    resources."""
    _, points = _volumes(job)
    container: dict[str, Any] = {"name": name, "image": job.image, "args": _args(job),
                                 "env": list(job.env), "volumeMounts": points}
    if node:
        container["resources"] = resources(job.instance, job.fabric)
    return container


def node_selector(job: Job, node: bool = True) -> dict[str, str]:
    """Nodes of its image's architecture for every pod, and of the job's instance type for a
    ``node`` pod (one of the job's nodes; see INSTANCE_TYPE_LABEL and ARCH_LABEL)."""
    return {INSTANCE_TYPE_LABEL: job.instance.name, ARCH_LABEL: job.arch} if node \
        else {ARCH_LABEL: job.arch}


def _pod(container: dict[str, Any], job: Job, node: bool = True) -> dict[str, Any]:
    """A pod template on nodes of its image's architecture; a ``node`` pod (one of the job's
    nodes) is pinned to the instance type too."""
    volumes, _ = _volumes(job)
    spec: dict[str, Any] = {"containers": [container], "volumes": volumes,
                            "nodeSelector": node_selector(job, node)}
    return {"spec": spec}


def _metadata(job: Job) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": job.name}
    if job.namespace:
        metadata["namespace"] = job.namespace
    metadata["labels"] = {"mnp-stacks/stack": job.stack,
                          "mnp-stacks/instance-type": job.instance.name}
    return metadata


def pytorchjob(job: Job, elastic: tuple[int, int] | None,
               attempts: int = DEFAULT_ATTEMPTS) -> dict[str, Any]:
    """Static: a Master and ``nodes - 1`` Workers. Elastic: ``nodes`` Workers and an
    ``elasticPolicy`` (c10d rendezvous, hosted by the operator's ``<job>-worker-0``, under an id
    of this manifest's own: :func:`rdzv_id`)."""
    # the training-operator finds the container by this name (pytorch_types.go)
    template = _pod(_container(job, "pytorch"), job)
    replicas: dict[str, Any] = {}
    spec: dict[str, Any] = {"nprocPerNode": str(job.instance.slots_per_node())}
    policy, backoff = pytorchjob_retries(attempts, job.nodes)
    if elastic is None:
        replicas["Master"] = {"replicas": 1, "restartPolicy": policy, "template": template}
        if job.nodes > 1:
            replicas["Worker"] = {"replicas": job.nodes - 1, "restartPolicy": policy,
                                  "template": template}
    else:
        replicas["Worker"] = {"replicas": job.nodes, "restartPolicy": policy,
                              "template": template}
        spec["elasticPolicy"] = {"minReplicas": elastic[0], "maxReplicas": elastic[1],
                                 "rdzvBackend": "c10d", "rdzvId": rdzv_id(job.name),
                                 "maxRestarts": ELASTIC_MAX_RESTARTS}
    spec["pytorchReplicaSpecs"] = replicas
    spec["runPolicy"] = {"cleanPodPolicy": "None", "backoffLimit": backoff}
    return {"apiVersion": crds.CRDS["PyTorchJob"].api_version, "kind": "PyTorchJob",
            "metadata": _metadata(job), "spec": spec}


def pytorchjob_retries(attempts: int, pods: int) -> tuple[str, int]:
    """``(restartPolicy, runPolicy.backoffLimit)`` for ``attempts`` runs of a job of ``pods``
    pods: ``Never`` and 0 for one run, else ``OnFailure`` and ``(attempts - 1) x pods + 1``
    container restarts in all (see RESTART_NEVER above)."""
    if attempts == 1:
        return RESTART_NEVER, 0
    return RESTART_ON_FAILURE, (attempts - 1) * pods + 1


def trainjob(job: Job) -> dict[str, Any]:
    """A TrainJob on the ``torch-distributed`` runtime; the volumes go in through a runtime
    patch of its ``node`` replicated job (the only place this API takes pod volumes)."""
    volumes, points = _volumes(job)
    trainer: dict[str, Any] = {"image": job.image, "command": [ENTRYPOINT],
                               "args": _args(job),
                               "numNodes": job.nodes,
                               "numProcPerNode": job.instance.slots_per_node(),
                               "env": list(job.env)}
    trainer["resourcesPerNode"] = resources(job.instance, job.fabric)
    pod = {"spec": {"nodeSelector": node_selector(job), "volumes": volumes,
                    "containers": [{"name": "node", "volumeMounts": points}]}}
    patch = {"manager": "mnp-stacks", "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod}}}]}}}}
    metadata = _metadata(job)
    metadata["annotations"] = {REQUIRES: TRAINER_REQUIREMENT}
    return {"apiVersion": crds.CRDS["TrainJob"].api_version, "kind": "TrainJob",
            "metadata": metadata,
            "spec": {"runtimeRef": {"name": TRAIN_RUNTIME}, "trainer": trainer,
                     "runtimePatches": [patch]}}


def mpijob(job: Job) -> dict[str, Any]:
    """A launcher (runs mpirun through the entrypoint) and ``nodes`` workers (serve SSH through
    the entrypoint, see the module docstring). The launcher runs no ranks
    (``runLauncherAsWorker`` is not set: false by default, schemas/kubeflow/
    kubeflow.org_mpijobs.yaml), so it asks for no share of a node and no node of the instance
    type: it runs wherever the cluster has room on a node of its image's architecture."""
    launcher = _container(job, "launcher", node=False)
    worker = _container(job, "worker")
    worker["ports"] = [{"name": "ssh", "containerPort": MPI_SSH_PORT}]
    worker["readinessProbe"] = {"tcpSocket": {"port": MPI_SSH_PORT}, "periodSeconds": 2}
    spec = {
        "slotsPerWorker": job.instance.slots_per_node(),
        "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": SSH_AUTH_MOUNT,
        "launcherCreationPolicy": "WaitForWorkersReady",
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": MPIJOB_BACKOFF_LIMIT},
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "restartPolicy": "Never",
                         "template": _pod(launcher, job, node=False)},
            "Worker": {"replicas": job.nodes, "template": _pod(worker, job)},
        },
    }
    return {"apiVersion": crds.CRDS["MPIJob"].api_version, "kind": "MPIJob",
            "metadata": _metadata(job), "spec": spec}


def check_kind(kind: str, elastic: tuple[int, int] | None) -> None:
    """One of :data:`KINDS`; an elastic range only for a PyTorchJob (the others have none)."""
    if kind not in KINDS:
        raise UsageError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")
    if elastic is not None and kind != "pytorchjob":
        raise UsageError(f"--elastic: only a pytorchjob has elastic bounds, not a {kind}")


def _manifest(kind: str, stack: str, platform: str, nodes: int, instance: InstanceType,
              image_uri: str, command: Sequence[str], variables: Mapping[str, str], fabric: str,
              mounts: Sequence[Mount], claims: Sequence[Claim],
              elastic: tuple[int, int] | None, attempts: int,
              notices: Sequence[str], name: str | None = None,
              namespace: str | None = None) -> dict[str, Any]:
    """The manifest from checked parts (a :class:`JobSpec`'s), validated against its CRD."""
    job = Job(name or job_name(stack), stack, nodes, instance, image_uri, list(command),
              [{"name": k, "value": k8s_literal(v)} for k, v in sorted(variables.items())],
              fabric, platform, tuple(mounts), tuple(claims), namespace)
    if kind == "pytorchjob":
        manifest = pytorchjob(job, elastic, attempts)
    elif kind == "trainjob":
        manifest = trainjob(job)
    else:
        manifest = mpijob(job)
    if notices:  # what the submitter must know (spec.py), kept by the API server
        manifest["metadata"].setdefault("annotations", {}).update(annotation(notices))
    crds.validate(manifest)
    return manifest


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors: every pod's env is written out, as kubectl users read it."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """``manifest`` as the YAML document ``kubectl apply -f`` takes, keys in the order built;
    what it needs of the cluster (its ``mnp-stacks/requires`` annotation) as a first comment."""
    annotations = manifest.get("metadata", {}).get("annotations", {})
    needs = annotations.get(REQUIRES)
    head = f"# Requires {needs}\n" if needs else ""
    notices = annotations.get(NOTICE_ANNOTATION, "")
    head += "".join(line + "\n" for line in comment_lines(notices.splitlines()))
    return head + yaml.dump(dict(manifest), Dumper=_PlainDumper, sort_keys=False, width=100)


# -- the roles of a manifest ------------------------------------------------------------------------
# Each pod template's container (``env``, ``args``, resource limits) plus what the operator
# injects per role: the training-operator's ``PET_*``, ``MASTER_*``, ``WORLD_SIZE``/``RANK`` for a
# PyTorchJob (PYTORCHJOB_SOURCE), Kubeflow Trainer's torch plugin ``PET_*`` for a TrainJob
# (TRAINJOB_SOURCE), and for an MPIJob ``K_MPI_JOB_ROLE``, the launcher's ``OMPI_MCA_*`` and
# mounted hostfile, and on the launcher (``runLauncherAsWorker`` unset) ``NVIDIA_VISIBLE_DEVICES``
# and ``NVIDIA_DRIVER_CAPABILITIES`` blanked, with no device at all (MPIJOB_SOURCE).
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


def k8s_roles(manifest: Mapping[str, Any], namespace: str | None = None) -> list[Role]:
    """Each replica type's first pod (and an MPIJob's launcher), in the manifest's namespace
    (kubectl's default namespace, ``default``, when it names none)."""
    namespace = namespace or manifest["metadata"].get("namespace") or "default"
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


def _role_args(container: Mapping[str, Any]) -> list[str]:
    return [word.replace("$$", "$") for word in container.get("args", [])]


def _role_devices(limits: Mapping[str, str]) -> Devices:
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
        env["PYTHONUNBUFFERED"] = "1"  # envvar.go setPodEnv sets "1"
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
                          _role_args(container), _role_devices(limits), _pod_instance(pod, manifest)))
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
        roles.append(Role(f"node-{rank}", env, _role_args(trainer), _role_devices(limits),
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
    roles = [Role("launcher", env, _role_args(launcher), _role_devices(limits),
                  manifest["metadata"]["labels"]["mnp-stacks/instance-type"],
                  {MPI_HOSTFILE: hostfile})]
    worker_pod = specs["Worker"]["template"]
    (worker,) = worker_pod["spec"]["containers"]
    wenv = dict(_container_env(worker), K_MPI_JOB_ROLE="worker")
    roles.append(Role("worker-0", wenv, _role_args(worker),
                      _role_devices(worker.get("resources", {}).get("limits", {})),
                      _pod_instance(worker_pod, manifest)))
    return roles


# -- the writer -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KubeflowOptions:
    """What a Kubeflow manifest takes besides the :class:`JobSpec`: its ``kind`` (:data:`KINDS`),
    an elastic PyTorchJob's rendezvous backend other than c10d (``--rdzv``), and the job's name
    and namespace (default :func:`job_name`, and none: kubectl's current namespace)."""

    kind: str = "pytorchjob"
    rdzv: str | None = None
    name: str | None = None
    namespace: str | None = None


RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")  # an elastic PyTorchJob's rdzvBackend
# Object names: the job's pods are <name>-worker-<i> (a DNS label, at most 63 characters, RFC 1123
# label names: https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
# #dns-label-names), so a job name is kept to 40; a namespace is a DNS label too.
NAME_MAX = 40
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ATTEMPTS_HELP = ("runs of a pytorchjob: 1 gives restartPolicy Never, N > 1 OnFailure with "
                 "backoffLimit (N-1) x pods + 1, every failure alike (docs/entrypoint.md "
                 "Retries); a trainjob or mpijob takes only 1 (its operator cannot tell a lost "
                 "node from a bug)")

KUBEFLOW_OPTIONS = RunOpts((
    Option("kind", "the Kubeflow job: pytorchjob, trainjob or mpijob", required=True,
           choices=tuple(KINDS), example="pytorchjob", what="kind"),
    Option("launcher", "the launcher every pod is told (MNP_LAUNCHER); none runs the command as "
           "is with the operator's variables", choices=tuple(launchers.NAMES),
           default_text="the kind's: torchrun for pytorchjob and trainjob, mpirun for mpijob",
           example="torchrun", what="launcher",
           variable="MNP_LAUNCHER"),
    Option("attempts", ATTEMPTS_HELP, kind=int, minimum=1, maximum=MAX_ATTEMPTS,
           default_text=f"{DEFAULT_ATTEMPTS} for a pytorchjob, else 1", example="2"),
    Option("pvc", "CLAIM:PATH[:ro], a persistent volume claim at PATH in every pod; repeat",
           repeatable=True, example="fsx-pvc:/fsx"),
    Option("elastic", "MIN:MAX nodes of an elastic pytorchjob (--nodes pods start)",
           default_text="a static job of --nodes", example="2:4"),
    Option("rdzv", "an elastic pytorchjob's rendezvous backend: c10d, or etcd/etcd-v2 at the "
           "server you run (makes the job elastic, --elastic default NODES:NODES)",
           choices=RDZV_BACKENDS, default_text="c10d with --elastic", example="c10d",
           what="rendezvous backend"),
    Option("name", f"the job's name, a DNS label of at most {NAME_MAX} characters",
           default_text="mnp-<stack>", example="mnp-train"),
    Option("namespace", "the job's namespace", default_text="kubectl's current one",
           example="training"),
))


def _label(value: str | None, option: str, limit: int) -> str | None:
    """``value`` when it is a DNS label within ``limit`` characters, else one line."""
    if value is not None and (len(value) > limit or not _LABEL.match(value)):
        raise UsageError(f"{option} {value!r}: expected a DNS label (lower-case letters, digits "
                         f"and '-', starting and ending with a letter or digit) of at most "
                         f"{limit} characters")
    return value


def with_rdzv_backend(manifest: dict[str, Any], backend: str, nodes: int) -> dict[str, Any]:
    """An elastic PyTorchJob with ``backend`` (c10d, etcd, etcd-v2) instead of c10d: for etcd the
    server the user runs, at the endpoint the entrypoint's PyTorchJob adapter's example names.
    ``invoke explain --rdzv`` plans this edit of what ``invoke k8s --elastic`` writes."""
    policy = manifest["spec"]["elasticPolicy"]
    policy["rdzvBackend"] = backend
    if backend.startswith("etcd"):
        endpoint = pytorchjob_adapter.elastic_example(nodes, backend)["PET_RDZV_ENDPOINT"]
        host, _, port = endpoint.rpartition(":")
        policy.update(rdzvHost=host, rdzvPort=int(port))
    return manifest


class KubeflowWriter(Writer):
    """Kubeflow PyTorchJob (static or elastic), TrainJob and MPIJob manifests: ``invoke k8s``."""

    task = "k8s"
    summary = "Kubeflow PyTorchJob, TrainJob or MPIJob manifest, checked against the CRDs"
    file_name = "job.yaml"
    scheduler_name = "Kubernetes"
    schedulers = tuple(KINDS)
    what = "every pod's args"

    def run_options(self) -> RunOpts:
        return KUBEFLOW_OPTIONS

    def implied(self, scheduler: str) -> dict[str, Any]:
        return {"kind": scheduler}

    def prepare(self, values: dict[str, Any]) -> Prepared:
        kind, nodes, attempts = values["kind"], values["nodes"], values["attempts"]
        if kind != "pytorchjob" and attempts is not None and attempts > 1:
            raise UsageError(f"--attempts {attempts}: a {kind} cannot retry by exit code (its "
                             "operator retries every failure alike; docs/entrypoint.md "
                             "Retries): give 1 or leave it out")
        for option in ("elastic", "rdzv"):
            if values[option] is not None and kind != "pytorchjob":
                raise UsageError(f"--{option} {values[option]}: only --kind pytorchjob has "
                                 "elastic bounds")
        bounds = parse_elastic(values["elastic"], nodes)
        if bounds is None and values["rdzv"] is not None:
            bounds = (nodes, nodes)
        rdzv = values["rdzv"] if values["rdzv"] != "c10d" else None
        options = KubeflowOptions(kind, rdzv, _label(values["name"], "--name", NAME_MAX),
                                  _label(values["namespace"], "--namespace", 63))
        runs = (attempts or DEFAULT_ATTEMPTS) if kind == "pytorchjob" else 1
        return Prepared(values["launcher"] or LAUNCHER[kind], options, runs, bounds)

    def variants(self) -> tuple[Variant, ...]:
        """Every kind with its own launcher unit, and the elastic PyTorchJob."""
        found = [Variant(kind, LAUNCHER[kind], KubeflowOptions(kind), kind) for kind in KINDS]
        found.insert(1, Variant("pytorchjob-elastic", LAUNCHER["pytorchjob"],
                                KubeflowOptions("pytorchjob"), "pytorchjob", elastic=True))
        return tuple(found)

    def check(self, launcher: str, nodes: int, command: Sequence[str], options: Any) -> None:
        """A command that is itself a launcher under another: each pod's entrypoint would nest
        them; ``--launcher none`` runs it as is with the operator's variables (torchrun reads
        the PET_* ones, an MPIJob launcher's mpirun the operator's hostfile)."""
        kind = (options or KubeflowOptions()).kind
        check_kind(kind, None)
        unit = launchers.command_unit(list(command))
        article = "an" if kind == "mpijob" else "a"
        check_launcher_command(
            launcher, command, f"under {article} {KINDS[kind]} with --launcher {launcher}, "
            f"{'the launcher pod' if kind == 'mpijob' else 'every pod'}'s entrypoint would start "
            f"{launcher} around it", f"give the program alone (e.g. -- python3 train.py) with "
            f"--launcher {unit or launcher}, or --launcher none to run the command as is with the "
            "operator's variables")

    def render(self, spec: JobSpec, options: Any = None) -> dict[str, Any]:
        options = options or KubeflowOptions()
        check_kind(options.kind, spec.elastic)
        manifest = _manifest(options.kind, spec.stack.name, spec.stack.platform, spec.nodes,
                             spec.instance, spec.image_uri, spec.command, spec.environment(),
                             spec.effective_fabric, spec.mounts, spec.claims, spec.elastic,
                             spec.attempts, spec.notices, options.name, options.namespace)
        if options.rdzv:
            with_rdzv_backend(manifest, options.rdzv, spec.nodes)
        return manifest

    def text(self, artefact: dict[str, Any]) -> str:
        return to_yaml(artefact)

    def roles(self, artefact: dict[str, Any]) -> list[Role]:
        return k8s_roles(artefact)


WRITER = KubeflowWriter()
