"""Issue 16, High 2 across real containers (``cpu-tcp``): a user's DeepSpeed training script,
started by the entrypoint's deepspeed launcher unit on Batch-MNP nodes, through DeepSpeed's pdsh
runner on two nodes and through its openmpi runner on three; and on one node (a single container,
two ranks), where DeepSpeed's runner used to stop at its SSH check of the hostfile's only host.
The openmpi runner writes its own host list from the hostfile, so it gets more than one remote
node; pdsh's fan-out to two remote nodes is test_attribution_rehearsed.py's DeepSpeed job. Each
node runs DeepSpeed's per-node launcher and a rank, each importing deepspeed (about 4 s of CPU
here): a third pdsh node cost 12 s of CPU.

The script is what a user writes: ``deepspeed.init_distributed(dist_backend="gloo")`` first,
then ``deepspeed.initialize(model=..., optimizer=...)`` and two training steps on its own data.
Every rank then checks the result against plain PyTorch: the same model trained for two steps
by SGD on the gradient of all ranks' data together, which is what data-parallel training
must give. Ranks report their world size, losses and a parameter checksum; the test asserts
one rank on each container, the same parameters everywhere, and the match.

The same jobs hold issue 12's points about DeepSpeed's runners: its openmpi runner
puts ``--mca btl ^openib --mca btl_tcp_if_include eth0`` on its own mpirun line, and ours used to
be added again (exit 1, "listed multiple times"); and ranks started over SSH (pdsh or mpirun) do
not inherit the container's environment, so each must still see the job's variables that only
the entrypoint forwards (``JOB_ONLY_VAR``, and the credentials id ECS issues per node, which
must be its own node's: ``test_launchers_cluster.job_env``).
"""

import json
import re

import pytest

from .test_entrypoint_cluster import FAST
from .test_launchers_cluster import job_env, node_env

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TRAIN = r'''
import json, os, socket, torch, deepspeed
import torch.distributed as dist
deepspeed.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

def batch(r, step):
    g = torch.Generator().manual_seed(1000 * r + step)  # each rank its own data
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)

model = make_model()
engine, _, _, _ = deepspeed.initialize(
    model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    config={"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1})
losses = []
for step in range(2):
    x, y = batch(rank, step)
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
got = torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])

# Plain PyTorch on all ranks' data at once: the mean of the ranks' mean losses.
ref = make_model()
sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(2):
    sgd.zero_grad()
    loss = sum(torch.nn.functional.mse_loss(ref(x), y)
               for x, y in (batch(r, step) for r in range(world))) / world
    loss.backward()
    sgd.step()
want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
moved = float((got - torch.cat([p.detach().reshape(-1) for p in make_model().parameters()]))
              .abs().max())
print("RESULT " + json.dumps({
    "rank": rank, "world": world, "steps": engine.global_steps, "losses": losses,
    "checksum": float(got.double().sum()), "max_diff_to_reference": float((got - want).abs().max()),
    "moved": moved, "host": socket.gethostname(),
    "job_var": os.environ.get("JOB_ONLY_VAR", "MISSING"),
    "creds": os.environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "MISSING")}), flush=True)
# As PyTorch's distributed docs (Shutdown) ask: a gloo process group left to interpreter
# exit can abort the rank with 'terminate called without an active exception'
# (pytorch/pytorch#190489), failing a job that trained.
dist.destroy_process_group()
'''
# No nested objects in a result: two ranks' lines that mpirun's output forwarding runs together
# still part at the right brace.
RESULT_RE = re.compile(r"RESULT (\{[^{}]*\})")


@pytest.fixture
def scripts(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    return {str(tmp_path): "/opt/mnp-test"}


def run_job(cluster, scripts, env, num_nodes=3, timeout=600):
    """Main first, then the children, each with its own node's credentials id; returns the main
    node's log once all exited 0, and each container's node index by its host name."""
    command = ["python3", "/opt/mnp-test/train.py"]
    main = cluster.node(0, num_nodes, command, mounts=scripts, **node_env(env, 0))
    children = [cluster.node(i, num_nodes, command, main_ip=cluster.ip(main), mounts=scripts,
                             **node_env(env, i)) for i in range(1, num_nodes)]
    code = cluster.wait_exit(main, timeout)
    log = cluster.logs(main)
    assert code == 0, log[-6000:]
    for child in children:
        assert cluster.wait_exit(child, 60) == 0, cluster.logs(child)[-3000:]
    return log, {c.id[:12]: index for index, c in enumerate([main] + children)}


def results(log):
    found = {}
    for match in RESULT_RE.finditer(log):
        result = json.loads(match.group(1))
        found[result["rank"]] = result
    return found


@pytest.mark.parametrize(("runner", "nodes"), [("pdsh", 2), ("openmpi", 3)])
def test_deepspeed_initialize_trains_two_steps_on_several_nodes(cluster, scripts, runner, nodes):
    env = job_env(MNP_LAUNCHER="deepspeed", MNP_DEEPSPEED_LAUNCHER=runner)
    log, hosts = run_job(cluster, scripts, env, num_nodes=nodes)
    assert f"--launcher {runner}" in log
    assert "listed multiple times" not in log
    assert "Unable to JIT load" not in log
    found = results(log)
    for rank in sorted(found):  # shown with -s: the figures a reviewer reads
        print(runner, json.dumps(found[rank]))
    assert sorted(found) == list(range(nodes)), log[-6000:]
    for result in found.values():
        assert result["world"] == nodes and result["steps"] == 2, result
        assert result["moved"] > 1e-3, result  # the steps changed the parameters
        # data-parallel SGD on every rank's data, to float32 rounding
        assert result["max_diff_to_reference"] < 1e-5, result
        assert result["job_var"] == env["JOB_ONLY_VAR"], result
        # the credentials id of the node the rank runs on, not the main node's
        assert result["creds"] == env["CREDS_BASE"] + str(hosts[result["host"]]), result
    assert len({r["checksum"] for r in found.values()}) == 1, found  # same parameters everywhere
    assert len({tuple(r["losses"]) for r in found.values()}) == nodes, found  # its own data
    assert {r["host"] for r in found.values()} == set(hosts)  # a rank on each node


def test_deepspeed_initialize_trains_on_one_node(cluster, scripts):
    """A single container (no Batch variables), two ranks: DeepSpeed's runner starts them
    locally; the entrypoint passes --no_ssh_check (it runs no sshd on a single node)."""
    container = cluster.client.containers.run(
        cluster.image, ["python3", "/opt/mnp-test/train.py"], detach=True,
        name=cluster.prefix + "-single", labels={"mnp-test": "1"}, shm_size="256m",
        environment=dict(FAST, MNP_LAUNCHER="deepspeed", MNP_SLOTS_PER_NODE="2"),
        volumes={path: {"bind": bind, "mode": "ro"} for path, bind in scripts.items()})
    cluster.containers.append(container)  # removed by the fixture
    code = cluster.wait_exit(container, 600)
    log = cluster.logs(container)
    assert code == 0, log[-6000:]
    assert "--no_ssh_check" in log
    found = results(log)
    assert sorted(found) == [0, 1], log[-6000:]
    for result in found.values():
        assert result["world"] == 2 and result["steps"] == 2, result
        assert result["moved"] > 1e-3 and result["max_diff_to_reference"] < 1e-5, result
    assert len({r["checksum"] for r in found.values()}) == 1, found
