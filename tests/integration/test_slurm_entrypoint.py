"""The entrypoint under a real Slurm 22.05 cluster (1 controller + 3 compute containers of the
cpu-tcp image with the test-only Slurm layer, ``slurm_cluster``): every job below is submitted
with ``srun``/``sbatch`` on the controller and runs ``mnp-entrypoint`` in the image as each task's
own command, as the scripts `invoke sbatch` writes for pyxis do (pyxis never runs the image's
ENTRYPOINT per task: test_slurm_pyxis.py). Nothing is simulated: the variables are Slurm's own.

The cluster tracks a step's processes by process group (``ProctrackType=proctrack/pgid``, not
the shared recipe's ``proctrack/linuxproc``), so that ``scancel`` observes the entrypoint itself:

- ``proctrack/linuxproc`` signals every descendant of slurmstepd: ``kill_proc_tree`` walks
  ``/proc`` from the step and ``kill()``s each process it finds, the ranks before their parent
  (https://github.com/SchedMD/slurm/blob/slurm-22-05-8-1/src/plugins/proctrack/linuxproc/kill_tree.c,
  ``_get_list`` and ``_kill_proclist``). A rank would see SIGTERM whether or not the entrypoint
  forwarded it, as it does under ``proctrack/cgroup``;
- ``proctrack/pgid`` signals the step's process group only: ``proctrack_p_signal`` is one
  ``killpg`` of the task's group (same tag, src/plugins/proctrack/pgid/proctrack_pgid.c). The
  entrypoint starts its command in a new session (``run/lifecycle.py``), so the only way a rank
  learns of ``scancel`` here is the entrypoint forwarding the signal.
"""

import re
import time

import pytest

from .slurm_cluster import SlurmCluster, slurm_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ALLREDUCE = """\
from mpi4py import MPI
c = MPI.COMM_WORLD
print("rank=%d size=%d sum=%d" % (c.Get_rank(), c.Get_size(), c.allreduce(c.Get_rank() + 1)))
"""
# One process per node under torchrun (gloo on CPU): every rank must see the whole world.
DDP = """\
import os, socket
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("ddp rank=%d world=%d sum=%g host=%s group_rank=%s" % (
    dist.get_rank(), dist.get_world_size(), t.item(), socket.gethostname(),
    os.environ.get("GROUP_RANK")), flush=True)
dist.destroy_process_group()
"""
# Waits to be stopped; on SIGTERM writes a marker naming its node and who sent the signal
# (its parent, the entrypoint, or another process), then exits 143. Its start marker says whether
# it runs in a process group of its own (out of reach of proctrack/pgid's killpg).
WAIT = """\
import os, signal, socket, sys, time
host = socket.gethostname()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
own_group = os.getpgid(0) != os.getpgid(os.getppid())
# written whole, then renamed: the test reads each marker as soon as it appears
open("/share/.started-%s" % host, "w").write("own-group" if own_group else "parent-group")
os.replace("/share/.started-%s" % host, "/share/started-%s" % host)
info = signal.sigtimedwait([signal.SIGTERM], 600)
if info is not None:
    sender = "parent" if info.si_pid == os.getppid() else "pid %d" % info.si_pid
    open("/share/term-%s" % host, "w").write("%d from %s" % (info.si_signo, sender))
    sys.exit(128 + info.si_signo)
"""


# Slurm's default MinJobAge (300 s) in this module's cluster, not the play's 4: the scancel test
# reads the cancelled job's state once the job has stopped. MinJobAge counts from the job's
# EndTime (SchedMD/slurm src/slurmctld/job_mgr.c at slurm-22-05-8-1, _list_find_job_old, lines
# 10083-10085), which scancel sets at once (_job_signal, lines 5848-5851: end_time = now, state
# CANCELLED|COMPLETING), while the job stays COMPLETING until its ranks have stopped. A stop
# slower than 4 s under load left the record to the next purge pass (every MAX(10, MinJobAge) s,
# slurm_cluster.py), which could fall between two polls: "Invalid job id". Measured here: EndTime
# is the scancel's second, CANCELLED 2.7 s later, the record gone 11.6 s after the scancel.
# 300 s outlasts the test's 60 s wait. "MinJobAge: The minimum age of a completed job before its
# record is cleared from the list of jobs slurmctld keeps in memory ... The default value is
# 300 seconds." (https://slurm.schedmd.com/slurm.conf.html#OPT_MinJobAge). Its cost: `sbatch
# --wait` polls at 2 s, then 8 s (slurm_cluster.py), a few seconds in the one test that uses it.
MIN_JOB_AGE_S = 300


@pytest.fixture(scope="module")
def slurm(docker_client, cluster_image, tmp_path_factory):
    image = slurm_image(docker_client, cluster_image)
    cluster = SlurmCluster(docker_client, image, tmp_path_factory.mktemp("slurm-ep"))
    conf = cluster.etc / "slurm.conf"
    text = conf.read_text()
    # proctrack/pgid: see the module's doc (only the entrypoint reaches a rank)
    for old, new in (("proctrack/linuxproc", "proctrack/pgid"),
                     ("\nMinJobAge=4\n", f"\nMinJobAge={MIN_JOB_AGE_S}\n")):
        assert old in text, f"the play's slurm.conf has no {old.strip()!r} any more"
        text = text.replace(old, new)
    conf.write_text(text)
    try:
        cluster.start()
        cluster.wait_ready()
        for name, text in (("allreduce.py", ALLREDUCE), ("ddp.py", DDP), ("wait.py", WAIT)):
            (cluster.share / name).write_text(text)
        yield cluster
    finally:
        cluster.cleanup()


def results(output, word="rank="):
    """The result lines, without mpirun's ``--tag-output`` prefix, sorted."""
    return sorted(re.sub(r"^\[\d+,\d+\]<stdout>:", "", line) for line in output.splitlines()
                  if word in line and "mnp-entrypoint" not in line)


def submitted(output):
    return re.search(r"Submitted batch job (\d+)", output).group(1)


def test_srun_mpi_pmix_runs_an_allreduce_through_the_entrypoint_as_ranks(slurm):
    code, output = slurm.run("srun -N3 --mpi=pmix mnp-entrypoint python3 /share/allreduce.py")
    assert code == 0, output + slurm.logs()
    assert results(output) == ["rank=0 size=3 sum=6", "rank=1 size=3 sum=6",
                               "rank=2 size=3 sum=6"], output
    # each task is a rank: the entrypoint ran the command itself, no mpirun nested in it
    assert output.count("scheduler: rank (detected from PMIX_RANK)") == 3, output
    assert output.count("running: python3 /share/allreduce.py") == 3, output
    assert "running: mpirun" not in output, output


def test_the_dry_run_under_srun_names_slurm_and_each_nodes_rank(slurm):
    code, output = slurm.run("MNP_DRY_RUN=1 srun -N3 --ntasks-per-node=1 mnp-entrypoint "
                             "python3 train.py")
    assert code == 0, output
    assert output.count("scheduler: slurm (detected from SLURM_JOB_ID)") == 3, output
    for rank in range(3):
        assert f"--nnodes 3 --node_rank {rank} --nproc_per_node 1 --master_addr node1 " \
               "--master_port 29500 train.py" in output, output


def test_sbatch_script_runs_mpirun_inside_the_allocation_through_the_entrypoint(slurm):
    code, output = slurm.run("sbatch --wait -N3 -o /share/sbatch-%j.out --wrap "
                             "'mnp-entrypoint python3 /share/allreduce.py'", timeout=180)
    assert code == 0, output + slurm.logs()
    log = (slurm.share / f"sbatch-{submitted(output)}.out").read_text()
    assert results(log) == ["rank=0 size=3 sum=6", "rank=1 size=3 sum=6",
                            "rank=2 size=3 sum=6"], log
    assert "role: launcher (starts the job on 3 node(s))" in log, log
    command = [line for line in log.splitlines() if "running: " in line][0]
    assert "mpirun" in command and "-np 3" in command and "--hostfile" not in command, command
    assert "-x SLURM_" not in command  # each rank keeps its own node's Slurm variables


def test_torchrun_across_three_nodes_from_slurms_variables(slurm):
    started = time.monotonic()
    code, output = slurm.run("srun -N3 --ntasks-per-node=1 mnp-entrypoint python3 /share/ddp.py",
                             timeout=300)
    assert code == 0, output + slurm.logs()
    lines = results(output, "ddp rank=")
    assert [line.split(" host=")[0] for line in lines] == [
        "ddp rank=0 world=3 sum=6", "ddp rank=1 world=3 sum=6", "ddp rank=2 world=3 sum=6"], output
    # node ranks follow SLURM_NODEID: node1 is node 0, where the master store lives
    assert "ddp rank=0 world=3 sum=6 host=node1 group_rank=0" in lines, lines
    assert output.count("--master_addr node1 --master_port 29500") == 3, output
    print(f"torchrun 3 nodes via srun: {time.monotonic() - started:.1f}s")


def _job_state(slurm, job):
    code, output = slurm.run(f"scontrol show job {job}")
    match = re.search(r"JobState=(\S+)", output)
    return match.group(1) if match else output


def test_scancel_stops_every_rank_and_the_job_is_cancelled(slurm):
    for path in slurm.share.glob("term-*"):
        path.unlink()
    for path in slurm.share.glob("started-*"):
        path.unlink()
    code, output = slurm.run("MNP_LAUNCHER=none sbatch -N3 -o /share/cancel-%j.out --wrap "
                             "'srun --ntasks-per-node=1 mnp-entrypoint python3 /share/wait.py'")
    assert code == 0, output
    job = submitted(output)
    deadline = time.monotonic() + 90
    while len(list(slurm.share.glob("started-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(list(slurm.share.glob("started-*"))) == 3, slurm.logs()
    # each rank is out of reach of Slurm's killpg: only a forwarded signal can stop it
    assert {p.read_text() for p in slurm.share.glob("started-*")} == {"own-group"}
    code, output = slurm.run(f"scancel {job}")
    assert code == 0, output
    deadline = time.monotonic() + 60
    # the job's record stays MIN_JOB_AGE_S after the scancel, longer than this wait
    while (state := _job_state(slurm, job)) not in ("CANCELLED", "FAILED", "COMPLETED") and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    assert state == "CANCELLED", state
    # every rank got SIGTERM from its parent, the entrypoint, and wrote its marker
    assert sorted(p.name for p in slurm.share.glob("term-*")) == [
        "term-node1", "term-node2", "term-node3"], slurm.logs()
    assert {p.read_text() for p in slurm.share.glob("term-*")} == {"15 from parent"}
    for container in slurm.containers[1:]:  # the compute nodes: nothing of the job is left
        procs = container.exec_run(["ps", "-eo", "args"]).output.decode()
        assert "wait.py" not in procs and "mnp-entrypoint" not in procs, procs


@pytest.mark.parametrize("launch,failing", [
    ("srun -N3 --mpi=pmix", "PMIX_RANK"),
    ("MNP_LAUNCHER=none srun -N3 --ntasks-per-node=1", "SLURM_NODEID"),
])
def test_a_failing_ranks_exit_status_reaches_srun(slurm, launch, failing):
    script = f"import os, sys; sys.exit(7 if os.environ['{failing}'] == '1' else 0)"
    code, output = slurm.run(f'{launch} mnp-entrypoint python3 -c "{script}"')
    assert code == 7, output
    # srun's own message says "exit code 7" too: these are the entrypoints' last lines, one per
    # task ("exit N (class on node I): reason")
    ours = sorted(re.findall(r"^mnp-entrypoint\[[^\]]*\]: exit (\d+) \(", output, re.M))
    assert ours == ["0", "0", "7"], output
