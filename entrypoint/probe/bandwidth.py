"""The ``MNP_HEALTH=full`` bandwidth probe: a separate program, one per node, run by the entrypoint
(``run.gate``) with the image's own Python and PyTorch once every node has joined.

    python3 bandwidth.py --master ADDR --port P --nodes N --node R --backend gloo|nccl
                         --link-mib M --allreduce-mib A --timeout S [--link-timeout L]

Over the job's fabric (gloo over TCP on CPU nodes; NCCL on GPU nodes, one process per GPU):

1. each node sends ``M`` MiB to the next node of a ring and receives from the previous one, at
   once, then the same the other way round; every node times what it received (Gbit/s). Each
   receive has its own deadline, ``L`` seconds (a third of ``S`` by default): what has not
   arrived by then is itself the figure, an upper bound, "below M MiB in L s" (``bound_fwd``,
   ``bound_rev``), never a transport error that ends the probe (issue 31: gloo's own 60 s
   timeout used to kill the probe before any figure was collected, and the gate then blamed the
   node it ran on);
2. the figures go through the job's key-value store (a ``TCPStore`` on the main node, apart
   from the links measured), each node waiting for the others until ``S`` is spent: a node whose
   figures never come is listed in ``missing``, so the verdict names it;
3. unless a link is bounded, missing or already below ``--link-floor``, every process of the job
   all-reduces ``A`` MiB of float32, timed; the bus bandwidth is nccl-tests' definition
   (algorithm bandwidth x 2(n-1)/n, GB/s), so it compares with published nccl-tests figures;
4. each node prints one line, ``MNP_BANDWIDTH <json>``: ``{"nodes": [{"node", "in_fwd",
   "in_rev", "bound_fwd", "bound_rev"}, ...], "missing": [...], "link_s": L, "busbw": GB/s or
   null}``, and leaves without waiting for transfers still crawling over a slow link.

The entrypoint itself never imports PyTorch (it uses only the standard library): this program is
started as a child process, so the import happens only there, under ``MNP_HEALTH=full``.
"""

import argparse
import contextlib
import datetime
import importlib
import json
import os
import socket
import sys
import threading
import time

MIB = 1 << 20


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True)
    parser.add_argument("--address", default="0.0.0.0", help="this node's address")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--link-mib", type=int, default=64)
    parser.add_argument("--allreduce-mib", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--link-floor", type=float, default=1.0, help="Gbit/s")
    parser.add_argument("--link-timeout", type=float, default=0.0,
                        help="seconds each ring receive may take (default: a third of --timeout)")
    return parser.parse_args(argv)


def gbits(nbytes, seconds):
    return nbytes * 8 / max(seconds, 1e-9) / 1e9


def progress(args, started, what):
    """One line on stderr per step: the entrypoint shows them when the probe does not end."""
    sys.stderr.write("node %d: %s at %.1fs\n" % (args.node, what, time.monotonic() - started))
    sys.stderr.flush()


def seconds_left(deadline, least=0.001):
    return datetime.timedelta(seconds=max(least, deadline - time.monotonic()))


def finished(work, deadline, backend):
    """Whether ``work`` (an isend/irecv) completed by ``deadline`` (monotonic s). A transfer
    still running then is abandoned, never an error: its slowness is the finding."""
    if backend == "nccl":  # NCCL's completion is a CUDA event: poll it
        while not work.is_completed():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True
    try:  # gloo's send and receive take a timeout of their own
        work.wait(seconds_left(deadline))
    except RuntimeError:
        return False
    return True


def ring(torch, dist, args, leaders, rank, device, shift, link_s, group):
    """Send to the node ``shift`` places on, receive from the one ``shift`` places back, each
    bounded by ``link_s`` seconds: ``(Gbit/s received, whether it all arrived)``; what did not
    arrive in time is reported as ``link-mib`` in ``link_s``, an upper bound. Only the nodes'
    first processes (``leaders``) take part, in ``group``, a process group of their own for
    this direction: gloo closes a pair whose transfer timed out, and that must not break the
    other direction's measurement."""
    count = len(leaders)
    pos = leaders.index(rank)
    size = args.link_mib * MIB
    out = torch.ones(size // 4, dtype=torch.float32, device=device)
    into = torch.empty(size // 4, dtype=torch.float32, device=device)
    tag = 1 if shift > 0 else 2  # a transfer left behind never matches the other direction's
    start = time.monotonic()
    deadline = start + link_s
    try:
        sent = dist.isend(out, leaders[(pos + shift) % count], group=group, tag=tag)
        got = dist.irecv(into, leaders[(pos - shift) % count], group=group, tag=tag)
        arrived = finished(got, deadline, args.backend)
    except RuntimeError:  # a pair already closed by a timeout: nothing more arrives over it
        arrived = False
    if not arrived:
        return gbits(size, link_s), False
    seconds = time.monotonic() - start
    with contextlib.suppress(RuntimeError):  # a slow send is the receiver's figure, not ours
        finished(sent, deadline, args.backend)
    return gbits(size, seconds), True


def tcp_ring(args, store, name, shift, link_s):
    """The gloo backend's links, measured over plain TCP sockets between the same addresses
    (gloo's transport is TCP): ``(Gbit/s received, whether it all arrived)``. Each node listens,
    a thread sends ``link-mib`` MiB to the node ``shift`` places on, and this node counts what
    arrives from the one ``shift`` places back until ``link_s`` seconds have passed: what came
    in that time is the figure, an upper bound when not all of it came. No transport timeout
    can end the probe (gloo's closes its pairs and can stall the next transfer)."""
    size = args.link_mib * MIB
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((args.address, 0))
    listener.listen(4)
    post(store, "listen-" + name, args.node, [args.address, listener.getsockname()[1]])
    target = (args.node + shift) % args.nodes
    start = time.monotonic()
    deadline = start + link_s
    where = gathered(store, args.nodes, deadline, "listen-" + name)
    if target in where:
        sender = threading.Thread(target=_send, args=(tuple(where[target]), size, link_s))
        sender.daemon = True  # abandoned at the deadline: the process leaves without it
        sender.start()
    received = _receive(listener, size, deadline)
    seconds = time.monotonic() - start
    if received < size:
        return gbits(received, link_s), False
    return gbits(size, seconds), True


def _send(address, size, link_s):
    chunk = bytes(MIB)
    try:
        sock = socket.create_connection(address, timeout=link_s)
    except OSError:
        return  # the receiver's figure says so
    with contextlib.suppress(OSError), sock:
        for _ in range(size // MIB):
            sock.sendall(chunk)


def _receive(listener, size, deadline):
    """Bytes received on the one connection ``listener`` accepts, until ``size`` or
    ``deadline``."""
    received = 0
    try:
        listener.settimeout(max(0.001, deadline - time.monotonic()))
        conn, _ = listener.accept()
    except OSError:
        return 0
    with conn:
        while received < size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            conn.settimeout(left)
            try:
                chunk = conn.recv(1 << 20)
            except OSError:
                break
            if not chunk:
                break
            received += len(chunk)
    return received


def store_barrier(store, name, world, deadline):
    """Every process of the probe got here, or ``deadline`` passed: through the store, so a
    transfer left running on a slow link cannot stall it."""
    store.add(name, 1)
    while store.add(name, 0) < world and time.monotonic() < deadline:
        time.sleep(0.01)


def flag(store, key, value=1):
    """Add ``value`` to the counter ``key``; its value. ``add`` never blocks on a missing key
    (``wait`` does, and a store client whose ``wait`` timed out reads the late answer to it as
    the answer to its next request), so every "has X happened" here is a counter."""
    return store.add(key, value)


def collect(store, nodes, deadline, what="figures"):
    """``(reports, missing)``: every node's ``what`` from the store (posted with ``post``),
    waiting until ``deadline``; ``missing``: the nodes whose never came."""
    found = gathered(store, nodes, deadline, what)
    return [found[n] for n in sorted(found)], [n for n in range(nodes) if n not in found]


def gathered(store, nodes, deadline, what):
    """node -> its posted ``what``, for the nodes that posted it by ``deadline``."""
    found = {}
    while True:
        for node in range(nodes):
            if node not in found and flag(store, "%s-posted/%d" % (what, node), 0):
                found[node] = json.loads(store.get("%s/%d" % (what, node)).decode("utf-8"))
        if len(found) == nodes or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def post(store, what, node, value):
    store.set("%s/%d" % (what, node), json.dumps(value))
    flag(store, "%s-posted/%d" % (what, node))


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


class Probe(object):
    """One process's view: its rank, the store, the deadline (from the process's start)."""

    def __init__(self, local, args, per_node, started):
        self.args = args
        self.started = started
        self.deadline = started + args.timeout
        self.rank, self.world = args.node * per_node + local, args.nodes * per_node
        self.leaders = [node * per_node for node in range(args.nodes)]
        self.leader = self.rank in self.leaders
        self.link_s = 1.0

    def say(self, what):
        progress(self.args, self.started, what)

    def links(self, torch, dist, store, device):
        """This node's figures: each direction of the ring, measured within ``link_s``."""
        args = self.args
        groups = {}
        if args.backend == "nccl":
            groups = dict((name, dist.new_group(self.leaders)) for name in ("fwd", "rev"))
        mine = {"node": args.node, "in_fwd": 0.0, "in_rev": 0.0, "bound_fwd": False,
                "bound_rev": False}
        for name, shift in (("fwd", 1), ("rev", -1)):
            store_barrier(store, "start-" + name, self.world, self.deadline)
            self.say("ring " + name)
            if not self.leader or args.nodes < 2:
                continue
            if args.backend == "gloo":
                figure, arrived = tcp_ring(args, store, name, shift, self.link_s)
            else:
                figure, arrived = ring(torch, dist, args, self.leaders, self.rank, device, shift,
                                       self.link_s, groups[name])
            mine["in_" + name], mine["bound_" + name] = figure, not arrived
        return mine

    def decide(self, store, reports, missing):
        """Whether every process all-reduces: the main node's process decides for all (so all
        or none take part), and not when a link is missing, bounded or below the floor."""
        clean = not missing and not any(r["bound_fwd"] or r["bound_rev"] for r in reports)
        if self.rank == 0:  # 1: all-reduce, 2: not
            flag(store, "allreduce", 1 if clean and self.args.nodes > 1 and min(
                min(r["in_fwd"], r["in_rev"]) for r in reports) >= self.args.link_floor else 2)
        decided = 0
        while not decided and time.monotonic() < self.deadline:
            decided = flag(store, "allreduce", 0)
            time.sleep(0 if decided else 0.02)
        return decided == 1

    def finish(self, store):
        """The main node's process hosts the store: it stays until every process read it."""
        if flag(store, "finished") and self.rank == 0:
            while flag(store, "finished", 0) < self.world and time.monotonic() < self.deadline:
                time.sleep(0.02)


def process(local, args, per_node):
    """One process of the probe: ``local`` is its GPU on this node (0 on CPU nodes)."""
    probe = Probe(local, args, per_node, time.monotonic())
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(local)
        device = "cuda:%d" % local
    probe.say("PyTorch imported")
    store = dist.TCPStore(args.master, args.port, probe.world, probe.rank == 0,
                          datetime.timedelta(seconds=args.timeout), wait_for_workers=False)
    post(store, "joined", args.node, True)
    try:
        dist.init_process_group(args.backend, store=dist.PrefixStore("pg", store),
                                rank=probe.rank, world_size=probe.world,
                                timeout=seconds_left(probe.deadline, 1.0))
    except RuntimeError:  # a node never started the probe: name it, not this one
        _, missing = collect(store, args.nodes, time.monotonic(), "joined")
        report(local == 0, {"nodes": [], "missing": missing, "link_s": 0.0, "busbw": None})
        return leave()
    probe.say("process group up")
    # the bound counts from the start, PyTorch's import included (half a minute when several
    # nodes share a loaded machine): each direction gets at most its share of what is left,
    # with a fifth (at most 5 s) kept for the figures' exchange
    left = probe.deadline - time.monotonic()
    probe.link_s = max(1.0, min(args.link_timeout or args.timeout / 3.0,
                                (left - min(5.0, left / 5)) / 2))
    mine = probe.links(torch, dist, store, device)
    try:
        if probe.leader:
            post(store, "figures", args.node, mine)
        reports, missing = collect(store, args.nodes, probe.deadline)
    except RuntimeError as exc:  # the store on the main node went away: the main node is silent
        probe.say("the store on node 0 is gone (%s)" % exc)
        report(probe.leader, {"nodes": [mine], "missing": [0], "link_s": probe.link_s,
                              "busbw": None})
        return leave()
    probe.say("figures collected (missing: %s)" % missing)
    together = probe.decide(store, reports, missing)
    busbw = allreduce(torch, dist, args, probe.world, device) if together else None
    report(probe.leader, {"nodes": reports, "missing": missing, "link_s": probe.link_s,
                          "busbw": busbw})
    probe.finish(store)
    if together:
        dist.barrier()
        dist.destroy_process_group()
        return None
    return leave()


def report(leader, result):
    """The node's one line (its first process only)."""
    if leader:
        sys.stdout.write("MNP_BANDWIDTH %s\n" % json.dumps(result))
        sys.stdout.flush()


def leave():
    """Exit at once: transfers may still crawl over a slow link, and waiting for them (or for
    the process group's teardown) is what the deadline is there to avoid."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
