"""Slurm batch scripts (`invoke sbatch`) for clusters with pyxis and enroot.

Two kinds of check. The script's content (directives, the srun line, the environment, the
command word for word) is read back with the shell's own rules. Then the #SBATCH directives are
submitted with ``sbatch --test-only`` to a real Slurm 22.05 controller (tests/integration's
cluster, in containers of the cpu-tcp image) whose nodes are configured with the instance's
CPUs and GPUs: Slurm itself says whether the allocation the script asks for exists
(``--test-only`` does not run the script). The scripts run, srun line included, through the
pyxis play in tests/integration/test_slurm_pyxis.py.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from matrix.errors import UserError
from matrix.jobs.sbatch import ENTRYPOINT, REQUEUE_EXIT_CODES, directives, enroot_image
from matrix.jobs.spec import DEFAULT_ATTEMPTS
from matrix.model.instances import get_instance_type
from tests.helpers import one_line, project_matrix, written

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "c" * 64
IMAGE = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cuda@{DIGEST}"
COMMAND = ["python3", "-c", "import sys; print('a b', sys.argv)", "it's", "$HOME", "*"]


def sbatch(stack: str, nodes: int, instance_type: str, *options: str, command: list[str]) -> str:
    """The script ``invoke sbatch --stack STACK --nodes N --instance-type T --image-uri IMAGE
    OPTIONS -- COMMAND`` writes (tests.helpers.written: the task's own steps, in this process)."""
    return written("sbatch", "--stack", stack, "--nodes", str(nodes), "--instance-type",
                   instance_type, "--image-uri", IMAGE, *options, command=command)


def srun_line(script: str) -> str:
    """The srun line (continuation lines joined), without the ``|| status=$?`` that keeps its
    exit status for the requeue decision."""
    text = script.replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert line.endswith(" || status=$?"), line
    return line[:-len(" || status=$?")]


def srun_words(script: str) -> list[str]:
    """The srun line as the shell splits it."""
    return shlex.split(srun_line(script))


def exports(script: str) -> dict[str, str]:
    found = {}
    for line in script.splitlines():
        if line.startswith("export "):
            (word,) = shlex.split(line[len("export "):])
            name, _, value = word.partition("=")
            found[name] = value
    return found


def test_mpirun_layout_one_task_per_gpu_with_pmix():
    script = sbatch("cuda11.7-efa", 4, "p4d.24xlarge", "--mount", "/fsx:/fsx", "--mount",
                    "/scratch/ds:/data:ro", command=COMMAND)
    assert script.startswith("#!/bin/bash\n")
    assert directives(script) == {"--job-name": "mnp-cuda11.7-efa", "--nodes": "4",
                                  "--ntasks-per-node": "8", "--gpus-per-node": "8",
                                  "--exclusive": "", "--output": "mnp-cuda11.7-efa-%j.out",
                                  "--requeue": "", "--open-mode": "append"}
    words = srun_words(script)
    env = exports(script)
    assert words[:7] == [
        "srun", "--mpi=pmix",
        f"--container-image=123456789012.dkr.ecr.us-east-1.amazonaws.com#mnp/cuda:{DIGEST}",
        "--no-container-entrypoint", f"--container-env={','.join(sorted(env))}",
        "--container-mounts=/fsx:/fsx,/scratch/ds:/data:ro", ENTRYPOINT]
    assert words[7:] == COMMAND  # word for word, whatever the quoting
    assert env == {"MNP_FABRIC": "efa", "MNP_INSTANCE_TYPE": "p4d.24xlarge",
                   "MNP_LAUNCHER": "mpirun", "MNP_SLOTS_PER_NODE": "8", "MNP_WAIT_TIMEOUT": "600"}
    # the scheduler is detected, never forced: a pmix task must still be seen as a rank
    assert "MNP_SCHEDULER" not in script


def test_pyxis_never_runs_the_image_entrypoint_and_the_jobs_settings_win():
    """pyxis runs the ENTRYPOINT only once per node, at the container's start and without the
    job's variables, and lets the image's ENV win over names not in --container-env
    (tests/integration/test_slurm_pyxis.py runs these scripts through the pyxis play)."""
    script = sbatch("cpu-tcp", 2, "c5n.18xlarge", "--launcher", "torchrun", "--launcher-args",
                    "--master_port 29600", command=["python3", "t.py"])
    words = srun_words(script)
    assert "--container-entrypoint" not in words and "--no-container-entrypoint" in words
    (listed,) = [w.split("=", 1)[1] for w in words if w.startswith("--container-env=")]
    assert listed.split(",") == sorted(exports(script)) and "MNP_LAUNCHER_ARGS" in listed
    assert exports(script)["MNP_LAUNCHER_ARGS"] == "--master_port 29600"
    assert words[-3:] == [ENTRYPOINT, "python3", "t.py"]


@pytest.mark.parametrize(("launcher", "ranks"), [
    ("torchrun", "srun"), ("deepspeed", "srun"), ("torch.distributed.launch", "srun"),
    ("none", "srun"), ("mpirun", "mpirun")])
def test_per_node_launchers_get_one_task_per_node(launcher, ranks):
    script = sbatch("cuda11.7-efa", 2, "p4d.24xlarge", "--launcher", launcher, "--ranks", ranks,
                    command=["python3", "t.py"])
    assert directives(script)["--ntasks-per-node"] == "1"
    assert directives(script)["--gpus-per-node"] == "8"
    words = srun_words(script)
    # MpiDefault=pmix on a site would give each task PMIX_RANK: the step says none itself
    assert words[:2] == ["srun", "--mpi=none"]
    assert "--container-mounts" not in " ".join(words)
    assert exports(script)["MNP_LAUNCHER"] == launcher
    # only launchers that reach the nodes over SSH get the entrypoints' own wiring and its secret
    wired = launcher in ("mpirun", "deepspeed")
    assert ("MNP_SECRET" in srun_line(script)) == wired
    assert ("/dev/urandom" in script) == wired


def test_the_step_secret_is_made_when_the_script_runs_and_differs_per_run(tmp_path):
    """The secret is 64 hex digits made by the batch script on the host, never at submit time
    (sbatch would keep a submitted value in the job's record)."""
    script = sbatch("cpu-tcp", 2, "c5n.18xlarge", "--launcher", "mpirun", "--ranks", "mpirun",
                    command=["true"])
    lines = "\n".join(line for line in script.splitlines()
                      if "MNP_SECRET" in line and not line.startswith(" "))  # not srun's
    shown = "set -euo pipefail\n" + lines + "\nbash -c 'echo $MNP_SECRET'"  # what srun's tasks get
    values = {subprocess.run(["bash", "-c", shown], capture_output=True, text=True,
                             check=True).stdout.strip() for _ in range(2)}
    assert len(values) == 2 and all(len(v) == 64 and int(v, 16) >= 0 for v in values)
    # without /dev/urandom's bytes (od fails: set -e stops at the assignment) or with too few
    # (the length check), the script stops with one line instead of opening the rendezvous
    for broken, last in ((shown.replace("/dev/urandom", "/nonexistent"),
                          "od: /nonexistent: No such file or directory"),
                         (shown.replace("-N32", "-N8"), "mnp: cannot make MNP_SECRET from "
                                                        "/dev/urandom: the job stops here")):
        proc = subprocess.run(["bash", "-c", broken], capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 1 and proc.stdout == "", proc
        assert proc.stderr.splitlines() == [last], proc.stderr


def test_cpu_instance_asks_for_no_gpus_and_a_rank_per_core():
    script = sbatch("cpu-tcp", 2, "c5n.18xlarge", command=["true"])
    assert "--gpus-per-node" not in directives(script)
    assert directives(script)["--ntasks-per-node"] == str(
        get_instance_type("c5n.18xlarge").slots_per_node())


@pytest.mark.parametrize(("uri", "expected"), [
    (IMAGE, f"123456789012.dkr.ecr.us-east-1.amazonaws.com#mnp/cuda:{DIGEST}"),
    (f"127.0.0.1:5000/mnp-stacks@{DIGEST}", f"127.0.0.1:5000#mnp-stacks:{DIGEST}"),
    (f"localhost/team/x@{DIGEST}", f"localhost#team/x:{DIGEST}"),
    (f"library/ubuntu@{DIGEST}", f"library/ubuntu:{DIGEST}"),  # Docker Hub: no registry part
])
def test_enroot_image_reference(uri, expected):
    assert enroot_image(uri) == expected


def test_enroot_image_needs_a_digest():
    with pytest.raises(UserError, match="by digest"):
        enroot_image("123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cuda:latest")


def test_the_script_is_valid_bash_and_bash_reads_the_command_word_for_word(tmp_path):
    """bash parses the whole script, and bash itself splits the srun line into the words that
    reach srun: the command is there as typed, whatever quotes or $ it holds."""
    script = sbatch("cpu-tcp", 2, "c5n.18xlarge", "--mount", "/fsx:/fsx", command=COMMAND)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    line = srun_line(script)
    proc = subprocess.run(["bash", "-c", f"set -- {line}; printf '%s\\0' \"$@\""],
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.decode().split("\0")[:-1]
    assert words == srun_words(script) and words[-len(COMMAND):] == COMMAND


# --- requeue on an infrastructure failure --------------------------------------------------------

STUBS = {  # srun ends with the status the test gives; scontrol records how it was called
    "srun": '#!/bin/sh\nexit "$STUB_STATUS"\n',
    "scontrol": '#!/bin/sh\necho "$@" >> "$STUB_LOG"\n',
}


def run_script(tmp_path: Path, status: int, restarts: str | None,
               *options: str) -> tuple[int, str]:
    """The whole script ``invoke sbatch OPTIONS`` writes, run by bash with stand-ins for srun
    and scontrol on PATH: ``(the script's exit status, what scontrol was asked)``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / f"scontrol-{status}-{restarts}.log"
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch("cpu-tcp", 2, "c5n.18xlarge", *options, command=["true"]))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
           "STUB_STATUS": str(status), "STUB_LOG": str(log)}
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = restarts
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          check=False)
    return proc.returncode, log.read_text() if log.exists() else ""


@pytest.mark.parametrize(("status", "restarts", "requeued"), [
    (REQUEUE_EXIT_CODES[0], None, True),  # first run (Slurm sets no SLURM_RESTART_COUNT)
    (REQUEUE_EXIT_CODES[0], str(DEFAULT_ATTEMPTS - 2), True),  # attempts are left
    (REQUEUE_EXIT_CODES[0], str(DEFAULT_ATTEMPTS - 1), False),  # the last attempt
    (3, None, False),  # the user's command failed: a requeue would fail the same way
    (1, None, False),
    (0, None, False),
])
def test_an_infrastructure_exit_code_requeues_the_job_while_attempts_are_left(
        tmp_path, status, restarts, requeued):
    code, asked = run_script(tmp_path, status, restarts)
    assert code == status  # the job ends with the step's status either way
    assert asked == ("requeue 42\n" if requeued else "")


def test_the_attempts_bound_is_the_scripts_and_one_attempt_never_requeues(tmp_path):
    """``--attempts 0`` is refused by the task (test_sbatch_mistakes_are_one_line)."""
    assert run_script(tmp_path, REQUEUE_EXIT_CODES[0], "1", "--attempts", "3")[1] == \
        "requeue 42\n"
    assert run_script(tmp_path, REQUEUE_EXIT_CODES[0], None, "--attempts", "1")[1] == ""


MATRIX = project_matrix()
PAIRS = [(name, instance) for name, stack in MATRIX.stacks.items() for instance in stack.instances]


@pytest.mark.parametrize(("stack", "instance_type"), PAIRS, ids=[f"{s}@{i}" for s, i in PAIRS])
def test_every_declared_pair_makes_a_script_bash_accepts(stack, instance_type, tmp_path):
    s = MATRIX.stack(stack)
    row = get_instance_type(instance_type)
    script = sbatch(stack, 2, instance_type, "--mount", "/fsx:/fsx",
                    command=["python3", "train.py"])
    found = directives(script)
    assert found.get("--gpus-per-node") == (str(row.gpus) if row.gpus else None)
    assert found["--ntasks-per-node"] == str(row.slots_per_node())
    assert exports(script)["MNP_FABRIC"] == s.fabric
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0


# --- invoke sbatch as users call it --------------------------------------------------------------

PAIR = ["--stack", "cuda11.7-efa", "--nodes", "2", "--instance-type", "p4d.24xlarge",
        "--image-uri", IMAGE]


def sbatch_cli(*args: str, command: list[str] | None = None) -> subprocess.CompletedProcess:
    tail = ["--", *command] if command else []
    return subprocess.run([sys.executable, "-m", "invoke", "sbatch", *args, *tail], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})


def test_sbatch_writes_the_script(tmp_path):
    target = tmp_path / "job.sbatch"
    proc = sbatch_cli(*PAIR, "--mount", "/fsx:/fsx:ro", "--output", str(target), command=COMMAND)
    assert proc.returncode == 0, proc.stderr
    script = target.read_text()
    assert srun_words(script)[-len(COMMAND):] == COMMAND
    assert "--container-mounts=/fsx:/fsx:ro" in srun_words(script)
    assert [p.name for p in tmp_path.iterdir()] == ["job.sbatch"]


def test_sbatch_attempts_option(tmp_path):
    """``--attempts`` reaches the script's requeue bound; the default is jobdef's (2)."""
    target = tmp_path / "job.sbatch"
    for args, bound in ((["--attempts", "4"], 4), ([], DEFAULT_ATTEMPTS)):
        target.unlink(missing_ok=True)
        proc = sbatch_cli(*PAIR, *args, "--output", str(target), command=COMMAND)
        assert proc.returncode == 0, proc.stderr
        assert f"max_attempts={bound}\n" in target.read_text()
    assert DEFAULT_ATTEMPTS == 2


@pytest.mark.parametrize(("args", "code", "words"), [
    (["--attempts", "0"], 2, "--attempts 0: expected a whole number from 1 to 10"),
    (["--attempts", "11"], 2, "--attempts 11: expected a whole number from 1 to 10"),
    (["--mount", "/fsx"], 2, "--mount '/fsx': expected HOST_PATH:CONTAINER_PATH[:ro]"),
    (["--mount", "/fsx,x:/fsx"], 2, "may not hold ',', ':'"),
    (["--launcher", "srun"], 2, "--launcher 'srun': no launcher of that name"),
    (["--stack", "cpu-mpi", "--launcher", "torchrun"], 1, "torchrun needs PyTorch"),
    (["--ranks", "ssh"], 2, "--ranks 'ssh': no rank starter of that name (rank starters: "
                            "mpirun, srun)"),
    (["--launcher", "torchrun", "--ranks", "mpirun"], 2, "--ranks mpirun: only for --launcher "
                                                         "mpirun"),
    # a plan the entrypoint would refuse under Slurm writes no script: deepspeed on a stack
    # without DeepSpeed
    (["--stack", "cpu-mpi", "--launcher", "deepspeed"], 1,
     "under Slurm: node 0 task 0: deepspeed not found"),
])
def test_sbatch_mistakes_are_one_line(tmp_path, args, code, words):
    target = tmp_path / "job.sbatch"
    target.write_text("old\n")
    pair = PAIR if "--stack" not in args else ["--nodes", "2", "--instance-type",
                                                "c5n.18xlarge", "--image-uri", IMAGE]
    line = one_line(sbatch_cli(*args, *pair, "--output", str(target), command=["true"]), code)
    assert words in line
    assert target.read_text() == "old\n"


# --- the directives against a real Slurm controller ----------------------------------------------

def _slurm_cluster_module():
    """tests/integration/slurm_cluster.py (the cluster the Slurm tests start), by path."""
    path = ROOT / "tests" / "integration" / "slurm_cluster.py"
    spec = importlib.util.spec_from_file_location("mnp_slurm_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instance_shaped(cluster, instance_type: str) -> None:
    """Configure the cluster's nodes with the instance's CPUs (and its GPUs through GRES over
    fake devices): slurmd takes the configured figures with config_overrides."""
    row = get_instance_type(instance_type)
    conf = (cluster.etc / "slurm.conf").read_text()
    conf = conf.replace("CPUs=2 ", f"CPUs={row.vcpus} ")
    (cluster.etc / "slurm.conf").write_text("SlurmdParameters=config_overrides\n" + conf)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize(("stack", "instance_type"), [("cuda11.7-efa", "p4d.24xlarge"),
                                                      ("cpu-tcp", "c5n.18xlarge")])
def test_slurm_accepts_the_directives(docker_client, cpu_tcp_image, tmp_path, stack,
                                      instance_type):
    slurm = _slurm_cluster_module()
    row = get_instance_type(instance_type)
    image = slurm.slurm_image(docker_client, cpu_tcp_image)
    cluster = slurm.SlurmCluster(docker_client, image, tmp_path / "cluster", nodes=2,
                                 gpus_per_node=row.gpus)
    try:
        instance_shaped(cluster, instance_type)
        cluster.start()
        cluster.wait_ready()
        for nodes in (2, 3):  # the cluster has 2 nodes: 3 must be refused by Slurm
            target = cluster.share / f"job-{nodes}.sbatch"
            proc = sbatch_cli("--stack", stack, "--nodes", str(nodes), "--instance-type",
                              instance_type, "--image-uri", IMAGE, "--output", str(target),
                              command=["python3", "train.py"])
            assert proc.returncode == 0, proc.stderr
            code, output = cluster.run(f"sbatch --test-only /share/{target.name}")
            if nodes == 2:
                assert code == 0 and "to start at" in output, output + cluster.logs()
            else:
                assert code != 0 and "Requested node configuration is not available" in output, \
                    output
    finally:
        cluster.cleanup()


@pytest.mark.parametrize("command,fix", [
    (["mpirun", "-np", "108", "python3", "train.py"], "--launcher mpirun --ranks mpirun"),
    (["deepspeed", "train.py"], "--launcher deepspeed (node 0 runs it over the job's own SSH"),
    (["torchrun", "--nproc_per_node", "8", "train.py"], "--launcher torchrun (every node"),
    (["horovodrun", "-np", "16", "python3", "train.py"], "--launcher mpirun --ranks mpirun")])
def test_launcher_none_refuses_a_launcher_command_on_several_nodes(command, fix):
    """Issue 32: the refusal of a pasted mpirun line used to suggest none, which ran three
    unwired mpiruns, one per node."""
    line = one_line(sbatch_cli("--stack", "cuda11.7-efa", "--nodes", "3", "--instance-type",
                               "p4d.24xlarge", "--image-uri", IMAGE, "--launcher", "none",
                               command=command), 2)
    assert line.startswith(f"error: --launcher none with a command that starts {command[0]} "
                           "itself: "
                           "under Slurm every task runs the command as is, so 3 nodes would "
                           f"each start {command[0]} alone"), line
    assert fix in line and "\n" not in line


def test_launcher_none_runs_a_program_in_every_task_and_a_launcher_on_one_node():
    script = sbatch("cpu-tcp", 3, "c5n.18xlarge", "--launcher", "none",
                    command=["python3", "t.py"])
    assert exports(script)["MNP_LAUNCHER"] == "none"
    one = sbatch("cpu-tcp", 1, "c5n.18xlarge", "--launcher", "none",
                 command=["mpirun", "python3", "t.py"])
    assert srun_words(one)[-3:] == ["mpirun", "python3", "t.py"]


def test_the_script_states_the_pyxis_it_needs():
    """Issue 32: --container-env needs pyxis >= 0.15.0, which the script says before its srun."""
    script = sbatch("cpu-tcp", 2, "c5n.18xlarge", "--launcher", "torchrun",
                    command=["python3", "t.py"])
    head = script.split("\nsrun ")[0]
    assert ("# Needs pyxis >= 0.15.0 (the first with --container-env: "
            "https://github.com/NVIDIA/pyxis/releases/tag/v0.15.0)") in head
    assert "--container-env=" in srun_line(script)
