"""The entrypoint across real containers: each node a container with the Batch MNP variables on a
private Docker network, running the ``cpu-tcp`` image (fixture ``cluster_image``).

Covered: a 3-node job (children started in reverse order, one late) running a real allreduce over
every rank with mpirun (mpi4py) and with torchrun (gloo); a child that never comes; a child
restarted during the rendezvous; a child killed mid-run; SIGTERM to the main node; the main node
vanishing; a registration with the wrong secret.
"""

import re
import time

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SECRET = "integration-test-secret"
FAST = {"MNP_SECRET": SECRET, "MNP_HEARTBEAT_TIMEOUT": "6", "MNP_WAIT_TIMEOUT": "120"}
# seconds from SIGTERM to the main node's exit when the signal is forwarded (measured: a few;
# the slack is for a loaded engine, still far below MNP_STOP_TIMEOUT's escalation)
FORWARDED_STOP_LIMIT = 25

MPI_ALLREDUCE = """
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
assert total == size * (size + 1) // 2, total
print("ALLREDUCE rank=%d size=%d sum=%d host=%s" % (rank, size, total, MPI.Get_processor_name()),
      flush=True)
"""

MPI_LONG = """
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
print("STARTED rank=%d" % comm.Get_rank(), flush=True)
for _ in range(240):
    time.sleep(0.5)
comm.Barrier()
"""

TORCH_ALLREDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert int(t.item()) == size * (size + 1) // 2, t
print("ALLREDUCE rank=%d size=%d sum=%d" % (rank, size, int(t.item())), flush=True)
dist.destroy_process_group()
"""


def py(code):
    return ["python3", "-c", code]


def allreduce_lines(log):
    """The ranks' ALLREDUCE lines, not the logged command."""
    return [line for line in log.splitlines() if re.search(r"ALLREDUCE rank=\d", line)]


def start_job(cluster, command, num_nodes=3, late=(), late_delay=3.0, **env):
    """Main first (as Batch does), then children in reverse index order; ``late`` ones after a
    delay. Returns ``(main, {index: container})``."""
    settings = dict(FAST, **env)
    main = cluster.node(0, num_nodes, command, **settings)
    main_ip = cluster.ip(main)
    children = {}
    for index in range(num_nodes - 1, 0, -1):
        if index in late:
            continue
        children[index] = cluster.node(index, num_nodes, command, main_ip=main_ip, **settings)
    if late:
        time.sleep(late_delay)
        for index in sorted(late, reverse=True):
            children[index] = cluster.node(index, num_nodes, command, main_ip=main_ip,
                                           **settings)
    return main, children


def hostfile_lines(log):
    lines = []
    grab = False
    for line in log.splitlines():
        if "registered; hostfile" in line:
            grab = True
            continue
        if grab:
            if "]:   " not in line:
                break
            lines.append(line.split("]:   ", 1)[1].strip())
    return lines


def test_mpirun_allreduce_across_three_nodes(cluster):
    main, children = start_job(cluster, py(MPI_ALLREDUCE), late=(1,), MNP_SLOTS_PER_NODE=2)
    code = cluster.wait_exit(main, 180)
    log = cluster.logs(main)
    assert code == 0, log
    ranks = sorted(int(line.split("rank=")[1].split()[0]) for line in allreduce_lines(log))
    assert ranks == list(range(6)), log
    assert "size=6 sum=21" in log
    ips = [cluster.ip(main), cluster.ip(children[1]), cluster.ip(children[2])]
    assert hostfile_lines(log) == [f"{ip} slots=2" for ip in ips]
    assert "-np 6" in log and "--allow-run-as-root" in log
    # issue 43: the ranks' lines as they wrote them (--tag-output only with MNP_TAG_OUTPUT=1)
    assert "--tag-output" not in log and "<stdout>:" not in log
    hosts = {line.split("host=")[1] for line in allreduce_lines(log)}
    assert len(hosts) == 3
    for child in children.values():
        assert cluster.wait_exit(child, 30) == 0, cluster.logs(child)


def test_torchrun_allreduce_across_three_nodes(cluster):
    main, children = start_job(cluster, py(TORCH_ALLREDUCE), late=(1,), MNP_LAUNCHER="torchrun")
    code = cluster.wait_exit(main, 240)
    assert code == 0, cluster.logs(main)
    seen = {}
    for index, container in [(0, main)] + sorted(children.items()):
        assert cluster.wait_exit(container, 60) == 0, cluster.logs(container)
        log = cluster.logs(container)
        assert f"--node_rank {index}" in log
        for line in log.splitlines():
            if line.startswith("ALLREDUCE"):
                seen[int(line.split("rank=")[1].split()[0])] = line
    assert sorted(seen) == [0, 1, 2], seen
    assert all("size=3 sum=6" in line for line in seen.values())


def test_a_child_that_never_comes(cluster):
    # long enough that node 1, started just after node 0, registers on a loaded engine
    settings = dict(FAST, MNP_WAIT_TIMEOUT=20)
    main = cluster.node(0, 3, py(MPI_ALLREDUCE), **settings)
    child1 = cluster.node(1, 3, py(MPI_ALLREDUCE), main_ip=cluster.ip(main), **settings)
    start = time.time()
    code = cluster.wait_exit(main, 60)
    log = cluster.logs(main)
    assert code == 200, log  # infrastructure: the retry rules replace the host
    assert "node(s) 2 never registered" in log
    assert time.time() - start < 60
    assert cluster.wait_exit(child1, 30) == 0
    assert "job ended" in cluster.logs(child1)


def test_a_child_restarted_during_rendezvous(cluster):
    command = py(MPI_ALLREDUCE)
    main = cluster.node(0, 3, command, **FAST)
    main_ip = cluster.ip(main)
    first = cluster.node(2, 3, command, main_ip=main_ip, name="2-first", **FAST)
    cluster.wait_log(main, "node 2 ready", 60)
    # the "restarted" container registers while the old one still looks alive
    second = cluster.node(2, 3, command, main_ip=main_ip, name="2-second", **FAST)
    cluster.wait_log(main, "node 2 registered again", 60)
    first_ip = cluster.ip(first)
    # the replaced one is dropped by the main node and stops by itself
    assert cluster.wait_exit(first, 30) != 0
    assert "lost the main node" in cluster.logs(first)
    child1 = cluster.node(1, 3, command, main_ip=main_ip, **FAST)
    code = cluster.wait_exit(main, 180)
    log = cluster.logs(main)
    assert code == 0, log
    assert hostfile_lines(log) == [f"{cluster.ip(c)} slots=1" for c in (main, child1, second)]
    assert cluster.ip(second) != first_ip  # node 2's line is the new container's
    assert len(allreduce_lines(log)) == 3


def test_a_child_killed_mid_run(cluster):
    main, children = start_job(cluster, py(MPI_LONG))
    cluster.wait_log(main, "STARTED rank=2", 120)
    children[2].kill()
    start = time.time()
    code = cluster.wait_exit(main, 60)
    log = cluster.logs(main)
    assert code == 200, log  # a peer lost mid-run: infrastructure
    assert time.time() - start < 45
    assert "node 2 lost" in log, log
    # child 1 is told the job ended with the main node's failure and stops cleanly (its own
    # part did not fail: Batch reads the job's result from the main node)
    assert cluster.wait_exit(children[1], 45) == 0, cluster.logs(children[1])
    assert f"the main node reports the job ended (exit code {code})" in \
        cluster.logs(children[1]), cluster.logs(children[1])


def test_sigterm_to_the_main_node(cluster):
    """docker stop / Batch's termination sends SIGTERM to the main node's PID 1 only. The
    entrypoint forwards it to mpirun, which stops every rank: the job ends in seconds. The
    fall-back (SIGKILL to the launcher's group after MNP_STOP_TIMEOUT) is set out of reach, so
    only forwarding can end it within the limit."""
    main, children = start_job(cluster, py(MPI_LONG), MNP_STOP_TIMEOUT=600)
    cluster.wait_log(main, "STARTED rank=2", 120)
    start = time.time()
    main.kill(signal="SIGTERM")
    code = cluster.wait_exit(main, FORWARDED_STOP_LIMIT)
    log = cluster.logs(main)
    assert code == 143, log
    assert time.time() - start < FORWARDED_STOP_LIMIT
    assert re.search(r"launcher exited with \d+", log), log
    assert "killing" not in log, log  # no escalation: mpirun ended on the forwarded SIGTERM
    for index, child in children.items():  # told the job ended; their sshd stopped with them
        assert cluster.wait_exit(child, 30) == 0, cluster.logs(child)
        assert "the main node reports the job ended (exit code 143)" in cluster.logs(child), index


def test_children_exit_when_the_main_node_vanishes(cluster):
    main, children = start_job(cluster, py(MPI_LONG), MNP_HEARTBEAT_TIMEOUT=15)
    cluster.wait_log(main, "STARTED rank=2", 120)
    main.kill()  # SIGKILL: no goodbye
    start = time.time()
    for child in children.values():  # heartbeat timeout (15 s) plus a loaded engine's stop
        assert cluster.wait_exit(child, 45) != 0
    assert time.time() - start < 45
    assert "lost the main node" in cluster.logs(children[1])


def test_a_registration_with_the_wrong_secret_is_rejected(cluster):
    command = py(MPI_ALLREDUCE)
    main = cluster.node(0, 2, command, **FAST)
    main_ip = cluster.ip(main)
    intruder = cluster.node(1, 2, command, main_ip=main_ip, name="intruder",
                            **dict(FAST, MNP_SECRET="not-the-secret"))
    assert cluster.wait_exit(intruder, 60) == 2  # configuration: never retried
    assert "MNP_SECRET" in cluster.logs(intruder)
    log = cluster.wait_log(main, "rejected registration", 30)
    assert "authentication failed" in log
    child = cluster.node(1, 2, command, main_ip=main_ip, **FAST)
    code = cluster.wait_exit(main, 120)
    log = cluster.logs(main)
    assert code == 0, log
    assert hostfile_lines(log) == [f"{cluster.ip(main)} slots=1", f"{cluster.ip(child)} slots=1"]
