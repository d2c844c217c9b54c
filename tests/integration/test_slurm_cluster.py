"""A real Slurm 22.05 cluster (Debian's slurm-wlm and munge) in containers of the cpu-tcp image:
1 controller + 3 compute nodes, started for these tests and removed after them.

These are the grounds for the entrypoint's Slurm tests: tasks run inside the real image with
the variables Slurm really sets (``srun`` direct launch, ``--mpi=pmix``).
"""

import json
import re
import warnings

import pytest

from .slurm_cluster import SlurmCluster, slurm_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ALLREDUCE = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
             "print('rank=%d size=%d sum=%d' % (c.Get_rank(), c.Get_size(), "
             "c.allreduce(c.Get_rank() + 1)))")


@pytest.fixture(scope="module")
def slurm(docker_client, cluster_image, tmp_path_factory):
    image = slurm_image(docker_client, cluster_image)
    cluster = SlurmCluster(docker_client, image, tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        cluster.ready_s = cluster.wait_ready()
        yield cluster
    finally:
        cluster.cleanup()


def test_srun_runs_one_task_on_each_of_three_nodes(slurm):
    code, output = slurm.run("srun -N3 hostname")
    assert code == 0, output + slurm.logs()
    assert sorted(output.split()) == ["node1", "node2", "node3"]


def test_srun_tasks_see_the_step_variables_the_adapter_reads(slurm):
    code, output = slurm.run("srun -N3 --ntasks-per-node=1 sh -c "
                             "'echo $SLURMD_NODENAME $SLURM_NODEID $SLURM_STEP_NODELIST "
                             "$SLURM_STEP_NUM_NODES $SLURM_STEP_TASKS_PER_NODE'")
    assert code == 0, output
    assert sorted(output.splitlines()) == ["node1 0 node[1-3] 3 1(x3)", "node2 1 node[1-3] 3 1(x3)",
                                           "node3 2 node[1-3] 3 1(x3)"]


# Open MPI's own report of a signal in a rank (opal/util/stacktrace.c prints it).
OMPI_CRASH = "*** Process received signal ***"


def test_srun_mpi_pmix_runs_an_mpi4py_allreduce_in_the_image(slurm):
    """Once in about twenty full runs (2026-11-28), rank 0 segfaulted inside Debian's Open MPI
    4.1.4 at a null address before any peer connected, and the other ranks then waited in the
    allreduce until the step's time limit. The cause is not known; the step takes about 1.5 s.
    So: a 30 s limit, and one more step only after a crash Open MPI itself reports, said in the
    run's warnings. Any other failure, or a second crash, fails."""
    command = f'srun -N3 --mpi=pmix python3 -c "{ALLREDUCE}"'
    code, output = slurm.run(command, timeout=30)
    if code != 0 and OMPI_CRASH in output:
        warnings.warn(f"srun --mpi=pmix: a rank crashed in Open MPI, stepping again: {output}",
                      stacklevel=1)
        code, output = slurm.run(command, timeout=30)
    assert code == 0, output + slurm.logs()
    lines = sorted(line for line in output.splitlines() if line.startswith("rank="))
    assert lines == ["rank=0 size=3 sum=6", "rank=1 size=3 sum=6", "rank=2 size=3 sum=6"], output


# The adapter as the image holds it, on the variables this real cluster sets.
TABLE = """\
import json, os, sys
sys.path.insert(0, "/opt/mnp/lib")
from entrypoint import schedulers
print(json.dumps(schedulers.choose(os.environ).to_dict(), sort_keys=True))
"""
JOB = """\
#!/bin/sh
python3 /share/table.py > /share/batch-$SLURM_JOB_ID.json
srun -N2 -n2 -r1 python3 /share/table.py > /share/step-$SLURM_JOB_ID.json
"""


def tables(output):
    return sorted((json.loads(line) for line in output.splitlines() if line.startswith("{")),
                  key=lambda t: (t["node_rank"] is None, t["node_rank"] or 0,
                                 json.dumps(t["extra"], sort_keys=True)))


def test_the_slurm_adapter_reads_a_real_srun_step(slurm):
    (slurm.share / "table.py").write_text(TABLE)
    code, output = slurm.run("srun -N3 python3 /share/table.py")
    assert code == 0, output
    found = tables(output)
    assert [(t["scheduler"], t["role"], t["node_rank"], t["num_nodes"]) for t in found] == [
        ("slurm", "main", 0, 3), ("slurm", "child", 1, 3), ("slurm", "child", 2, 3)]
    for t in found:
        assert t["hosts"] == ["node1", "node2", "node3"] and t["main_address"] == "node1"
        assert t["extra"]["this node"] == t["hosts"][t["node_rank"]]  # SLURMD_NODENAME agrees
        assert t["slots"] == [1, 1, 1] and t["rendezvous"] is False


def test_the_batch_script_is_the_launcher_and_a_partial_step_counts_from_its_first_node(slurm):
    (slurm.share / "table.py").write_text(TABLE)
    (slurm.share / "job.sh").write_text(JOB)
    code, output = slurm.run("sbatch --wait -N3 --ntasks-per-node=2 -o /share/job-%j.out "
                             "/share/job.sh")
    assert code == 0, output + slurm.logs()
    job = re.search(r"Submitted batch job (\d+)", output).group(1)
    script = json.loads((slurm.share / f"batch-{job}.json").read_text())
    assert (script["role"], script["node_rank"], script["main_address"]) == ("launcher", 0,
                                                                             "node1")
    assert script["slots"] == [2, 2, 2] and "batch script" in script["extra"]["launch"]
    # srun -N2 -r1 inside the job: nodes 2 and 3; SLURM_NODEID counts within the step
    step = tables((slurm.share / f"step-{job}.json").read_text())
    assert [(t["role"], t["node_rank"], t["extra"]["this node"]) for t in step] == [
        ("main", 0, "node2"), ("child", 1, "node3")]
    assert step[0]["hosts"] == ["node2", "node3"] and step[0]["main_address"] == "node2"


def test_an_srun_mpi_pmix_task_is_a_rank(slurm):
    (slurm.share / "table.py").write_text(TABLE)
    code, output = slurm.run("srun -N3 --mpi=pmix python3 /share/table.py")
    assert code == 0, output
    found = tables(output)
    assert [(t["scheduler"], t["detected_from"], t["role"]) for t in found] == [
        ("rank", "PMIX_RANK", "rank")] * 3
    assert sorted(t["extra"]["rank"] for t in found) == ["0 (PMIX_RANK)", "1 (PMIX_RANK)",
                                                         "2 (PMIX_RANK)"]


def test_mpirun_inside_sbatch_reaches_every_node_without_ssh_or_hostfile(slurm):
    """Open MPI reads the allocation (ras slurm) and starts its daemons with srun (plm slurm):
    the path the entrypoint will take for a batch script."""
    (slurm.share / "allreduce.py").write_text(ALLREDUCE.replace("; ", "\n"))
    code, output = slurm.run("sbatch --wait -N3 -o /share/mpirun-%j.out --wrap "
                             "'mpirun --allow-run-as-root python3 /share/allreduce.py'")
    assert code == 0, output + slurm.logs()
    job = re.search(r"Submitted batch job (\d+)", output).group(1)
    lines = sorted(line for line in (slurm.share / f"mpirun-{job}.out").read_text().splitlines()
                   if line.startswith("rank="))
    assert lines == ["rank=0 size=3 sum=6", "rank=1 size=3 sum=6", "rank=2 size=3 sum=6"]


def test_fake_gpus_reach_the_tasks_and_the_adapter(docker_client, cluster_image, tmp_path):
    """A second cluster with GRES over fake /dev/nvidia0-1: Slurm hands each task its GPUs."""
    image = slurm_image(docker_client, cluster_image)
    cluster = SlurmCluster(docker_client, image, tmp_path, nodes=2, gpus_per_node=2)
    try:
        cluster.start()
        cluster.wait_ready()
        (cluster.share / "table.py").write_text(TABLE)
        code, output = cluster.run("srun -N2 --gpus-per-node=2 sh -c "
                                   "'echo gpus $SLURM_GPUS_ON_NODE $CUDA_VISIBLE_DEVICES; "
                                   "python3 /share/table.py'")
        assert code == 0, output + cluster.logs()
        assert sorted(line for line in output.splitlines() if line.startswith("gpus")) == [
            "gpus 2 0,1", "gpus 2 0,1"]
        assert [t["extra"]["gpus on node"] for t in tables(output)] == ["2", "2"]
        # the entrypoint's plan on those nodes: torchrun starts one process per GPU Slurm gave
        code, output = cluster.run("MNP_DRY_RUN=1 srun -N2 --ntasks-per-node=1 "
                                   "--gpus-per-node=2 mnp-entrypoint python3 train.py")
        assert code == 0, output
        for rank in (0, 1):
            assert f"--nnodes 2 --node_rank {rank} --nproc_per_node 2 --master_addr node1 " \
                   in output, output
    finally:
        cluster.cleanup()
