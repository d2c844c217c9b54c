"""Elastic torchrun through the entrypoint across 3 containers of the cpu-tcp image: the c10d
rendezvous (no server) and a real etcd (Debian's etcd-server 3.4 with ``--enable-v2=true``, in a
container of a test-only layer that also adds python-etcd). One node is killed mid-run and
started again; the job goes on within its restart budget and finishes from its checkpoint.

The workers' environment is what TorchElastic's users (and an elastic PyTorchJob) give torchrun:
``PET_RDZV_ENDPOINT``, ``PET_RDZV_BACKEND``, ``PET_NNODES``, ``PET_RDZV_ID``,
``PET_MAX_RESTARTS`` (torch/distributed/run.py declares these options with argparse_util.py's
``env`` action, which reads ``PET_<OPTION>``; not every option has it). The entrypoint turns
them into torchrun's command line and clears them.
"""

import re
import time

import pytest

from .pods import ETCD_LAYER, Pods, layer_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]

STEPS = 24  # 12 s of steps: the kill lands well before the end even on a loaded machine
KILL_AFTER = 4  # steps done before the test kills node 2
ELASTIC = f"""\
import os, socket, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt = "/share/step"
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print("start step=%d rank=%d world=%d restart=%s host=%s" % (
    start, rank, world, os.environ.get("TORCHELASTIC_RESTART_COUNT"), socket.gethostname()),
    flush=True)
for step in range(start, {STEPS}):
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    assert t.item() == world, t
    if rank == 0:  # the checkpoint: the next step to run
        with open(ckpt + ".tmp", "w") as out:
            out.write(str(step + 1))
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.5)
print("done rank=%d world=%d host=%s" % (rank, world, socket.gethostname()), flush=True)
# As PyTorch's distributed docs (Shutdown) ask: a gloo process group left to interpreter
# exit can abort the rank with 'terminate called without an active exception'
# (pytorch/pytorch#190489), failing a job that trained.
dist.destroy_process_group()
"""
ETCD_ARGS = ["etcd", "--name", "etcd-service", "--data-dir", "/tmp/etcd", "--enable-v2=true",
             "--listen-client-urls", "http://0.0.0.0:2379",
             "--advertise-client-urls", "http://etcd-service:2379",
             "--listen-peer-urls", "http://0.0.0.0:2380",
             "--initial-advertise-peer-urls", "http://etcd-service:2380",
             "--initial-cluster", "etcd-service=http://etcd-service:2380"]


@pytest.fixture
def pods(docker_client, cluster_image, tmp_path):
    image = layer_image(docker_client, cluster_image, ETCD_LAYER, "etcd")
    share = tmp_path / "share"
    share.mkdir()
    (share / "elastic.py").write_text(ELASTIC)
    group = Pods(docker_client, image, share)
    try:
        yield group
    finally:
        group.cleanup()


def _step(pods):
    path = pods.share / "step"
    return int(path.read_text() or 0) if path.exists() else 0


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_elastic_torchrun_survives_a_node_killed_and_restarted(pods, backend):
    started = time.monotonic()
    if backend == "etcd":
        pods.pod("etcd-service", ETCD_ARGS, {}, entrypoint=[])
        endpoint = "etcd-service:2379"
    else:
        endpoint = "peer-0:29400"  # peer-0's torchrun agent hosts the c10d store
    env = {"PET_RDZV_ENDPOINT": endpoint, "PET_RDZV_BACKEND": backend, "PET_NNODES": "3:3",
           "PET_RDZV_ID": f"elastic-{backend}", "PET_MAX_RESTARTS": "3",
           "MNP_SLOTS_PER_NODE": "1"}
    _start_peers_past_the_kill_step(pods, env)
    victim = pods.containers["peer-2"]
    victim.kill()
    killed_at = _step(pods)
    time.sleep(1)
    victim.start()  # the same pod again: its entrypoint and torchrun join the next round
    codes = {name: pods.wait_exit(name, 300) for name in ("peer-0", "peer-1", "peer-2")}
    logs = pods.logs()
    assert codes == {"peer-0": 0, "peer-1": 0, "peer-2": 0}, logs
    assert _step(pods) == STEPS and killed_at < STEPS
    # the entrypoint wrote torchrun's elastic line from PET_* and cleared them
    assert logs.count(f"--rdzv_backend {backend} --rdzv_endpoint {endpoint} --rdzv_id "
                      f"elastic-{backend} --max_restarts 3") >= 4, logs
    assert "cleared PET_MAX_RESTARTS, PET_NNODES, PET_RDZV_BACKEND" in logs
    # the survivors restarted their workers (restart 1) and resumed from the checkpoint
    resumed = [m for m in re.findall(r"start step=(\d+) rank=\d+ world=3 restart=(\d+)", logs)
               if int(m[0]) > 0]
    assert resumed and all(int(step) >= KILL_AFTER for step, _ in resumed), logs
    assert any(restart != "0" for _, restart in resumed), logs
    assert len(re.findall(r"done rank=\d world=3", logs)) == 3, logs
    print(f"elastic {backend}: killed after step {killed_at}, finished in "
          f"{time.monotonic() - started:.1f}s")


def _start_peers_past_the_kill_step(pods, env):
    """Three peers running elastic.py with ``env``, once they have trained KILL_AFTER steps."""
    for i in range(3):
        pods.pod(f"peer-{i}", ["python3", "/share/elastic.py"], env)
    deadline = time.monotonic() + 240
    while _step(pods) < KILL_AFTER:
        assert time.monotonic() < deadline, pods.logs()
        time.sleep(0.2)


def test_elastic_torchrun_scales_down_to_min_when_a_node_is_lost(pods):
    """``invoke k8s --elastic 2:3`` writes MIN < MAX: a node lost for good leaves a smaller job
    that goes on. torchrun's next rendezvous round closes with the 2 survivors (MIN reached; the
    round waits its last-call time for a third that never comes) and they finish the steps from
    the checkpoint in a world of 2."""
    started = time.monotonic()
    env = {"PET_RDZV_ENDPOINT": "peer-0:29400", "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "2:3",
           "PET_RDZV_ID": "elastic-down", "PET_MAX_RESTARTS": "3", "MNP_SLOTS_PER_NODE": "1"}
    _start_peers_past_the_kill_step(pods, env)
    pods.containers["peer-2"].kill()  # not started again
    killed_at = _step(pods)
    codes = {name: pods.wait_exit(name, 300) for name in ("peer-0", "peer-1")}
    logs = pods.logs()
    assert codes == {"peer-0": 0, "peer-1": 0}, logs
    assert _step(pods) == STEPS and killed_at < STEPS
    # the entrypoint passed the range on: torchrun's own --nnodes MIN:MAX
    assert logs.count("--nnodes 2:3") >= 3, logs
    assert re.search(r"start step=0 rank=\d+ world=3 ", logs), logs  # began with 3 nodes
    resumed = [int(step) for step in re.findall(r"start step=(\d+) rank=\d+ world=2 ", logs)]
    assert len(resumed) >= 2 and all(step >= KILL_AFTER for step in resumed), logs
    assert len(re.findall(r"done rank=\d world=2", logs)) == 2, logs
    print(f"elastic scale-down: node 2 lost after step {killed_at}, finished with 2 in "
          f"{time.monotonic() - started:.1f}s")
