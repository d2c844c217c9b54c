"""The ``MNP_HEALTH=full`` bandwidth probe: a separate program, one per node, run by the entrypoint
(``run.gate``) with the image's own Python and PyTorch once every node has joined.

    python3 bandwidth.py --master ADDR --port P --nodes N --node R --backend gloo|nccl
                         --link-mib M --allreduce-mib A --timeout S

Over the job's fabric (gloo over TCP on CPU nodes; NCCL on GPU nodes, one process per GPU):

1. each node sends ``M`` MiB to the next node of a ring and receives from the previous one, at
   once, then the same the other way round; every node times what it received (Gbit/s);
2. unless a link is already below the floor, every process of the job all-reduces ``A`` MiB of
   float32, timed; the bus bandwidth is nccl-tests' definition (algorithm bandwidth x
   2(n-1)/n, GB/s), so it compares with published nccl-tests figures;
3. the nodes' figures are gathered, and each node prints one line, ``MNP_BANDWIDTH <json>``:
   ``{"nodes": [{"node", "in_fwd", "in_rev"}, ...], "busbw": GB/s or null}``; the all-reduce
   is skipped (``null``) when a link already received less than ``--link-floor`` Gbit/s.

The entrypoint itself never imports PyTorch (it uses only the standard library): this program is
started as a child process, so the import happens only there, under ``MNP_HEALTH=full``.
"""

import argparse
import datetime
import importlib
import json
import sys
import time

MIB = 1 << 20


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--link-mib", type=int, default=64)
    parser.add_argument("--allreduce-mib", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--link-floor", type=float, default=1.0, help="Gbit/s")
    return parser.parse_args(argv)


def gbits(nbytes, seconds):
    return nbytes * 8 / max(seconds, 1e-9) / 1e9


def ring(torch, dist, args, leaders, rank, device, shift):
    """Send to the node ``shift`` places on, receive from the one ``shift`` places back; the
    Gbit/s received. Only the nodes' first processes (``leaders``) take part."""
    count = len(leaders)
    pos = leaders.index(rank)
    size = args.link_mib * MIB
    out = torch.ones(size // 4, dtype=torch.float32, device=device)
    into = torch.empty(size // 4, dtype=torch.float32, device=device)
    start = time.monotonic()
    sent = dist.isend(out, leaders[(pos + shift) % count])
    got = dist.irecv(into, leaders[(pos - shift) % count])
    got.wait()
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.monotonic() - start
    sent.wait()
    return gbits(size, seconds)


def allreduce(torch, dist, args, world, device):
    """The all-reduce's bus bandwidth in GB/s (one warm-up round, then one timed)."""
    size = args.allreduce_mib * MIB
    data = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(data[:1024])
    dist.barrier()
    start = time.monotonic()
    dist.all_reduce(data)
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.monotonic() - start
    return size / max(seconds, 1e-9) / 1e9 * 2 * (world - 1) / max(world, 1)


def gather(torch, dist, figures, device, world):
    """Every process's ``figures`` (four floats), in rank order."""
    mine = torch.tensor(figures, dtype=torch.float64, device=device)
    every = [torch.zeros(4, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(every, mine)
    return [[x.item() for x in t] for t in every]


def process(local, args, per_node):
    """One process of the probe: ``local`` is its GPU on this node (0 on CPU nodes)."""
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    rank, world = args.node * per_node + local, args.nodes * per_node
    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(local)
        device = "cuda:%d" % local
    dist.init_process_group(args.backend, init_method="tcp://%s:%d" % (args.master, args.port),
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    leaders = [node * per_node for node in range(args.nodes)]
    leader = rank in leaders
    figures = [float(args.node), 0.0, 0.0, 1.0 if leader else 0.0]
    for position, shift in ((1, 1), (2, -1)):
        dist.barrier()
        if leader and args.nodes > 1:
            figures[position] = ring(torch, dist, args, leaders, rank, device, shift)
    rows = [row for row in gather(torch, dist, figures, device, world) if row[3]]
    nodes = [{"node": int(row[0]), "in_fwd": row[1], "in_rev": row[2]} for row in rows]
    # a link already below the floor decides the verdict: no need to crawl through the
    # all-reduce over it (every process sees the same rows, so all skip or none)
    slow = args.nodes > 1 and min(min(r[1], r[2]) for r in rows) < args.link_floor
    busbw = None if slow else allreduce(torch, dist, args, world, device)
    if rank == leaders[args.node]:
        sys.stdout.write("MNP_BANDWIDTH %s\n" % json.dumps({"nodes": nodes, "busbw": busbw}))
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.backend == "nccl":
        torch = importlib.import_module("torch")
        per_node = torch.cuda.device_count()
        if per_node < 1:
            sys.stderr.write("no GPU visible for the NCCL probe\n")
            return 1
        spawn = importlib.import_module("torch.multiprocessing").spawn
        spawn(process, args=(args, per_node), nprocs=per_node)
    else:
        process(0, args, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
