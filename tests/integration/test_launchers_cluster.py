"""Issue 12 across real containers (``cpu-tcp``): a user's ``--mca`` that replaces ours, and the
job's environment on every rank. DeepSpeed's two multi-node runners are held to the same points
by the training jobs of test_deepspeed_cluster.py (one three-node job per runner serves both).

Every rank runs ``report.py`` (mounted read-only at ``/opt/mnp-test``): an all-reduce over all
ranks (mpi4py under mpirun; gloo under torchrun) and one ``REPORT`` line with its rank, the sum,
and what it sees of two variables that exist only in the job's environment, as a job definition
would set them on every node: ``JOB_ONLY_VAR``, and a fake
``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` that differs per node, as ECS issues it per task. Ranks
that mpirun starts over SSH do not inherit the container's environment, so only what the entrypoint
forwards reaches them; each must see its own node's credentials id.
"""

import re
import uuid

import pytest

from .test_entrypoint_cluster import FAST

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPORT = r'''
import os, socket, sys
mode = [a for a in sys.argv[1:] if not a.startswith("--")][0]
if mode == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    total = comm.allreduce(rank + 1, op=MPI.SUM)
else:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    total = int(t.item())
    dist.destroy_process_group()
assert total == size * (size + 1) // 2, total
print("REPORT rank=%d size=%d sum=%d job_var=%s creds=%s host=%s" % (
    rank, size, total, os.environ.get("JOB_ONLY_VAR", "MISSING"),
    os.environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "MISSING"),
    socket.gethostname()), flush=True)
'''
# host=[0-9a-f]+: ranks print through mpirun at once, and one rank's line can arrive glued to
# the next rank's "REPORT ..." without a newline; a hex container name stops before it
REPORT_RE = re.compile(r"REPORT rank=(\d+) size=(\d+) sum=(\d+) job_var=(\S+) creds=(\S+) "
                       r"host=([0-9a-f]+)")


@pytest.fixture
def scripts(tmp_path):
    (tmp_path / "report.py").write_text(REPORT)
    return {str(tmp_path): "/opt/mnp-test"}


def job_env(**extra):
    env = dict(FAST, JOB_ONLY_VAR="set-in-the-job-definition-" + uuid.uuid4().hex[:6],
               CREDS_BASE=f"/v2/credentials/fake-{uuid.uuid4().hex[:8]}-node-",
               AWS_REGION="eu-west-1")
    env.update(extra)
    return env


def node_env(env, index):
    """What ECS gives each node's task: its own credentials id."""
    return dict(env, AWS_CONTAINER_CREDENTIALS_RELATIVE_URI=env["CREDS_BASE"] + str(index))


def run_job(cluster, scripts, mode, env, num_nodes=3, timeout=300):
    """Main first, then the children in reverse order; returns ``(main, children)`` once every
    container has exited (each with exit code 0)."""
    command = ["python3", "/opt/mnp-test/report.py", mode]
    main = cluster.node(0, num_nodes, command, mounts=scripts, **node_env(env, 0))
    children = [cluster.node(i, num_nodes, command, main_ip=cluster.ip(main), mounts=scripts,
                             **node_env(env, i)) for i in range(num_nodes - 1, 0, -1)]
    env["HOSTS"] = {c.id[:12]: i for i, c in [(0, main)] + [
        (num_nodes - 1 - k, c) for k, c in enumerate(children)]}
    code = cluster.wait_exit(main, timeout)
    assert code == 0, cluster.logs(main)
    for child in children:
        assert cluster.wait_exit(child, 60) == 0, cluster.logs(child)
    return main, children


def reports(*logs):
    found = {}
    for log in logs:
        for match in REPORT_RE.finditer(log):
            found[int(match.group(1))] = match.groups()[1:]
    return found


def check_every_rank(found, size, env):
    assert sorted(found) == list(range(size)), found
    total = size * (size + 1) // 2
    for rank, (got_size, got_sum, job_var, creds, host) in found.items():
        assert (int(got_size), int(got_sum)) == (size, total), (rank, found[rank])
        assert job_var == env["JOB_ONLY_VAR"], (rank, found[rank])
        # the fake task-role credentials id of the node the rank runs on, not the main node's
        assert creds == env["CREDS_BASE"] + str(env["HOSTS"][host]), (rank, found[rank])
    assert len({v[4] for v in found.values()}) == 3  # the ranks ran on three containers


def test_mpirun_with_the_users_mca_btl(cluster, scripts):
    """Issue 12, Medium 3: the user's --mca btl replaces ours instead of being listed twice."""
    env = job_env(MNP_LAUNCHER_ARGS="--mca btl tcp,self")
    main, _ = run_job(cluster, scripts, "mpi", env)
    log = cluster.logs(main)
    assert "listed multiple times" not in log
    assert "btl=tcp,self from MNP_LAUNCHER_ARGS (ours: ^openib)" in log
    running = [line for line in log.splitlines() if "running: " in line][0]
    assert "-mca" not in running.split() and "--mca" not in running.split()
    check_every_rank(reports(log), 3, env)


def test_torchrun_ranks_see_the_job_environment(cluster, scripts):
    """Issue 12, Medium 4 under torchrun: every node's torchrun starts from its own node's
    environment, so the job's variables are there on every rank."""
    env = job_env(MNP_LAUNCHER="torchrun")
    main, children = run_job(cluster, scripts, "torch", env)
    found = reports(cluster.logs(main), *(cluster.logs(c) for c in children))
    check_every_rank(found, 3, env)
