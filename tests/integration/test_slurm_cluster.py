"""A real Slurm 22.05 cluster (Debian's slurm-wlm and munge) in containers of the cpu-tcp image:
1 controller + 3 compute nodes, started for these tests and removed after them.

These are the grounds for the entrypoint's Slurm tests: tasks run inside the real image with
the variables Slurm really sets (``srun`` direct launch, ``--mpi=pmix``).
"""

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


def test_srun_mpi_pmix_runs_an_mpi4py_allreduce_in_the_image(slurm):
    code, output = slurm.run(f'srun -N3 --mpi=pmix python3 -c "{ALLREDUCE}"')
    assert code == 0, output + slurm.logs()
    lines = sorted(line for line in output.splitlines() if line.startswith("rank="))
    assert lines == ["rank=0 size=3 sum=6", "rank=1 size=3 sum=6", "rank=2 size=3 sum=6"], output
