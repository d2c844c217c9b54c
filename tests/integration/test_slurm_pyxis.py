"""The scripts `invoke sbatch` writes, run on a real Slurm 22.05 cluster (``slurm_cluster``)
through the pyxis play (``pyxis_play.py``): each node's container started once per step the way
pyxis' ``enroot_container_start`` starts it, every task joined to it with pyxis' environment
rules, the task's own command (``mnp-entrypoint CMD``) run there; and the script's requeue of
an infrastructure failure (not of the user's own), with Slurm's real ``scontrol requeue``.

The play stands in for pyxis and enroot, which cannot be built here (no Debian package, and no
way to fetch their sources); what it does and does not do is in its docstring, each behaviour
with the pyxis or enroot source it follows.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from matrix.jobs.sbatch import ENTRYPOINT, REQUEUE_EXIT_CODES, enroot_image
from tests.helpers import written

from .slurm_cluster import USER, SlurmCluster, image_config, slurm_image
from .test_deepspeed_cluster import RESULT_RE, TRAIN  # the same user's training script
from .test_slurm_entrypoint import ALLREDUCE  # the same MPI job

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DDP = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("ddp rank=%d world=%d sum=%g" % (dist.get_rank(), dist.get_world_size(), t.item()),
      flush=True)
dist.destroy_process_group()
"""
# Each MPI rank's world, user and host: what a user's job must see under mpirun from node 0.
WHOAMI = """\
import os, socket
from mpi4py import MPI
c = MPI.COMM_WORLD
print("rank=%d size=%d sum=%d uid=%d host=%s" % (c.Get_rank(), c.Get_size(),
      c.allreduce(c.Get_rank() + 1), os.getuid(), socket.gethostname()), flush=True)
"""
# enroot binds the host's /dev/shm into every container (NVIDIA/enroot conf/mounts/10-system.fstab
# line 7 at 102be94b), and a host's /dev/shm is a tmpfs of half its memory unless sized otherwise
# (tmpfs(5) "size"): 96 GiB on the c5n.18xlarge these scripts name. The play's nodes get the
# 4 GiB the entrypoint's health gate asks of that row (entrypoint/probe/health.py PROMISES).
HOST_SHM = "4g"
# an image whose ENTRYPOINT runs its arguments (env execs them): pyxis' entrypoint path works
PLAIN = "localhost#plain:latest"
DERIVED = "localhost:5000/team/derived@sha256:" + "d" * 64


@contextlib.contextmanager
def pyxis_cluster(docker_client, cluster_image, workdir, extra_images=None, **options):
    """A 3-node cluster with the pyxis play that knows the stack image under the reference a
    generated script gives it (``uri``/``ref``/``config`` on the cluster), plus ``extra_images``
    (enroot reference -> config, from the stack's config)."""
    config = image_config(docker_client, cluster_image)
    digest = docker_client.images.get(cluster_image).id  # sha256:<hex>, like a registry digest
    uri = f"localhost:5000/mnp-stacks@{digest}"
    images = {enroot_image(uri): config, **(extra_images(config) if extra_images else {})}
    cluster = SlurmCluster(docker_client, slurm_image(docker_client, cluster_image), workdir,
                           pyxis_images=images, start_timeout=25, shm_size=HOST_SHM, **options)
    try:
        cluster.start()
        cluster.wait_ready()
        cluster.uri, cluster.ref, cluster.config = uri, enroot_image(uri), config
        yield cluster
    finally:
        cluster.cleanup()


def _controls(config):
    """An image built FROM the stack whose ENV sets one of the job's settings, and a plain image
    whose ENTRYPOINT runs its arguments (the entrypoint path's control)."""
    return {enroot_image(DERIVED): {**config, "Env": [*config["Env"], "MNP_LAUNCHER=none"]},
            PLAIN: {"Env": config["Env"], "Entrypoint": ["/usr/bin/env"], "Cmd": None}}


@pytest.fixture(scope="module")
def play(docker_client, cluster_image, tmp_path_factory):
    with pyxis_cluster(docker_client, cluster_image, tmp_path_factory.mktemp("slurm-pyxis"),
                       _controls, requeue_wait_s=10) as cluster:
        (cluster.share / "allreduce.py").write_text(ALLREDUCE)
        (cluster.share / "ddp.py").write_text(DDP)
        yield cluster


@pytest.fixture(scope="module")
def user_play(docker_client, cluster_image, tmp_path_factory):
    """The same cluster for a user who is not root, as on ParallelCluster: pyxis runs the tasks
    as the submitting user (enroot keeps no superuser, ENROOT_ALLOW_SUPERUSER no in NVIDIA/enroot
    conf/enroot.conf.in at 7886acaf), whose /run is the container's own tmpfs."""
    with pyxis_cluster(docker_client, cluster_image,
                       tmp_path_factory.mktemp("slurm-pyxis-user"), user_run=True) as cluster:
        cluster.share.chmod(0o777)  # the user's job writes its output there
        (cluster.share / "whoami.py").write_text(WHOAMI)
        yield cluster


def test_the_images_entrypoint_is_the_one_the_generator_names(play):
    assert play.config["Entrypoint"] == [ENTRYPOINT]


def test_each_nodes_container_starts_once_and_every_task_joins_it(play):
    code, output = play.run(f"srun -N3 --ntasks-per-node=2 --container-image={play.ref} "
                            "--no-container-entrypoint sh -c 'echo task $SLURMD_NODENAME "
                            "$SLURM_PROCID $PWD'")
    assert code == 0, output + play.logs()
    tasks = sorted(line for line in output.splitlines() if line.startswith("task "))
    assert tasks == [f"task node{1 + rank // 2} {rank} /" for rank in range(6)], output
    assert len(re.findall(r"pyxis: starting container: pyxis_\d+\.0", output)) == 3, output


def test_the_images_env_wins_over_the_jobs_unless_named_in_container_env(play):
    name, image_value = next(item.split("=", 1) for item in play.config["Env"]
                             if not item.startswith("PATH="))
    probe = f"sh -c 'echo value=${name} lang=${{LANG-unset}} path=$PATH'"
    job = f"{name}=from-job LANG=C.job PATH=/job/bin:$PATH"
    code, output = play.run(f"{job} srun -N1 --container-image={play.ref} {probe}")
    assert code == 0, output
    image_path = next(item for item in play.config["Env"] if item.startswith("PATH="))[5:]
    assert f"value={image_value} lang=unset path={image_path}" in output, output
    code, output = play.run(f"{job} srun -N1 --container-image={play.ref} "
                            f"--container-env={name},LANG {probe}")
    assert code == 0, output
    assert f"value=from-job lang=C.job path={image_path}" in output, output


def test_an_entrypoint_run_at_container_start_stops_the_step(play):
    """--container-entrypoint runs mnp-entrypoint once, at the container's start, with the
    image's environment only: it never stops itself, so pyxis would wait for ever."""
    code, output = play.run(f"srun -N1 --container-image={play.ref} --container-entrypoint "
                            "echo never", timeout=120)
    assert code != 0 and "never" not in output.replace("echo never", ""), output
    assert "did not stop itself" in output and "couldn't start container" in output, output
    # the entrypoint ran there, saw no Slurm variable, planned a single node and runs pyxis'
    # self-stopping shell as its child: the child stops, the entrypoint waits on it
    assert "mnp-entrypoint[single]: single node" in output, output
    assert "running: sh -c 'kill -STOP $$ ; exit 0'" in output, output
    # the play's entrypoint path itself works with an entrypoint that runs its arguments
    code, output = play.run(f"srun -N2 --container-image={PLAIN} --container-entrypoint "
                            "echo started")
    assert code == 0 and output.count("started") == 2, output


def sbatch_cli(play, target: str, *args: str, command: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "sbatch", "--stack", "cpu-tcp", "--nodes", "3",
         "--instance-type", "c5n.18xlarge", "--image-uri", play.uri, *args,
         "--output", str(play.share / target), "--", *command],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 0, proc.stderr


def generated(uri: str, *options: str, command: list[str], slots: int | None = None,
              nodes: int = 3) -> str:
    """The script ``invoke sbatch --stack cpu-tcp --nodes NODES --instance-type c5n.18xlarge
    --image-uri URI OPTIONS -- COMMAND`` writes (tests.helpers.written: the task's own steps, in
    this process), with ``slots`` ranks a node where given: the play's nodes have 2 CPUs where
    the instance's row has 36, and no option of the task sets MNP_SLOTS_PER_NODE."""
    return written("sbatch", "--stack", "cpu-tcp", "--nodes", str(nodes), "--instance-type",
                   "c5n.18xlarge", "--image-uri", uri, *options, command=command,
                   settings={"MNP_SLOTS_PER_NODE": str(slots)} if slots else None)


def submit(play, script: str, *options: str, timeout: float = 240, user: str = "root") -> str:
    """``sbatch --wait`` from /share as ``user`` (the script's --output is relative to it); the
    job's log."""
    code, output = play.run(f"cd /share && sbatch --wait {' '.join(options)} {script}",
                            timeout=timeout, user=user)
    job = re.search(r"Submitted batch job (\d+)", output)
    log = (play.share / f"mnp-cpu-tcp-{job.group(1)}.out").read_text() if job else ""
    assert code == 0, output + log + play.logs()
    return log


def results(log: str, word: str) -> list[str]:
    """The lines that start with ``word``, without mpirun's ``--tag-output`` prefix, sorted."""
    lines = (re.sub(r"^\[\d+,\d+\]<stdout>:", "", line) for line in log.splitlines())
    return sorted(line for line in lines if line.startswith(word))


def test_a_generated_mpirun_script_runs_srun_pmix_ranks_through_pyxis(play):
    sbatch_cli(play, "mpi.sbatch", command=["python3", "/share/allreduce.py"])
    text = (play.share / "mpi.sbatch").read_text()
    assert "--container-entrypoint" not in text.replace("--no-container-entrypoint", "")
    # the directives ask for the instance's 36 ranks per node; these nodes have 2 CPUs
    log = submit(play, "mpi.sbatch", "--ntasks-per-node=2")
    assert results(log, "rank=") == [f"rank={r} size=6 sum=21" for r in range(6)], log
    assert log.count("scheduler: rank (detected from PMIX_RANK)") == 6, log
    assert len(re.findall(r"pyxis: starting container: pyxis_\d+\.0", log)) == 3, log


def test_a_generated_script_runs_mpirun_inside_the_allocation_through_pyxis(play):
    """``--ranks mpirun``: one task per node, the entrypoints wire the step's nodes themselves
    (the container has no srun for Open MPI's daemons) and node 0 runs mpirun over the job's own
    SSH. Submitted as on a site whose MpiDefault is pmix (``SLURM_MPI_TYPE``, srun's variable for
    ``--mpi``): the script's ``--mpi=none`` keeps each task from being taken for one rank."""
    script = generated(play.uri, "--launcher", "mpirun", "--ranks", "mpirun",
                       command=["python3", "/share/allreduce.py"], slots=2)
    (play.share / "mpirun.sbatch").write_text(script)
    log = submit(play, "mpirun.sbatch", "--export=ALL,SLURM_MPI_TYPE=pmix", timeout=400)
    assert results(log, "rank=") == [f"rank={r} size=6 sum=21" for r in range(6)], log
    assert log.count("scheduler: slurm (detected from SLURM_JOB_ID); nodes wired by the "
                     "entrypoint: MNP_LAUNCHER=mpirun needs SSH between the nodes") == 3, log
    assert "PMIX_RANK" not in log and "secret NOT SET" not in log, log
    (command,) = [line for line in log.splitlines() if "running: " in line]
    assert "mpirun" in command and "-np 6" in command and "--hostfile" in command, command
    assert len(re.findall(r"pyxis: starting container: pyxis_\d+\.0", log)) == 3, log


def test_a_users_mpirun_script_runs_through_pyxis_without_root(user_play):
    """Submitted by a user who is not root: every node's entrypoint runs as that user, its sshd
    on 2222 admits only that user, and the ranks run as that user on all three nodes."""
    script = generated(user_play.uri, "--launcher", "mpirun", "--ranks", "mpirun",
                       command=["python3", "/share/whoami.py"], slots=1)
    (user_play.share / "user.sbatch").write_text(script)
    log = submit(user_play, "user.sbatch", timeout=300, user=USER)
    assert results(log, "rank=") == [f"rank={r} size=3 sum=6 uid=1000 host=node{r + 1}"
                                     for r in range(3)], log
    assert "--allow-run-as-root" not in log and "Accepted publickey for mnpuser" in log, log
    # a cluster's home is the user's own and shared: the job writes no ~/.ssh/config there
    assert ".ssh/config" not in log, log


def test_a_generated_deepspeed_script_trains_on_two_nodes_through_pyxis(play):
    """``invoke sbatch --launcher deepspeed``: a user's ``deepspeed.initialize`` script, one task
    per node; node 0's DeepSpeed runner (pdsh) reaches the other node over the entrypoints' own
    SSH, and the ranks train as data-parallel SGD on both nodes' data must. Two of the play's
    three nodes: each node's DeepSpeed launcher and rank import deepspeed (about 4 s of CPU each
    here), and the other tests here run the step's host list on three."""
    (play.share / "ds_train.py").write_text(TRAIN)
    script = generated(play.uri, "--launcher", "deepspeed",
                       command=["python3", "/share/ds_train.py"], slots=1, nodes=2)
    (play.share / "ds.sbatch").write_text(script)
    log = submit(play, "ds.sbatch", timeout=500)
    found = {}
    for match in RESULT_RE.finditer(log):
        result = json.loads(match.group(1))
        found[result["rank"]] = result
    assert sorted(found) == [0, 1], log[-6000:]
    assert {r["host"] for r in found.values()} == {"node1", "node2"}, found
    for result in found.values():
        assert result["world"] == 2 and result["steps"] == 2, result
        assert result["max_diff_to_reference"] < 1e-5, result
    assert len({r["checksum"] for r in found.values()}) == 1, found
    assert "--launcher pdsh" in log and "secret NOT SET" not in log, log[-6000:]


def test_a_generated_torchrun_script_runs_one_task_per_node_through_pyxis(play):
    """In an image whose ENV says MNP_LAUNCHER=none: the job's setting must still win."""
    # one process per node on these 2-CPU nodes (the instance's default is one per core)
    script = generated(DERIVED, "--launcher", "torchrun", command=["python3", "/share/ddp.py"],
                       slots=1)
    (play.share / "ddp.sbatch").write_text(script)
    log = submit(play, "ddp.sbatch", timeout=400)
    assert results(log, "ddp rank=") == [f"ddp rank={r} world=3 sum=6" for r in range(3)], log
    assert log.count("scheduler: slurm (detected from SLURM_JOB_ID)") == 3, log
    assert log.count("--master_addr node1 --master_port 29500") == 3, log
    assert log.count("launcher: torchrun") == 3, log


def job_record(output: str) -> dict[str, str]:
    """The JobState, Restarts and ExitCode that `scontrol show job` printed in ``output``."""
    return dict(re.findall(r"(JobState|Restarts|ExitCode)=(\S+)", output))


def test_the_play_keeps_a_finished_jobs_record_for_four_seconds(play):
    """slurmctld raises a MinJobAge below 2 to 2 without a word; the play's 4 is what runs."""
    code, output = play.run("scontrol show config")
    assert code == 0, output
    assert re.search(r"^MinJobAge\s*=\s*4 sec$", output, re.M), output


@pytest.mark.parametrize(("name", "script", "ends"), [
    # the infrastructure code on the first run only: requeued once, then it succeeds
    ("flaky", f"import os, sys; sys.exit({REQUEUE_EXIT_CODES[0]} if 'SLURM_RESTART_COUNT' not in "
              "os.environ else 0)", {"JobState": "COMPLETED", "Restarts": "1", "ExitCode": "0:0"}),
    # the user's own failure: a new allocation would fail the same way, so no requeue
    ("bug", "import sys; sys.exit(3)", {"JobState": "FAILED", "Restarts": "0",
                                        "ExitCode": "3:0"}),
])
def test_a_generated_script_requeues_an_infrastructure_failure_and_not_a_users(
        play, name, script, ends):
    text = generated(play.uri, "--launcher", "none", command=["python3", "-c", script])
    (play.share / f"{name}.sbatch").write_text(text)
    # the record is read in the same shell, as soon as sbatch returns (MinJobAge=4 in the play)
    code, output = play.run(f"cd /share && out=$(sbatch --wait {name}.sbatch); code=$?; "
                            'echo "$out"; scontrol show job "${out##* }"; exit $code', timeout=300)
    job = re.search(r"Submitted batch job (\d+)", output).group(1)
    log = (play.share / f"mnp-cpu-tcp-{job}.out").read_text()
    assert job_record(output) == ends, output + log
    assert code == int(ends["ExitCode"].split(":")[0]), output + log
    requeues = log.count(f"ended with the infrastructure exit code {REQUEUE_EXIT_CODES[0]}: "
                         f"requeueing job {job}")
    assert requeues == int(ends["Restarts"]), log
