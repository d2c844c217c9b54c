"""A running main node (the real entrypoint as a process) under attack, and accept under EMFILE.

The main node runs as ``python -m entrypoint`` with the torchrun launcher (a fake ``torchrun`` on
PATH, as in test_ep_main.py). Every hostile packet and a fuzzed stream of frames go to its
rendezvous port on 127.0.0.1; then the real children register: ``rendezvous.Client`` objects,
exactly what a child node runs, connecting over loopback (a child entrypoint process cannot be
used here: configuration rightly refuses a loopback main-node address, and the tests send
nothing beyond 127.0.0.0/8). The job must succeed: the main node exits 0.
"""

import contextlib
import os
import random
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from entrypoint.rendezvous import server as rendezvous
from tests.entrypoint.test_ep_hostile import PACKETS, WRONG, connect, mutate

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hostile-job-secret"
FAKE_TORCHRUN = """#!/bin/sh
echo "$MNP_NODE_INDEX $*" > "$FAKE_OUT/node$MNP_NODE_INDEX"
exit 0
"""


def wait_for_port(port, proc, limit=30.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def start_main(local_node, tmp_path, port, secret):
    local_node.address()  # the main node needs a non-loopback address: skip without one
    bindir = local_node.fake_program("torchrun", FAKE_TORCHRUN)
    env = dict(AWS_BATCH_JOB_NODE_INDEX="0", AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
               AWS_BATCH_JOB_NUM_NODES="3", AWS_BATCH_JOB_ID="job-9", MNP_LAUNCHER="torchrun",
               MNP_RENDEZVOUS_PORT=str(port), MNP_MASTER_PORT=str(local_node.free_port()),
               MNP_HEARTBEAT_TIMEOUT="10", MNP_WAIT_TIMEOUT="120",
               MNP_STATE_DIR=str(tmp_path / "state"), FAKE_OUT=str(tmp_path),
               PATH=f"{bindir}:{os.environ['PATH']}")
    if secret:
        env["MNP_SECRET"] = secret
    log = open(tmp_path / "main.log", "w+")  # noqa: SIM115 (the test reads and closes it)
    proc = local_node.start(["python3", "train.py"], stdout=log, **env)
    return proc, log


class Child(threading.Thread):
    """A real child's rendezvous: register, ready, wait for go, report exit 0, wait for done."""

    def __init__(self, port, index, secret):
        super().__init__(daemon=True)
        key = secret.encode("utf-8") if secret else None  # as config passes MNP_SECRET
        self.client = rendezvous.Client(key, "127.0.0.1", port, {
            "job": f"job-9#{index}", "index": index, "addr": f"10.9.0.{index + 1}",
            "slots": 1, "host_key": ""}, hb_interval=0.5, hb_timeout=10.0)
        self.events = []
        self.error = None

    def run(self):
        try:
            self.client.register(time.time() + 30, quiet=True)
            self.client.ready()
            self.client.start()
            end = time.monotonic() + 40
            while time.monotonic() < end:
                event = self.client.next_event(0.5)
                if event is None:
                    continue
                self.events.append(event[0])
                if event[0] == "go":
                    self.client.report_exit(0)
                if event[0] in ("done", "lost"):
                    return
        except Exception as exc:  # reported by the test
            self.error = exc
        finally:
            self.client.close()


def attack(port, secret, frames=300, seconds=60.0):
    """Every hostile packet once, then a seeded, bounded fuzzed stream of frames: ``frames`` of
    them; ``seconds`` only stops a hang (a loaded machine just takes longer)."""
    key = secret.encode() if secret else None
    for name in sorted(PACKETS):
        sock, reader, hello = connect(port)
        with sock, reader:
            try:
                sock.sendall(PACKETS[name](hello, key))
                reader.readline()
            except OSError:
                pass
    rng = random.Random(4242)
    sent = 0
    end = time.monotonic() + seconds
    while sent < frames and time.monotonic() < end:
        sock, reader, hello = connect(port)
        # an attacker without the secret can only guess it; on a job without a secret a
        # frame that happens to be a valid registration joins, then hangs up (waited for again)
        with sock, reader, contextlib.suppress(OSError):
            sock.sendall(mutate(rng, hello, WRONG if key else None))
        sent += 1
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
    return sent, idle


@pytest.mark.parametrize("secret", [SECRET, None], ids=["secret", "no-secret"])
def test_main_node_survives_attack_and_the_job_succeeds(local_node, tmp_path, secret):
    port = local_node.free_port()
    main, log = start_main(local_node, tmp_path, port, secret)
    idle = []
    try:
        assert wait_for_port(port, main), "main node did not listen"
        sent, idle = attack(port, secret)
        assert sent == 300, f"the fuzz loop did not finish ({sent} frames)"
        assert main.poll() is None, "the main node died under attack"
        children = [Child(port, i, secret) for i in (1, 2)]
        for child in children:
            child.start()
        code = main.wait(60)
        for child in children:
            child.join(20)
    finally:  # local_node stops the main node if it is still running
        for sock in idle:
            sock.close()
        log.seek(0)
        out = log.read()
        log.close()
    assert code == 0, out
    for child in children:
        assert child.error is None, child.error
        assert child.events[:1] == ["go"] and "done" in child.events, child.events
    assert (tmp_path / "node0").read_text().split()[0] == "0"
    assert "rejected registration" in out
    assert "rendezvous server failed" not in out
    assert len(out.splitlines()) < 200, "the attack flooded the log"


# -- accept under EMFILE ----------------------------------------------------------------------

SERVER_SCRIPT = textwrap.dedent("""
    import os, resource, sys, time
    sys.path.insert(0, sys.argv[1])
    from entrypoint.rendezvous import server as rendezvous
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    server = rendezvous.Server(b"k", "job-9", 2, 0, {"client_key": ""}, 0, host="127.0.0.1",
                               need_host_key=False, hb_interval=0.2, handshake_timeout=60)
    server.start()
    hogs = []
    try:
        while True:
            hogs.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    print(server.port, flush=True)
    sys.stdin.readline()          # the parent has opened its idle connections
    cpu0, wall0 = time.process_time(), time.monotonic()
    sys.stdin.readline()          # the parent waited a while: EMFILE all along
    print("%.3f %.3f" % (time.process_time() - cpu0, time.monotonic() - wall0), flush=True)
    for _ in range(4):  # room for a few connections: the idle ones take it, then EMFILE again
        os.close(hogs.pop())
    print("missing", server.wait(20), flush=True)
    server.stop()
""")


def test_accept_backs_off_on_emfile(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip("hard file limit below 256")
    errlog = open(tmp_path / "server.err", "w+")  # noqa: SIM115 (read back in finally)
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(ROOT)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog,
                            universal_newlines=True)
    idle = []
    try:
        port = int(proc.stdout.readline())
        for _ in range(40):  # many idle connections: the kernel queues what accept cannot take
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(3.0)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        cpu, wall = map(float, proc.stdout.readline().split())
        # the idle connections stay open: the server frees descriptors held by the oldest ones
        # that never authenticate, so the real child queued behind them gets in
        client = rendezvous.Client(b"k", "127.0.0.1", port, {
            "job": "job-9#1", "index": 1, "addr": "10.9.0.2", "slots": 1, "host_key": ""},
            hb_interval=0.5, hb_timeout=4.0)
        try:
            client.register(time.time() + 20, quiet=True)
            client.ready()
            result = proc.stdout.readline()
        finally:
            client.close()
        proc.stdin.close()
        proc.wait(20)
    finally:
        for sock in idle:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        errlog.seek(0)
        err = errlog.read()
        errlog.close()
    lines = err.splitlines()
    assert "cannot accept connections" in err, err[-2000:]
    assert len(lines) < 40, f"accept failures flooded the log: {len(lines)} lines"
    assert cpu < 0.3 * wall, f"the server spun on EMFILE: {cpu:.2f}s CPU in {wall:.2f}s"
    assert result.strip() == "missing []", result
