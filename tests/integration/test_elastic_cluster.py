"""Elastic torchrun through the entrypoint across 2 containers of the cpu-tcp image: the c10d
rendezvous (no server) and a real etcd (Debian's etcd-server 3.4 with ``--enable-v2=true``, in a
container of a test-only layer that also adds python-etcd). One node is killed mid-run and
started again; the job goes on within its restart budget and finishes from its checkpoint.

Two peers, not three: what is checked (the entrypoint's torchrun line from ``PET_*``, a killed
peer that joins the next round, a survivor that restarts its worker from the checkpoint, a
round that closes at MIN) needs one survivor and one lost node. Every peer's agent and every
worker start imports torch (about 3 s of CPU each here, a third of it in torch 1.13's elastic
loggers, which call ``inspect.stack()``); a third peer cost about 9 s of CPU per test.

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
KILL_AFTER = 4  # steps done before the test kills node 1
PEERS = ("peer-0", "peer-1")
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
    env = {"PET_RDZV_ENDPOINT": endpoint, "PET_RDZV_BACKEND": backend, "PET_NNODES": "2:2",
           "PET_RDZV_ID": f"elastic-{backend}", "PET_MAX_RESTARTS": "3",
           "MNP_SLOTS_PER_NODE": "1"}
    _start_peers_past_the_kill_step(pods, env)
    victim = pods.containers["peer-1"]
    victim.kill()
    killed_at = _step(pods)
    time.sleep(1)
    victim.start()  # the same pod again: its entrypoint and torchrun join the next round
    codes = {name: pods.wait_exit(name, 300) for name in PEERS}
    logs = pods.logs()
    assert codes == dict.fromkeys(PEERS, 0), logs
    assert _step(pods) == STEPS and killed_at < STEPS
    # the entrypoint wrote torchrun's elastic line from PET_* and cleared them
    assert logs.count(f"--rdzv_backend {backend} --rdzv_endpoint {endpoint} --rdzv_id "
                      f"elastic-{backend} --max_restarts 3") >= 3, logs  # each peer, the victim twice
    assert "cleared PET_MAX_RESTARTS, PET_NNODES, PET_RDZV_BACKEND" in logs
    # the survivor restarted its worker (restart 1) and resumed from the checkpoint
    resumed = [m for m in re.findall(r"start step=(\d+) rank=\d+ world=2 restart=(\d+)", logs)
               if int(m[0]) > 0]
    assert resumed and all(int(step) >= KILL_AFTER for step, _ in resumed), logs
    assert any(restart != "0" for _, restart in resumed), logs
    assert len(re.findall(r"done rank=\d world=2", logs)) == 2, logs
    print(f"elastic {backend}: killed after step {killed_at}, finished in "
          f"{time.monotonic() - started:.1f}s")


def _start_peers_past_the_kill_step(pods, env):
    """The peers running elastic.py with ``env``, once they have trained KILL_AFTER steps."""
    for name in PEERS:
        pods.pod(name, ["python3", "/share/elastic.py"], env)
    deadline = time.monotonic() + 240
    while _step(pods) < KILL_AFTER:
        assert time.monotonic() < deadline, pods.logs()
        time.sleep(0.2)


def test_elastic_torchrun_scales_down_to_min_when_a_node_is_lost(pods):
    """``invoke k8s --elastic 1:2`` writes MIN < MAX: a node lost for good leaves a smaller job
    that goes on. torchrun's next rendezvous round closes with the survivor (MIN reached; the
    round waits its last-call time for a second that never comes) and it finishes the steps from
    the checkpoint in a world of 1."""
    started = time.monotonic()
    env = {"PET_RDZV_ENDPOINT": "peer-0:29400", "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "1:2",
           "PET_RDZV_ID": "elastic-down", "PET_MAX_RESTARTS": "3", "MNP_SLOTS_PER_NODE": "1"}
    _start_peers_past_the_kill_step(pods, env)
    pods.containers["peer-1"].kill()  # not started again
    killed_at = _step(pods)
    codes = {"peer-0": pods.wait_exit("peer-0", 300)}
    logs = pods.logs()
    assert codes == {"peer-0": 0}, logs
    assert _step(pods) == STEPS and killed_at < STEPS
    # the entrypoint passed the range on: torchrun's own --nnodes MIN:MAX
    assert logs.count("--nnodes 1:2") >= 2, logs
    assert re.search(r"start step=0 rank=\d+ world=2 ", logs), logs  # began with 2 nodes
    resumed = [int(step) for step in re.findall(r"start step=(\d+) rank=\d+ world=1 ", logs)]
    assert resumed and all(step >= KILL_AFTER for step in resumed), logs
    assert len(re.findall(r"done rank=\d world=1", logs)) == 1, logs
    print(f"elastic scale-down: node 1 lost after step {killed_at}, finished with 1 in "
          f"{time.monotonic() - started:.1f}s")
