"""Rendezvous cost: the entrypoint's real rendezvous code against the anchors' polling loops.

For 10, 100 and 1000 simulated nodes on loopback:

- **ours**: the real ``entrypoint.rendezvous.Server`` (HMAC secret on) in one process, the
  children as threads spread over several processes using the real ``Client`` (backoff
  retries, register, ready). The main node starts listening ``MAIN_DELAY`` s after the first
  child started, so early children exercise the retry path.
- **baseline**: the loop of aws-samples/aws-mnpbatch-template (children append their line to the
  main node's hostfile and retry every 5 s while the main node is not up; the main node polls the
  hostfile every 1 s until it has N unique lines), simulated with threads and a real file. The SSH
  round trip of each append is not simulated (it would only make the baseline slower).

Both see the same start schedule (children start uniformly over ``SPREAD`` s). Reported: time from
the last node's start to the hostfile written, and total wall time from the first start.

Run: ``python bench/rendezvous.py`` (``--quick`` for 10 and 100 nodes, one round).
"""

import argparse
import multiprocessing
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from entrypoint.plan import hostfile
from entrypoint.rendezvous import server as rendezvous  # noqa: E402

SECRET = b"bench-secret"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDmT1cNnhtrXNHhRkWpCZ8ClN3nc8aUtQj1lnN4hvUCw"
MAIN_DELAY = 0.2
SPREAD = 1.0
BASELINE_CHILD_RETRY = 5.0
BASELINE_MAIN_POLL = 1.0


def free_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def schedule(num_nodes, spread, seed):
    rng = random.Random(seed)
    offsets = sorted(rng.uniform(0, spread) for _ in range(num_nodes - 1))
    return list(enumerate(offsets, start=1))


# -- ours ------------------------------------------------------------------------------------
def _server_proc(num_nodes, port, t0, out_dir, result):
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # the per-node log lines are still written, to /dev/null
    time.sleep(max(0.0, t0 + MAIN_DELAY - time.time()))
    server = rendezvous.Server(SECRET, "bench", num_nodes, 0, {"client_key": KEY}, port,
                               host="127.0.0.1", hb_interval=2.0, hb_timeout=30.0,
                               handshake_timeout=30.0)
    server.start()
    main = rendezvous.NodeInfo(0, "10.0.0.1", 1, KEY)
    while True:
        missing = server.wait(60)
        table = server.go(lambda t: {"nodes": []}, main) if not missing else None
        if table is not None or missing:
            break
    if missing:
        result.put(("error", f"missing {len(missing)} nodes"))
        server.stop()
        return
    hostfile.write_all(out_dir, table)
    written = time.time()
    with open(os.path.join(out_dir, "hostfile")) as handle:
        lines = handle.read().count("\n")
    result.put(("ok", written, lines))
    server.done(0, linger=5.0)
    server.stop()


def _client_thread(index, port, start_at, starts, errors):
    time.sleep(max(0.0, start_at - time.time()))
    starts[index] = time.time()
    client = rendezvous.Client(SECRET, "127.0.0.1", port, {
        "job": "bench", "index": index, "addr": f"10.{index >> 16}.{(index >> 8) & 255}.{index & 255 or 1}",
        "slots": 1, "host_key": KEY}, connect_timeout=10)
    try:
        client.register(time.time() + 60, quiet=True)
        client.ready()
        client.sock.settimeout(30)
        while client.sock.recv(65536):
            pass
    except (OSError, rendezvous.RendezvousError) as exc:
        errors.append(f"{index}: {exc}")
    finally:
        client.close()


def _client_proc(items, port, t0, result):
    starts, errors, threads = {}, [], []
    for index, offset in items:
        thread = threading.Thread(target=_client_thread,
                                  args=(index, port, t0 + offset, starts, errors))
        thread.daemon = True
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(90)
    result.put((starts, errors))


def run_ours(num_nodes, spread, seed, procs=4):
    ctx = multiprocessing.get_context("fork")
    port = free_port()
    sched = schedule(num_nodes, spread, seed)
    out_dir = tempfile.mkdtemp(prefix="mnp-bench-")
    t0 = time.time() + 0.5 + num_nodes / 2000.0  # time to start the threads
    server_q, client_q = ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=_server_proc, args=(num_nodes, port, t0, out_dir, server_q))
    server.start()
    workers = []
    for k in range(procs):
        part = sched[k::procs]
        if part:
            proc = ctx.Process(target=_client_proc, args=(part, port, t0, client_q))
            proc.start()
            workers.append(proc)
    status = server_q.get(timeout=120)
    starts, errors = {}, []
    for _ in workers:
        s, e = client_q.get(timeout=120)
        starts.update(s)
        errors.extend(e)
    for proc in workers + [server]:
        proc.join(30)
    if status[0] != "ok" or errors:
        raise RuntimeError(f"rendezvous failed: {status} {errors[:3]}")
    written, lines = status[1], status[2]
    assert lines == num_nodes, lines
    return written - max(starts.values()), written - t0


# -- baseline (anchor polling loops) ---------------------------------------------------------
def run_baseline(num_nodes, spread, seed, child_retry=BASELINE_CHILD_RETRY,
                 main_poll=BASELINE_MAIN_POLL):
    sched = schedule(num_nodes, spread, seed)
    out_dir = tempfile.mkdtemp(prefix="mnp-bench-base-")
    path = os.path.join(out_dir, "hostfile")
    t0 = time.time() + 0.5 + num_nodes / 2000.0
    main_up = threading.Event()
    lock = threading.Lock()
    starts = {}

    def child(index, start_at):
        time.sleep(max(0.0, start_at - time.time()))
        starts[index] = time.time()
        while not main_up.is_set():  # "ssh main cat >> hostfile" fails: sleep 5 and retry
            time.sleep(child_retry)
        with lock, open(path, "a") as handle:
            handle.write(f"10.0.{index >> 8}.{index & 255} slots=1\n")

    threads = [threading.Thread(target=child, args=(i, t0 + off)) for i, off in sched]
    for thread in threads:
        thread.daemon = True
        thread.start()
    time.sleep(max(0.0, t0 + MAIN_DELAY - time.time()))
    with open(path, "a") as handle:
        handle.write("10.0.0.0 slots=1\n")
    main_up.set()
    while True:  # the main node's 1 s poll of the hostfile
        with open(path) as handle:
            unique = set(handle.read().splitlines())
        if len(unique) >= num_nodes:
            break
        time.sleep(main_poll)
    with open(path + "-deduped", "w") as handle:
        handle.write("\n".join(sorted(unique)) + "\n")
    written = time.time()
    for thread in threads:
        thread.join(10)
    return written - max(starts.values()), written - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 and 100 nodes, one round")
    parser.add_argument("--sizes", default=None, help="comma list of node counts")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per size (median)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [10, 100] if args.quick else [10, 100, 1000])
    rounds = args.rounds or (1 if args.quick else 3)
    print(f"rendezvous cost on {os.cpu_count() or 1} CPU(s); children start over {SPREAD:.1f}s, "
          f"main listens after {MAIN_DELAY:.1f}s; median of {rounds} round(s)")
    header = ("nodes", "ours last->hostfile", "ours total", "baseline last->hostfile",
              "baseline total", "ratio last", "ratio total")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    rows = []
    for size in sizes:
        ours = [run_ours(size, SPREAD, seed) for seed in range(rounds)]
        base = [run_baseline(size, SPREAD, seed) for seed in range(rounds)]
        o_last = statistics.median(x[0] for x in ours)
        o_total = statistics.median(x[1] for x in ours)
        b_last = statistics.median(x[0] for x in base)
        b_total = statistics.median(x[1] for x in base)
        rows.append((size, o_last, o_total, b_last, b_total))
        print(f"| {size} | {o_last:.3f} s | {o_total:.3f} s | {b_last:.3f} s | {b_total:.3f} s "
              f"| {b_last / max(o_last, 1e-4):.0f}x | {b_total / max(o_total, 1e-4):.1f}x |")
        sys.stdout.flush()
    worst = max(r[1] for r in rows if r[0] == max(sizes))
    goal = "met" if worst < 1.0 else "NOT met"
    print(f"goal (< 1 s from the last node's start to the hostfile at {max(sizes)} nodes): "
          f"{goal} ({worst:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
