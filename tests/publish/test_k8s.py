"""Kubeflow manifests (`invoke k8s`), validated against the real CRD schemas vendored in the repo.

No Kubernetes control plane can run here; the CRDs' own ``openAPIV3Schema`` (PyTorchJob v1,
MPIJob v2beta1, TrainJob v1alpha1) is what the API server would check first, so every manifest
the generator writes for every declared (stack, instance) pair is checked against it, strictly (a
field the schema does not define is an error: tests/publish/test_crds_strict.py). What this
cannot prove: CEL rules, the operators' webhooks and what their controllers then do.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrix.errors import UsageError, UserError
from matrix.jobs import crds
from matrix.jobs.k8s import ENTRYPOINT, KINDS, parse_elastic, resources, to_yaml
from matrix.model.instances import INSTANCE_TYPES, get_instance_type
from tests.helpers import one_line, project_matrix, written, written_for_pair

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cuda@sha256:" + "b" * 64
MATRIX = project_matrix()
PAIRS = [(name, instance) for name, stack in MATRIX.stacks.items() for instance in stack.instances]
COMMAND = ["python3", "/fsx/train.py", "--data", "/data; echo 'not a shell'"]
MOUNTS = ("--mount", "/fsx:/fsx", "--mount", "/scratch/data:/data:ro", "--pvc", "fsx-pvc:/shared")


def k8s(kind: str, stack: str, nodes: int, instance_type: str, *options: str,
        command: list[str] = COMMAND) -> dict:
    """What ``invoke k8s --kind KIND --stack STACK --nodes N --instance-type T --image-uri IMAGE
    OPTIONS -- COMMAND`` writes (tests.helpers.written: the task's own steps, in this process)."""
    return written("k8s", "--kind", kind, "--stack", stack, "--nodes", str(nodes),
                   "--instance-type", instance_type, "--image-uri", IMAGE, *options,
                   command=command)


def pods(manifest: dict) -> list[dict]:
    """Every pod template's spec (PyTorchJob/MPIJob replicas; TrainJob has none of its own)."""
    specs = manifest["spec"].get("pytorchReplicaSpecs") or manifest["spec"].get(
        "mpiReplicaSpecs") or {}
    return [replica["template"]["spec"] for replica in specs.values()]


def test_the_vendored_crds_are_the_files_sources_names():
    folder = ROOT / "matrix" / "jobs" / "schemas" / "kubeflow"
    sources = (folder / "SOURCES.md").read_text(encoding="utf-8")
    for crd in crds.CRDS.values():
        digest = hashlib.sha256((folder / crd.file).read_bytes()).hexdigest()
        row = next(line for line in sources.splitlines() if line.startswith(f"| {crd.file} "))
        assert digest in row and re.search(r"\b[0-9a-f]{40}\b", row), row
    assert "Apache License" in (folder / "LICENSE").read_text(encoding="utf-8")
    assert "Version 2.0" in (folder / "LICENSE").read_text(encoding="utf-8")
    # the repository never points outside itself for them
    assert "../shared" not in sources and "/work/" not in sources


@pytest.mark.parametrize(("stack", "instance_type"), PAIRS, ids=[f"{s}@{i}" for s, i in PAIRS])
def test_every_declared_pair_makes_valid_manifests_of_every_kind(stack, instance_type):
    s = MATRIX.stack(stack)
    row = get_instance_type(instance_type)
    variants = [(kind, ()) for kind in KINDS] + [("pytorchjob", ("--elastic", "1:3"))]
    for kind, elastic in variants:
        try:
            manifest = written_for_pair("k8s", "--kind", kind, "--stack", stack, "--nodes", "2",
                                        "--instance-type", instance_type, "--image-uri", IMAGE,
                                        *MOUNTS, *elastic, command=COMMAND)
        except UserError as refusal:
            # a stack without PyTorch: only torchrun joins an elastic job's rendezvous
            assert elastic and "only --launcher torchrun joins it" in str(refusal), refusal
            continue
        assert crds.errors(manifest) == [], (kind, elastic)
        # what kubectl would read back from the YAML the task prints is the same document
        assert yaml.safe_load(to_yaml(manifest)) == manifest
        expected = resources(row, s.fabric)
        efa = expected.get("limits", {}).get("vpc.amazonaws.com/efa")
        assert efa == (str(row.efa_interfaces) if s.fabric == "efa" else None)
        if kind == "trainjob":
            trainer = manifest["spec"]["trainer"]
            assert trainer["args"] == COMMAND and trainer["command"] == [ENTRYPOINT]
            assert trainer["numNodes"] == 2
            assert trainer.get("resourcesPerNode", {}) == expected
            patched = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]
            pod = patched["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
            assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": instance_type,
                                           "kubernetes.io/arch": s.arch}
            continue
        for pod in pods(manifest):
            (container,) = pod["containers"]
            assert "command" not in container  # the image's ENTRYPOINT runs
            assert container["args"] == COMMAND and container["image"] == IMAGE
            assert {"name": "dshm", "emptyDir": {"medium": "Memory",
                                                 "sizeLimit": f"{row.shm_mib}Mi"}} in pod["volumes"]
            assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
            claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                      if "persistentVolumeClaim" in v]
            assert claims == ["fsx-pvc"]
            if container["name"] != "launcher":
                assert container.get("resources", {}) == expected
                assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": instance_type,
                                           "kubernetes.io/arch": s.arch}
            else:  # any node with room, of the image's architecture
                assert pod["nodeSelector"] == {"kubernetes.io/arch": s.arch}


def test_resources_follow_the_instance_table():
    p4d = resources(get_instance_type("p4d.24xlarge"), "efa")
    assert p4d["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "4",
                             "hugepages-2Mi": "5120Mi"}
    assert p4d["requests"]["hugepages-2Mi"] == p4d["limits"]["hugepages-2Mi"]
    assert "memory" not in p4d["limits"]  # a request only: the job owns the node
    # tcp on an EFA type: no EFA interfaces, no huge pages
    assert resources(get_instance_type("p4d.24xlarge"), "tcp")["limits"] == {"nvidia.com/gpu": "8"}
    # a CPU type: no accelerators, but 9/10 of its 72 vCPUs and 192 GiB (issue 25)
    assert resources(get_instance_type("c5n.18xlarge"), "tcp") == {
        "requests": {"cpu": "64", "memory": "172Gi"}}
    assert resources(get_instance_type("dl1.24xlarge"), "efa")["limits"]["habana.ai/gaudi"] == "8"


def test_static_and_elastic_pytorchjob():
    static = k8s("pytorchjob", "cuda11.7-efa", 3, "p4d.24xlarge")
    replicas = static["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    assert replicas["Master"]["template"]["spec"]["containers"][0]["name"] == "pytorch"
    assert "elasticPolicy" not in static["spec"]
    elastic = k8s("pytorchjob", "cuda11.7-efa", 3, "p4d.24xlarge", "--elastic", "2:4")
    assert list(elastic["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert elastic["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    policy = elastic["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"], policy["rdzvBackend"]) == (2, 4, "c10d")
    single = k8s("pytorchjob", "cpu-tcp", 1, "c5n.18xlarge")
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_mpijob_workers_start_through_the_entrypoint():
    manifest = k8s("mpijob", "cuda11.7-efa", 2, "p4d.24xlarge", *MOUNTS[:4])
    spec = manifest["spec"]
    assert spec["slotsPerWorker"] == 8 and spec["mpiImplementation"] == "OpenMPI"
    assert spec["sshAuthMountPath"] == "/root/.ssh"
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    # args given, so the operator does not put `/usr/sbin/sshd -De` in its place
    for container in (launcher, worker):
        assert "command" not in container and container["args"] == COMMAND
        env = {item["name"]: item["value"] for item in container["env"]}
        assert env["MNP_LAUNCHER"] == "mpirun"
        assert not {"K_MPI_JOB_ROLE", "OMPI_MCA_orte_default_hostfile"} & set(env)
    assert "resources" not in launcher  # the launcher holds no GPU and no share of a node
    # no node of the instance type, but one that can execute the image
    assert spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/arch": "amd64"}
    assert worker["readinessProbe"] == {"tcpSocket": {"port": 22}, "periodSeconds": 2}
    assert {"name": "mount-1", "mountPath": "/data", "readOnly": True} in worker["volumeMounts"]


def test_the_schema_check_rejects_what_the_api_server_would():
    manifest = k8s("mpijob", "cpu-tcp", 2, "c5n.18xlarge")
    manifest["spec"]["mpiImplementation"] = "MVAPICH"
    del manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"]
    found = crds.errors(manifest)
    assert any("mpiImplementation: 'MVAPICH' is not one of" in e for e in found), found
    assert any("containers/0: 'name' is a required property" in e for e in found), found
    with pytest.raises(UserError, match="MPIJob fails its CRD schema"):
        crds.validate(manifest)
    trainjob = k8s("trainjob", "cpu-tcp", 2, "c5n.18xlarge")
    trainjob["spec"]["trainer"]["numNodes"] = "two"
    assert crds.errors(trainjob) == ["spec/trainer/numNodes: 'two' is not of type 'integer'"]


@pytest.mark.parametrize(("text", "nodes", "words"), [
    ("4", 2, "expected MIN:MAX"), ("3:1", 2, "need 1 <= MIN <= MAX"), ("0:2", 1, "need 1 <="),
    ("2:4", 5, "--nodes 5 (the pods started first) must be between 2 and 4")])
def test_bad_elastic_bounds(text, nodes, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        parse_elastic(text, nodes)


def test_digest_and_kind_are_required():
    unpinned = ["--stack", "cpu-tcp", "--nodes", "2", "--instance-type", "c5n.18xlarge",
                "--image-uri", "repo/x:latest"]
    assert "--image-uri 'repo/x:latest' has no digest" in one_line(
        k8s_cli("--kind", "mpijob", *unpinned, command=COMMAND), 2)
    assert "--elastic 1:2: only --kind pytorchjob has elastic bounds" in one_line(
        k8s_cli("--kind", "trainjob", *PAIR, "--elastic", "1:2", command=COMMAND), 2)


# --- invoke k8s as users call it -----------------------------------------------------------------

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
PAIR = ["--stack", "cuda11.7-efa", "--nodes", "2", "--instance-type", "p4d.24xlarge",
        "--image-uri", IMAGE]


def k8s_cli(*args: str, command: list[str] | None = None) -> subprocess.CompletedProcess:
    tail = ["--", *command] if command else []
    return subprocess.run([sys.executable, "-m", "invoke", "k8s", *args, *tail], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **NO_ENGINE})


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_k8s_writes_a_valid_manifest_with_the_command_word_for_word(tmp_path, kind):
    target = tmp_path / "job.yaml"
    proc = k8s_cli("--kind", kind, *PAIR, "--mount", "/fsx:/fsx", "--pvc", "fsx-pvc:/data:ro",
                   "--output", str(target), command=COMMAND)
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(target.read_text())
    assert crds.errors(manifest) == []
    args = (manifest["spec"]["trainer"]["args"] if kind == "trainjob"
            else pods(manifest)[0]["containers"][0]["args"])
    assert args == COMMAND
    assert [p.name for p in tmp_path.iterdir()] == ["job.yaml"]  # no temporary file left


@pytest.mark.parametrize(("args", "words"), [
    (["--kind", "tfjob"], "--kind 'tfjob': no kind of that name; did you mean"),
    (["--kind", "mpijob", "--elastic", "1:2"], "only --kind pytorchjob has elastic bounds"),
    (["--kind", "pytorchjob", "--elastic", "two"], "--elastic 'two': expected MIN:MAX"),
    (["--kind", "pytorchjob", "--elastic", "3:4"], "--nodes 2 (the pods started first) must be"),
    # issue 32: every pod would exit 2 (the entrypoint caps PET_NNODES at 10000)
    (["--kind", "pytorchjob", "--elastic", "1:20000"],
     "--elastic 1:20000: need 1 <= MIN <= MAX <= 10000 (the entrypoint's node limit)"),
    (["--kind", "pytorchjob", "--pvc", "FSx_PVC:/fsx"], "is not a Kubernetes claim name"),
    (["--kind", "pytorchjob", "--pvc", "fsx-pvc"], "--pvc 'fsx-pvc': expected CLAIM:PATH"),
    (["--kind", "mpijob", "--mount", "/fsx:/root/.ssh"],
     "--mount '/fsx:/root/.ssh': /root/.ssh is a folder the MPI operator fills"),
    (["--kind", "mpijob", "--mount", "fsx:/fsx"], "HOST_PATH 'fsx' must be an absolute path"),
    (["--kind", "mpijob", "--mount", "/a:/x", "--pvc", "c:/x"], "/x is already mounted by"),
])
def test_k8s_command_line_mistakes_are_one_line_and_exit_2(tmp_path, args, words):
    target = tmp_path / "job.yaml"
    target.write_text("old\n")
    line = one_line(k8s_cli(*args, *PAIR, "--output", str(target), command=COMMAND), 2)
    assert words in line
    assert target.read_text() == "old\n"


def test_k8s_refuses_a_pair_and_a_plan_with_problems(tmp_path):
    target = tmp_path / "job.yaml"
    line = one_line(k8s_cli("--kind", "mpijob", "--stack", "cuda11.7-efa", "--nodes", "2",
                            "--instance-type", "m5.24xlarge", "--image-uri", IMAGE, "--output",
                            str(target), command=COMMAND), 1)
    assert "cuda-stack-needs-gpu-instance" in line
    # torchrun is what a PyTorchJob runs; cpu-mpi has no PyTorch: explain's PROBLEM line
    line = one_line(k8s_cli("--kind", "pytorchjob", "--stack", "cpu-mpi", "--nodes", "2",
                            "--instance-type", "c5n.18xlarge", "--image-uri", IMAGE, "--output",
                            str(target), command=COMMAND), 1)
    assert "torchrun needs PyTorch" in line
    assert not target.exists()


def test_k8s_without_a_command_or_kind(tmp_path):
    assert "give the training command after --" in one_line(k8s_cli("--kind", "mpijob", *PAIR), 2)
    assert "missing option --kind" in one_line(k8s_cli(*PAIR, command=COMMAND), 2)


def test_each_elastic_manifest_has_a_rendezvous_id_of_its_own():
    """The operator sets PET_RDZV_ID only from elasticPolicy.rdzvId (training-operator
    elastic.go); without one, every job's torchrun uses the id "none"."""
    first, second = (k8s("pytorchjob", "cuda11.7-efa", 3, "p4d.24xlarge", "--elastic", "2:4")
                     for _ in range(2))
    ids = [m["spec"]["elasticPolicy"]["rdzvId"] for m in (first, second)]
    assert all(re.fullmatch(r"mnp-cuda11-7-efa-[0-9a-f]{8}", i) for i in ids), ids
    assert ids[0] != ids[1]
    static = k8s("pytorchjob", "cuda11.7-efa", 3, "p4d.24xlarge")
    assert "elasticPolicy" not in static["spec"]


def test_a_trainjob_states_the_trainer_release_it_needs(tmp_path):
    """runtimePatches exists from Kubeflow Trainer v2.2.0 (its CHANGELOG-2.2.md); an older
    Trainer drops it, and the pods lose /dev/shm and the mounts without a word."""
    target = tmp_path / "job.yaml"
    proc = k8s_cli("--kind", "trainjob", *PAIR, "--output", str(target), command=COMMAND)
    assert proc.returncode == 0, proc.stderr
    text = target.read_text()
    assert text.splitlines()[0] == ("# Requires Kubeflow Trainer v2.2.0 or later: older releases "
                                    "have no spec.runtimePatches and drop it, with /dev/shm and "
                                    "the volumes")
    manifest = yaml.safe_load(text)
    assert manifest["metadata"]["annotations"]["mnp-stacks/requires"].startswith(
        "Kubeflow Trainer v2.2.0 or later")
    assert manifest["spec"]["runtimePatches"]  # what the requirement is about
    assert "runtimePatches" in crds.schema("TrainJob")["properties"]["spec"]["properties"]
    for kind in ("pytorchjob", "mpijob"):  # their operators' APIs have no such field to lose
        other = k8s(kind, "cpu-tcp", 2, "c5n.18xlarge")
        assert "annotations" not in other["metadata"]


# EKS's AMI reserves 11 MiB x maxPods + 255 MiB of memory for the kubelet (awslabs/amazon-eks-ami
# nodeadm/internal/kubelet/config.go, getMemoryMebibytesToReserve) and evicts below 100 MiB
# (https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/, the default
# memory.available<100Mi); 737 is the largest maxPods of the table's types in the AMI's
# files/eni-max-pods.txt (c5n.18xlarge, m5.24xlarge, p4d.24xlarge, p3dn.24xlarge).
EKS_MAX_PODS = 737
EVICTION_MIB = 100


def _quantity_mib(text: str) -> int:
    return int(text[:-2]) * 1024 if text.endswith("Gi") else int(text[:-2])


@pytest.mark.parametrize("instance_type", sorted(INSTANCE_TYPES))
def test_a_node_pod_fills_more_than_half_of_its_node_and_fits_in_it(instance_type):
    """One pod per node: two never fit in one instance (issue 25: without requests two 36-slot
    cpu-tcp workers could share a c5n.18xlarge); one fits in what an EKS node leaves to pods."""
    row = get_instance_type(instance_type)
    asked = resources(row, "tcp")["requests"]
    cpus, memory_mib = int(asked["cpu"]), _quantity_mib(asked["memory"])
    assert 2 * cpus > row.vcpus and 2 * memory_mib > row.memory_mib
    assert cpus <= row.vcpus - 1  # EKS reserves under one vCPU (getCPUMillicoresToReserve)
    reserved = 11 * EKS_MAX_PODS + 255 + EVICTION_MIB
    kernel = row.memory_mib * 3 // 100  # room for the kernel's own memory (project margin)
    assert memory_mib <= row.memory_mib - reserved - kernel


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cpu_stack_pods_ask_for_their_node_and_only_its_type(tmp_path, kind):
    target = tmp_path / "job.yaml"
    proc = k8s_cli("--kind", kind, "--stack", "cpu-tcp", "--nodes", "2", "--instance-type",
                   "c5n.18xlarge", "--image-uri", IMAGE, "--output", str(target), command=COMMAND)
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(target.read_text())
    wanted = {"node.kubernetes.io/instance-type": "c5n.18xlarge", "kubernetes.io/arch": "amd64"}
    asked = {"requests": {"cpu": "64", "memory": "172Gi"}}
    if kind == "trainjob":
        assert manifest["spec"]["trainer"]["resourcesPerNode"] == asked
        patched = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]
        job = patched["spec"]["replicatedJobs"][0]["template"]["spec"]
        assert job["template"]["spec"]["nodeSelector"] == wanted
        return
    replicas = manifest["spec"].get("pytorchReplicaSpecs") or manifest["spec"]["mpiReplicaSpecs"]
    nodes = {role: r["template"]["spec"] for role, r in replicas.items() if role != "Launcher"}
    assert nodes, replicas
    for pod in nodes.values():
        assert pod["nodeSelector"] == wanted
        assert pod["containers"][0]["resources"] == asked


def _pod_specs(node: object) -> list[dict]:
    """Every pod spec anywhere in a manifest (a mapping with ``containers``), found by walking
    it, so a pod template of any kind or place (a TrainJob's runtime patch) is not missed."""
    if isinstance(node, dict):
        found = [node] if "containers" in node else []
        return found + [pod for value in node.values() for pod in _pod_specs(value)]
    if isinstance(node, list):
        return [pod for value in node for pod in _pod_specs(value)]
    return []


ARM64_JOBS = [
    ("cuda13.2-tcp-arm64", "p6e-gb200.36xlarge", ["--kind", "pytorchjob"], 2),
    ("cuda13.2-tcp-arm64", "p6e-gb200.36xlarge", ["--kind", "pytorchjob", "--elastic", "1:3"], 1),
    ("cuda13.2-tcp-arm64", "p6e-gb200.36xlarge", ["--kind", "trainjob"], 1),
    # MPI: the arm64 CPU stack (the GB200 one has no MPI); the launcher pod runs the image too
    ("cpu-tcp-arm64", "c7gn.16xlarge", ["--kind", "mpijob"], 2),
]


@pytest.mark.parametrize(("stack", "instance_type", "kind", "templates"), ARM64_JOBS,
                         ids=["pytorchjob", "pytorchjob-elastic", "trainjob", "mpijob"])
def test_every_pod_of_an_arm64_stack_selects_arm64_nodes(tmp_path, stack, instance_type, kind,
                                                          templates):
    """What `invoke k8s` writes for an arm64 stack: every pod template, the MPIJob launcher's
    too, selects kubernetes.io/arch arm64 (the image's platform), a node pod also its type."""
    target = tmp_path / "job.yaml"
    proc = k8s_cli(*kind, "--stack", stack, "--nodes", "2", "--instance-type", instance_type,
                   "--image-uri", IMAGE, "--output", str(target), command=["python3", "t.py"])
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(target.read_text(encoding="utf-8"))
    assert crds.errors(manifest) == []
    found = _pod_specs(manifest)
    assert len(found) == templates, found
    for pod in found:
        selector = pod.get("nodeSelector", {})
        assert selector.get("kubernetes.io/arch") == "arm64", pod
        if pod["containers"][0]["name"] == "launcher":
            assert selector == {"kubernetes.io/arch": "arm64"}
        else:
            assert selector == {"node.kubernetes.io/instance-type": instance_type,
                                "kubernetes.io/arch": "arm64"}
