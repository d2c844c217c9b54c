"""PyTorch layer: version equals the matrix; a 2-process gloo allreduce in one container."""

import json

ALLREDUCE = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29511", rank=rank, world_size=2)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print(rank, float(t[0]), flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
"""

RANK = """
import os
with open("/tmp/ranks/" + os.environ["RANK"], "w") as out:
    out.write("rank %s of %s\\n" % (os.environ["RANK"], os.environ["WORLD_SIZE"]))
"""


# What one import of torch reports, per host (the layer's container): three tests read it, and
# each import is seconds of CPU (a CUDA wheel's, about five). Kept here, not in a fixture: a
# layer test's dry run (tests/layer_dry_run.py) sets fixtures up without a container.
_FACTS: dict[int, dict] = {}
FACTS = """
import json, torch, torch.distributed as d
nccl = list(torch.cuda.nccl.version()) if torch.version.cuda else None
print(json.dumps({"version": torch.__version__, "distributed": d.is_available(),
                  "gloo": d.is_available() and d.is_gloo_available(),
                  "cuda": torch.version.cuda, "nccl": nccl}))
"""


def _facts(host):
    if id(host) not in _FACTS:
        host.run(f"cat > /tmp/torch_facts.py <<'PY'\n{FACTS}\nPY")
        out = host.check_output("python3 /tmp/torch_facts.py")
        _FACTS[id(host)] = json.loads(out.splitlines()[-1])
    return _FACTS[id(host)]


def test_version(host, layer):
    expected = layer["spec"].get("options", {}).get("reported_version", layer["version"])
    assert _facts(host)["version"].split("+")[0] == expected


def test_gloo_available(host):
    assert (_facts(host)["distributed"], _facts(host)["gloo"]) == (True, True)


def test_two_process_gloo_allreduce(host):
    host.run(f"cat > /tmp/allreduce.py <<'PY'\n{ALLREDUCE}\nPY")
    out = host.run("timeout 120 python3 /tmp/allreduce.py")
    assert out.rc == 0, out.stderr
    assert sorted(out.stdout.strip().splitlines()) == ["0 3.0", "1 3.0"]


def test_torchrun_runs_two_workers(host):
    # torchrun is how multi-node jobs start; its default arguments must parse on this Python.
    # Each worker writes its own file: the two workers' stdout interleaves under load, so the
    # test reads per-rank files instead of parsing shared output (deterministic, same check).
    host.run(f"rm -rf /tmp/ranks && mkdir -p /tmp/ranks && cat > /tmp/rank.py <<'PY'\n{RANK}\nPY")
    out = host.run("timeout 120 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "
                   "/tmp/rank.py")
    assert out.rc == 0, out.stderr[-2000:]
    assert host.check_output("ls /tmp/ranks").split() == ["0", "1"]
    assert host.check_output("cat /tmp/ranks/0 /tmp/ranks/1").splitlines() == \
        ["rank 0 of 2", "rank 1 of 2"]


def test_cuda_build_loads_its_pinned_nccl(host, layer):
    """A CUDA wheel's torch loads the NCCL its nvidia-nccl-* pin names (no GPU needed)."""
    pins = layer["spec"].get("pip", {})
    nccl = next((pin["version"] for name, pin in pins.items() if name.startswith("nvidia-nccl")),
                None)
    if nccl is None:
        return  # CPU or statically linked builds
    facts = _facts(host)
    assert ".".join(map(str, facts["nccl"] or [])) == nccl
    assert facts["cuda"] == layer["spec"]["options"]["cuda"]
