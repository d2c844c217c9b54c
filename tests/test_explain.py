"""``invoke explain``: every stack on each of its instance types, text and JSON, from declarations
only; one line and exit 2 for an unknown stack, instance type or launcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import launchers
from entrypoint.probe import fabric
from matrix.cli import jobtasks
from matrix.errors import UserError
from matrix.jobs.explain import ExplainError, explain, parse_nodes
from matrix.model.instances import INSTANCE_TYPES
from tests.helpers import project_matrix

ROOT = Path(__file__).resolve().parent.parent
MATRIX = project_matrix()
PAIRS = [(name, itype) for name, stack in MATRIX.stacks.items() for itype in stack.instances]


def explain_task(stack: str, itype: str, nodes: str, launcher: str, as_json: bool,
                 command: list[str]) -> None:
    """``invoke explain`` as invoke calls it: the typed option values, raw."""
    jobtasks.explain({"stacks": str(ROOT / "stacks.yaml"), "stack": [stack],
                      "instance_type": itype, "nodes": nodes, "launcher": launcher,
                      "json": as_json}, command)


@pytest.mark.parametrize("stack,itype", PAIRS, ids=[f"{s}@{i}" for s, i in PAIRS])
def test_every_stack_on_each_of_its_instances(stack, itype, capsys):
    # (No instance type can be missing from the table here: load_matrix rejects a stacks file
    # that names one, so MATRIX above would not load.) mpirun where the stack has Open MPI,
    # else torchrun (a stack with PyTorch and NCCL alone).
    launcher = "mpirun" if "openmpi" in MATRIX.stacks[stack].versions() else "torchrun"
    explain_task(stack, itype, "3", launcher, False, ["python3", "train.py"])
    text = capsys.readouterr().out
    assert f"stack {stack} on 3 x {itype}" in text
    assert "role: main, node 0 of 3" in text and "command: " in text
    explain_task(stack, itype, "3", launcher, True, ["python3", "train.py"])
    data = json.loads(capsys.readouterr().out)["roles"][0]["plan"]  # the main node's dry run
    instance = INSTANCE_TYPES[itype]
    assert data["problems"] == [], data["problems"]
    assert data["slots"]["count"] == instance.slots_per_node()
    assert data["fabric"]["kind"] == MATRIX.stacks[stack].fabric
    # mpirun runs the command as typed; torchrun takes the script without its interpreter
    assert data["argv"][-2 if launcher == "mpirun" else -1:] == ["python3", "train.py"][
        -2 if launcher == "mpirun" else -1:]
    assert len(data["hostfile"]) == 3
    assert data["facts"]["origin"].startswith("declared: stacks.yaml")


@pytest.mark.parametrize("launcher", ["torchrun", "torch.distributed.launch"])
def test_a_pytorch_launcher_on_a_stack_without_pytorch_is_a_problem(launcher):
    plan = explain(MATRIX, "cpu-mpi", "c5n.18xlarge", 2, launcher).plan
    assert any(p.startswith(f"{launcher} needs PyTorch") for p in plan.problems), plan.problems


@pytest.mark.parametrize("as_json", [False, True])
def test_a_plan_with_problems_exits_1(as_json):
    args = ["--json"] if as_json else []
    proc = subprocess.run([sys.executable, "-m", "invoke", "explain", "--stack", "cpu-mpi",
                           "--instance-type", "c5n.18xlarge", "--nodes", "2", "--launcher",
                           "torchrun", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    if as_json:
        assert json.loads(proc.stdout)["roles"][0]["plan"]["problems"]
    else:
        assert "PROBLEM (a real run stops here): torchrun needs PyTorch" in proc.stdout
    # the plan, then the line invoke jobdef refuses the same job with
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: stack cpu-mpi with launcher torchrun on 2 x c5n.18xlarge "
                           "under AWS Batch: ") and "torchrun needs PyTorch" in line, line


def test_every_launcher_explains_on_a_stack_that_has_it(capsys):
    for launcher in launchers.NAMES:
        result = explain(MATRIX, "cpu-tcp", "c5n.18xlarge", 2, launcher)
        assert result.plan.launcher["unit"] == launcher
        assert result.plan.problems == [], (launcher, result.plan.problems)


@pytest.mark.parametrize("args,word", [
    (["--stack", "nope", "--instance-type", "p4d.24xlarge", "--nodes", "2"], "--stack 'nope'"),
    (["--stack", "cpu-tcp", "--instance-type", "x9.huge", "--nodes", "2"],
     "--instance-type 'x9.huge'"),
    (["--stack", "cpu-tcp", "--instance-type", "c5n.18xlarge", "--nodes", "2", "--launcher",
      "horovodrun"], "--launcher 'horovodrun'"),
    (["--stack", "cpu-tcp", "--instance-type", "c5n.18xlarge", "--nodes", "two"],
     "--nodes 'two'"),
])
def test_unknown_names_exit_2_with_one_line(args, word):
    proc = subprocess.run([sys.executable, "-m", "invoke", "explain", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0] and "Traceback" not in proc.stderr


def test_unknown_stack_is_worded_as_the_other_tasks_word_it():
    proc = subprocess.run([sys.executable, "-m", "invoke", "explain", "--stack", "cpu-tpc",
                           "--instance-type", "c5n.18xlarge", "--nodes", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "error: stacks.yaml: --stack 'cpu-tpc': no stack of that name; did you mean cpu-tcp? "
        f"(stacks: {', '.join(sorted(MATRIX.stacks))})")
    other = subprocess.run([sys.executable, "-m", "invoke", "plan", "--stack", "cpu-tpc"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (other.returncode, other.stderr) == (2, proc.stderr)


def test_invoke_explain_json_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "invoke", "explain", "--stack", "cuda12.1-efa",
                           "--instance-type", "p5.48xlarge", "--nodes", "2", "--json", "--",
                           "python3", "-m", "pkg.train", "--lr", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["roles"][0]["plan"]
    assert data["argv"][-4:] == ["-m", "pkg.train", "--lr", "1"]
    env = {e["name"]: e["value"] for e in data["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "=eth0"  # NCCL 2.20.5 (torch) and 2.21.5
    assert "FI_PROVIDER" not in env and "NCCL_PROTO" not in env  # aws-ofi-nccl 1.12.1
    assert "FI_EFA_USE_DEVICE_RDMA" not in env  # plugin >= 1.7 with libfabric 1.22 does it
    assert len(data["facts"]["efa_devices"]) == INSTANCE_TYPES["p5.48xlarge"].efa_interfaces


def test_an_instance_outside_the_stack_is_explained_with_a_note():
    result = explain(MATRIX, "cpu-tcp", "hpc6a.48xlarge", 2)
    assert any("not one of cpu-tcp's instances" in note for note in result.notes)


def test_a_stack_without_cuda_on_a_gpu_instance_is_refused():
    """cpu-tcp on p5 would ask Batch for 8 GPUs a node and use none (issue 16, item 8)."""
    with pytest.raises(UserError, match=r"cannot run on p5.48xlarge under AWS Batch: instance "
                                         r"p5.48xlarge \(gpus 8\) needs cuda, it is missing"):
        explain(MATRIX, "cpu-tcp", "p5.48xlarge", 2)


@pytest.mark.parametrize("stack,itype", [("cpu-tcp", "c5n.18xlarge"), ("cuda13.2-tcp", "g6e.48xlarge")])
def test_a_tcp_stack_sees_no_efa_devices(stack, itype):
    assert INSTANCE_TYPES[itype].efa_interfaces  # the type has EFA; the tcp job gets none
    plan = explain(MATRIX, stack, itype, 2).plan
    assert plan.facts["efa_devices"] == [] and plan.fabric["kind"] == "tcp"


def test_the_efa_installers_own_plugin_is_found():
    """cuda13.2-efa has no aws-ofi-nccl layer: EFA installer 1.50.0 provides plugin 1.21.1."""
    plan = explain(MATRIX, "cuda13.2-efa", "p5.48xlarge", 2).plan
    assert not any("no aws-ofi-nccl plugin" in note for note in plan.notes), plan.notes
    assert plan.facts["versions"]["aws-ofi-nccl"] == "1.21.1"
    env = {e["name"]: e["value"] for e in plan.to_dict()["env"]}
    assert "/opt/amazon/ofi-nccl/lib" in env["LD_LIBRARY_PATH"].split(":")


@pytest.mark.parametrize("stack,itype,rule", [
    ("cuda11.7-efa", "p5.48xlarge", "p5-efa-minimums"),
    ("cuda12.1-efa", "p6-b200.48xlarge", None),
])
def test_a_pair_jobdef_refuses_exits_1_with_its_line(stack, itype, rule):
    """Understood but cannot be done: 1, as jobdef exits for the same pair (2 is for mistakes
    in the command line)."""
    with pytest.raises(UserError) as failure:
        explain(MATRIX, stack, itype, 2)
    assert not isinstance(failure.value, ExplainError)
    assert f"stack {stack} cannot run on {itype}" in str(failure.value)
    assert rule is None or f"[rule {rule}]" in str(failure.value)
    proc = subprocess.run([sys.executable, "-m", "invoke", "explain", "--stack", stack,
                           "--instance-type", itype, "--nodes", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot run on" in lines[0], proc.stderr


@pytest.mark.parametrize("stack,itype", [("cpu-tcp", "c5n.18xlarge"), ("cpu-mpi", "c5n.18xlarge"),
                                          ("synapseai1.6-efa", "dl1.24xlarge")])
def test_no_nccl_interface_guess_on_a_stack_without_nccl(stack, itype):
    plan = explain(MATRIX, stack, itype, 2).plan
    assert plan.value("NCCL_SOCKET_IFNAME") is None
    assert "nccl version unknown" not in json.dumps(plan.env)


def test_synapseai_declares_what_efa_installer_1_16_0_contains():
    """EFA changelog 1.16.0: libfabric 1.15.1amzn1.0; Open MPI 4.1.2 from 1.15.0 until 1.17.0."""
    versions = explain(MATRIX, "synapseai1.6-efa", "dl1.24xlarge", 2).plan.facts["versions"]
    assert versions["libfabric"] == "1.15.1amzn1.0" and versions["openmpi"] == "4.1.2"


def test_parse_nodes():
    assert parse_nodes("4") == 4
    with pytest.raises(ExplainError):
        parse_nodes("4.5")


def test_entrypoint_rdma_families_agree_with_the_instance_table():
    """The in-image entrypoint keeps its own tuple (it cannot import matrix/); it must say the
    same as the instance table for every GPU type the table knows. The entrypoint uses RDMA reads
    only for GPU buffers (FI_EFA_USE_DEVICE_RDMA for NCCL); HCCL on DL1 does not read that tuple."""
    for name, row in INSTANCE_TYPES.items():
        if row.efa_interfaces and row.gpus:
            assert fabric.rdma_capable(name)[0] is row.efa_rdma_read, name


@pytest.mark.parametrize("nodes", [0, -1, 10001, 1000000000])
def test_explain_refuses_a_node_count_the_entrypoint_would_refuse(nodes):
    """explain used to hand 10001 to the entrypoint's config loader and crash (issue 16)."""
    with pytest.raises(ExplainError, match=f"--nodes {nodes}: expected a whole number from 1 to"):
        explain(MATRIX, "cpu-tcp", "c5n.18xlarge", nodes)


# --launcher (None: the writer's default, as its task writes MNP_LAUNCHER), then node 0's role,
# the adapter that detects it, its launcher unit and the start of what it runs, for each
# scheduler (issue 15), with the names the writer gives the job (invoke k8s: mnp-<stack>).
# invoke sbatch's default is mpirun with --ranks srun: srun --mpi=pmix starts every rank, so each
# task is a rank (the rank adapter, PMIX_RANK) running the command itself.
SCHEDULED = {
    "batch": (None, "main", "batch", "mpirun", "rendezvous"),
    "slurm": (None, "rank", "rank", "none", "rank: 0 (PMIX_RANK)"),
    "slurm-torchrun": ("torchrun", "main", "slurm", "torchrun", "--master_addr node1"),
    "pytorchjob": (None, "main", "pytorchjob", "torchrun",
                   "--master_addr mnp-cpu-tcp-master-0 --master_port 23456"),
    "trainjob": (None, "main", "trainjob", "torchrun",
                 "--master_addr mnp-cpu-tcp-node-0-0.mnp-cpu-tcp --master_port 29500"),
    "mpijob": (None, "launcher", "mpijob", "mpirun",
               "mpirun --allow-run-as-root -np 108"),  # 3 workers x 36
}


@pytest.mark.parametrize("case", sorted(SCHEDULED))
def test_explain_under_each_scheduler_uses_its_adapters_example(case):
    scheduler = case.split("-")[0]
    launcher, role, adapter, unit, expected = SCHEDULED[case]
    result = explain(MATRIX, "cpu-tcp", "c5n.18xlarge", 3, launcher, ["python3", "train.py"],
                     scheduler=scheduler)
    plan = result.plan
    assert (plan.role["mode"], plan.role["scheduler"], plan.launcher["unit"]) == (
        role, adapter, unit)
    assert plan.problems == [], plan.problems
    text = result.text()
    assert f"under {scheduler}" in text.splitlines()[0]
    assert f"scheduler: {adapter} (detected from " in text
    assert expected in text
    if scheduler != "batch":
        assert plan.rendezvous is None and plan.ssh is None


def test_explain_refuses_an_unknown_scheduler_with_one_line():
    with pytest.raises(ExplainError, match=r"^--scheduler 'k8s' is not one of batch, mpijob, "):
        explain(MATRIX, "cpu-tcp", "c5n.18xlarge", 2, None, scheduler="k8s")


def test_an_ssh_launcher_under_a_scheduler_that_serves_no_ssh_is_a_problem():
    plan = explain(MATRIX, "cpu-tcp", "c5n.18xlarge", 2, "mpirun", scheduler="pytorchjob").plan
    assert plan.problems and "needs SSH between the nodes" in plan.problems[0]


def test_the_mpijob_launcher_counts_the_operators_hostfile_and_names_its_mount():
    plan = explain(MATRIX, "cpu-tcp", "c5n.18xlarge", 2, None, scheduler="mpijob").plan
    assert plan.role["node"]["hosts"] == ["mnp-cpu-tcp-worker-0.mnp-cpu-tcp.default.svc",
                                          "mnp-cpu-tcp-worker-1.mnp-cpu-tcp.default.svc"]
    assert plan.environment["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert "/etc/mpi/hostfile (OMPI_MCA_orte_default_hostfile)" in plan.role["node"]["extra"][
        "hostfile"]


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_an_elastic_pytorchjob_explains_as_a_peer_on_its_rendezvous(backend):
    plan = explain(MATRIX, "cpu-tcp", "c5n.18xlarge", 3, None, scheduler="pytorchjob",
                   rdzv=backend).plan
    assert plan.role["mode"] == "peer" and plan.problems == []
    line = " ".join(plan.argv)
    assert f"--nnodes 3:3 --nproc_per_node 36 --rdzv_backend {backend} --rdzv_endpoint " in line
    assert not [name for name in plan.environment if name.startswith("PET_")]


def test_rdzv_needs_the_pytorchjob_scheduler():
    with pytest.raises(ExplainError, match="^--rdzv etcd: an elastic PyTorchJob's rendezvous; "
                                           "add --scheduler pytorchjob$"):
        explain(MATRIX, "cpu-tcp", "c5n.18xlarge", 2, None, scheduler="slurm", rdzv="etcd")


def invoke_explain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "explain", *args, "--", "python3",
                           "train.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("scheduler, role, adapter, unit", [
    ("slurm", "rank", "rank", "none"),  # mpirun --ranks srun: srun starts each rank
    ("pytorchjob", "main", "pytorchjob", "torchrun"), ("trainjob", "main", "trainjob", "torchrun"),
    ("mpijob", "launcher", "mpijob", "mpirun"), ("batch", "main", "batch", "mpirun")])
def test_invoke_explain_scheduler_from_the_command_line(scheduler, role, adapter, unit):
    """--scheduler reaches the plan; with no --launcher the writer's default launcher, as its
    task writes MNP_LAUNCHER."""
    proc = invoke_explain("--stack", "cpu-tcp", "--instance-type", "c5n.18xlarge", "--nodes",
                          "3", "--scheduler", scheduler, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["roles"][0]["plan"]
    assert data["role"]["scheduler"] == adapter
    assert data["launcher"]["unit"] == unit
    assert role in json.dumps(data["role"])


@pytest.mark.parametrize("args, word", [
    (["--scheduler", "slurmm"], "--scheduler"),
    (["--scheduler", "slurm", "--rdzv", "c10d"], "--rdzv"),
    (["--scheduler", "pytorchjob", "--rdzv", "zookeeper"], "--rdzv"),
])
def test_invoke_explain_scheduler_mistakes_are_one_line_exit_2(args, word):
    proc = invoke_explain("--stack", "cpu-tcp", "--instance-type", "c5n.18xlarge", "--nodes",
                          "2", *args)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert word in line and "Traceback" not in proc.stderr


@pytest.mark.parametrize("stack, itype, mpirun", [
    ("cuda10.1-tcp", "p3.16xlarge", "/opt/openmpi/bin/mpirun"),  # built into options.prefix
    ("cpu-tcp", "c5n.18xlarge", "/usr/bin/mpirun"),  # Debian's openmpi-bin
    ("cuda13.2-efa", "p5.48xlarge", "/opt/amazon/openmpi/bin/mpirun"),  # the EFA installer's
])
def test_invoke_explain_runs_the_stacks_own_mpirun(stack, itype, mpirun):
    """Issue 25: cuda10.1-tcp builds Open MPI into /opt/openmpi; explain printed /usr/bin/mpirun."""
    proc = invoke_explain("--stack", stack, "--instance-type", itype, "--nodes", "2")
    assert proc.returncode == 0, proc.stderr
    command = [line for line in proc.stdout.splitlines() if line.startswith("command: ")][0]
    assert command.startswith(f"command: {mpirun} --allow-run-as-root"), command
