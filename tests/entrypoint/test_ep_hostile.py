"""The rendezvous server under hostile input (issue 12, High 1 and the rendezvous Low items).

Every test talks to a real ``rendezvous.Server`` on 127.0.0.1 over real sockets, then checks
that the server is still serving: real ``rendezvous.Client`` children register afterwards and
``go`` reaches them. Loops are bounded in count and time; traffic stays on loopback.
"""

import contextlib
import json
import random
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from entrypoint.core import log as eplog
from entrypoint.rendezvous import protocol
from entrypoint.rendezvous import server as rendezvous

SECRET = b"hostile-test-secret"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDmT1cNnhtrXNHhRkWpCZ8ClN3nc8aUtQj1lnN4hvUCw"
NUM = 3  # main node 0, children 1 and 2


def make_server(secret=SECRET, **kwargs):
    kwargs.setdefault("hb_interval", 0.2)
    kwargs.setdefault("hb_timeout", 10.0)  # a stalled test process must not read as "lost"
    return rendezvous.Server(secret, "job-9", NUM, 0, {"client_key": KEY}, 0, host="127.0.0.1",
                             **kwargs).start()


def make_client(port, index, secret=SECRET, **kwargs):
    kwargs.setdefault("hb_interval", 0.2)
    kwargs.setdefault("hb_timeout", 10.0)  # a stalled test process must not read as "lost"
    fields = {"job": f"job-9#{index}", "index": index, "addr": f"10.9.0.{index + 1}",
              "slots": 1, "host_key": KEY}
    return rendezvous.Client(secret, "127.0.0.1", port, fields, **kwargs)


@pytest.fixture
def server_factory():
    made = []

    def factory(**kwargs):
        server = make_server(**kwargs)
        made.append(server)
        return server

    yield factory
    for server in made:
        server.stop()


def assert_children_still_register(server, secret=SECRET):
    """The real children register after the attack, and ``go`` reaches every one of them."""
    assert getattr(server, "failure", None) is None
    clients = [make_client(server.port, i, secret=secret) for i in range(1, NUM)]
    try:
        for client in clients:
            client.register(time.time() + 10, quiet=True)
            client.ready()
            client.start()
        assert server.wait(10) == []
        table = server.go(lambda t: {"nodes": [[n.index, n.address, n.slots] for n in t]},
                          rendezvous.NodeInfo(0, "10.9.0.1", 1, KEY))
        assert table is not None and [n.index for n in table] == [0, 1, 2]
        for client in clients:
            kind, _ = client.next_event(5)
            assert kind == "go"
        assert getattr(server, "failure", None) is None
    finally:
        for client in clients:
            client.close()


# -- the hostile packets ------------------------------------------------------------------

def connect(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    reader = sock.makefile("rb")
    hello = json.loads(reader.readline())
    assert hello["t"] == "hello"
    return sock, reader, hello


def register_fields(**overrides):
    msg = {"t": "register", "v": 1, "job": "job-9#1", "index": 1, "addr": "10.9.0.2",
           "slots": 1, "host_key": KEY}
    msg.update(overrides)
    return msg


def sealed(hello, secret, cn="c" * 32, **overrides):
    """A register message sealed for this connection (with ``secret``, possibly wrong)."""
    session = protocol.Session(secret, hello["sn"], cn, protocol.C2S)
    return json.loads(session.seal(register_fields(**overrides)))


def raw(message):
    return json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n"


def answer_of(reader):
    """The server's reply line, or ``None`` when it just closed the connection."""
    try:
        line = reader.readline()
    except OSError:
        return None
    return json.loads(line) if line else None


def nested(depth):
    return b"[" * depth + b"]" * depth


# Each builder gets the hello and the server's secret and returns the bytes to send. With a
# secret the attacker does not know, the MAC is computed with a wrong key.
WRONG = b"not-the-secret"
PACKETS = {
    "index is a list": lambda h, s: raw(sealed(h, WRONG if s else None, index=[1])),
    "index is a dict": lambda h, s: raw(sealed(h, WRONG if s else None, index={"a": 1})),
    "index is a float": lambda h, s: raw(sealed(h, WRONG if s else None, index=1.0)),
    "index is true": lambda h, s: raw(sealed(h, s, index=True)),
    "index is huge": lambda h, s: raw(sealed(h, s, index=10 ** 300)),
    "mac with a non-ASCII char": lambda h, s: raw(dict(sealed(h, WRONG), mac="\u00e9" * 64)),
    "mac is a list": lambda h, s: raw(dict(sealed(h, WRONG), mac=["a"])),
    "JSON nested 30,000 deep": lambda h, s: nested(30000) + b"\n",
    "JSON nested 100 deep": lambda h, s: nested(100) + b"\n",
    "nested object": lambda h, s: raw(register_fields(x=json.loads(nested(50).decode()))),
    "job is not a string": lambda h, s: raw(sealed(h, s, job=12345)),
    "job is a list": lambda h, s: raw(sealed(h, s, job=["job-9"])),
    "addr is a number": lambda h, s: raw(sealed(h, s, addr=167837954)),
    "slots is a string": lambda h, s: raw(sealed(h, s, slots="1")),
    "host key is a dict": lambda h, s: raw(sealed(h, s, host_key={"k": 1})),
    "host key, trailing newline": lambda h, s: raw(sealed(h, s, host_key=KEY + "\n")),
    "cn, trailing newline": lambda h, s: raw(sealed(h, s, cn="c" * 32 + "\n")),
    "cn is a list": lambda h, s: raw(dict(sealed(h, s), cn=[1])),
    "seq is true": lambda h, s: raw(dict(sealed(h, s), seq=True)),
    "v is a string": lambda h, s: raw(sealed(h, s, v="1")),
    "NaN": lambda h, s: b'{"t":"register","index":NaN}\n',
    "t is not a string": lambda h, s: raw({"t": ["register"]}),
    "a JSON list": lambda h, s: b"[1,2,3]\n",
    "a JSON string": lambda h, s: b'"register"\n',
    "garbage": lambda h, s: b"GET / HTTP/1.0\r\n\r\n",
    "binary": lambda h, s: bytes(range(256)) + b"\n",
    "invalid UTF-8": lambda h, s: b'{"t":"\xff\xfe"}\n',
    "oversized frame": lambda h, s: b"{" + b" " * (70 * 1024) + b"\n",
    "oversized, no newline": lambda h, s: b"x" * (70 * 1024),
    "big int digits": lambda h, s: b'{"t":"register","index":' + b"9" * 5000 + b"}\n",
}


# Every packet with and without a job secret, except a bad MAC without a secret: no MAC is
# checked then, so that register message is valid and nothing is there to reject.
HOSTILE_CASES = [pytest.param(name, secret, id=f"{name}-{label}")
                 for name in sorted(PACKETS)
                 for secret, label in ((SECRET, "secret"), (None, "no-secret"))
                 if secret is not None or not name.startswith("mac")]


@pytest.mark.parametrize("name,secret", HOSTILE_CASES)
def test_hostile_packet_is_rejected_and_children_still_register(server_factory, name, secret):
    server = server_factory(secret=secret)
    sock, reader, hello = connect(server.port)
    with sock, reader:
        # the server may cut an oversized frame off while we are still sending it
        with contextlib.suppress(OSError):
            sock.sendall(PACKETS[name](hello, secret))
        answer = answer_of(reader)
    assert answer is None or answer["t"] == "reject", answer
    assert server.missing() == [1, 2]
    assert_children_still_register(server, secret)


def test_truncated_frames_and_half_handshakes(server_factory):
    server = server_factory()
    for cut in (1, 10, 40, 100):
        sock, reader, hello = connect(server.port)
        with sock, reader:
            sock.sendall(raw(sealed(hello, SECRET))[:cut])  # then hang up mid-frame
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.close()  # before even reading the hello
    assert_children_still_register(server)


def test_registered_node_sending_deep_json_is_dropped_not_fatal(server_factory):
    """After authentication the line limit is 64 KiB: 30,000 levels fit, and must not reach
    the parser's recursion either."""
    server = server_factory()
    sock, reader, hello = connect(server.port)
    with sock, reader:
        sock.sendall(raw(sealed(hello, SECRET, index=2, addr="10.9.0.3")))
        assert answer_of(reader)["t"] == "welcome"
        sock.sendall(nested(30000) + b"\n")
        assert answer_of(reader)["t"] == "reject"
    assert_children_still_register(server)


def test_slowloris_idle_connections_are_evicted(server_factory):
    """More idle (never authenticating) connections than the cap: the oldest are dropped, so
    the real children still get in before the handshake timeout frees anything."""
    server = server_factory(handshake_timeout=60, max_pending=8)
    idle = []
    try:
        for i in range(40):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            if i % 2:
                sock.sendall(b'{"t":"reg')  # a trickle: a frame begun, never finished
            idle.append(sock)
        deadline = time.monotonic() + 5
        while len(server._pending) > 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server._pending) <= 8
        assert_children_still_register(server)
    finally:
        for sock in idle:
            sock.close()


def test_handshake_timeout_closes_idle_connections(server_factory):
    server = server_factory(handshake_timeout=0.5)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    with sock:
        sock.settimeout(5)
        reader = sock.makefile("rb")
        assert json.loads(reader.readline())["t"] == "hello"
        assert reader.readline() == b""  # closed by the server, not by us
    assert not server._pending


# -- a fuzzed stream of frames --------------------------------------------------------------

ODD_VALUES = [None, True, False, 0, -1, 1, 2, 3, 2 ** 63, -2 ** 63, 1.5, 1e308, "", "1",
              "\n", "\u2028", "\x1b[2J", "10.9.0.2\nX", "\u00e9" * 64, "a" * 3000, [], [1],
              {}, {"t": "register"}, [[[[[[[[[[1]]]]]]]]]]]


def mutate(rng, hello, secret):
    """One fuzzed frame: a register message (or a later message) with fields swapped for odd
    values, dropped, sealed or not, then maybe cut, spliced or bit-flipped as bytes."""
    fields = register_fields()
    for _ in range(rng.randint(0, 3)):
        name = rng.choice(sorted(fields) + ["cn", "seq", "mac", "sn", "dir", "extra"])
        if rng.random() < 0.2:
            fields.pop(name, None)
        else:
            fields[name] = rng.choice(ODD_VALUES)
    key = rng.choice([secret, WRONG, None])
    try:
        message = json.loads(protocol.Session(key, hello["sn"], "c" * 32,
                                              protocol.C2S).seal(fields))
    except (protocol.ProtocolError, TypeError, ValueError):
        message = fields
    if rng.random() < 0.3:
        message[rng.choice(["sn", "cn", "dir", "seq", "mac", "t"])] = rng.choice(ODD_VALUES)
    data = json.dumps(message).encode("utf-8") + b"\n"
    roll = rng.random()
    if roll < 0.15:
        data = data[:rng.randint(0, len(data))]
    elif roll < 0.3:
        pos = rng.randrange(len(data))
        data = data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1:]
    elif roll < 0.4:
        data = nested(rng.choice([9, 200, 3000])) + b"\n"
    elif roll < 0.45:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    return data


@pytest.mark.parametrize("secret", [SECRET, None], ids=["secret", "no-secret"])
def test_fuzzed_frames_then_children_register(server_factory, secret):
    server = server_factory(secret=secret)
    rng = random.Random(1207)
    sent = 0
    # bounded by count; the time cap only stops a hang (a loaded machine just takes longer)
    end = time.monotonic() + 60.0
    while sent < 600 and time.monotonic() < end:
        try:
            sock, reader, hello = connect(server.port)
        except (OSError, ValueError):
            continue
        with sock, reader:
            for _ in range(rng.randint(1, 4)):
                try:
                    sock.sendall(mutate(rng, hello, secret))
                except OSError:
                    break
                sent += 1
    assert sent >= 600, f"the fuzz loop did not finish ({sent} frames)"
    assert server.rejected
    assert_children_still_register(server, secret)


# -- containment and failure reporting ------------------------------------------------------

def test_an_unexpected_exception_is_the_servers_failure_not_a_rejection(server_factory,
                                                                          monkeypatch):
    """Issue 31: an exception that is not a ``ProtocolError`` is the server's own bug. Before,
    it rejected the peer (a legitimate child then exited as misconfigured); now the server
    fails, so the main node ends the job as its own infrastructure failure."""
    calls = []

    def flaky(msg, *args):
        calls.append(msg.get("index"))
        raise KeyError("a bug in validation")

    monkeypatch.setattr(rendezvous, "validate_registration", flaky)
    server = server_factory()
    sock, reader, hello = connect(server.port)
    with sock, reader:
        sock.sendall(raw(sealed(hello, SECRET)))
        assert reader.readline() == b""  # closed: no reject, the child is not at fault
    assert calls == [1]
    with pytest.raises(rendezvous.ServerFailed, match="internal error .*a bug in validation"):
        server.wait(30)
    assert server.rejected_count == 0


def test_a_dead_server_thread_is_reported_at_once(server_factory, monkeypatch):
    server = server_factory()

    def broken(timeout=None):
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(server._sel, "select", broken)
    server._call(lambda: None)  # wake the loop so it calls the broken select
    start = time.monotonic()
    with pytest.raises(rendezvous.ServerFailed, match="Bad file descriptor"):
        server.wait(30)
    assert time.monotonic() - start < 5
    assert server.next_event(1) == ("lost", None, server.failure)
    with pytest.raises(rendezvous.ServerFailed):
        server.go(lambda t: {}, rendezvous.NodeInfo(0, "10.9.0.1", 1, KEY))
    server.done(1)  # returns at once: nobody left to tell


# -- the log: escaped and throttled ----------------------------------------------------------

def test_peer_text_cannot_forge_log_lines(server_factory, capsys):
    server = server_factory(secret=None)
    forged = "1\nmnp-entrypoint[main 0/3]: FORGED node 1 ready\r\x1b[2K"
    for field in ("index", "job", "v", "addr"):
        sock, reader, hello = connect(server.port)
        with sock, reader:
            sock.sendall(raw(sealed(hello, None, **{field: forged})))
            assert answer_of(reader)["t"] == "reject"
    assert_children_still_register(server, None)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "FORGED" in line]
    assert lines, err
    for line in lines:  # each appears inside an entrypoint line about the rejection, escaped
        assert "rejected registration" in line and "\\n" in line and "\x1b" not in line


def test_rejections_are_logged_with_throttling(server_factory, capsys):
    server = server_factory()
    for _ in range(120):
        sock, reader, hello = connect(server.port)
        with sock, reader:
            sock.sendall(b"garbage\n")
            answer_of(reader)
    assert server.rejected_count == 120
    err = capsys.readouterr().err
    logged = [line for line in err.splitlines() if "rejected registration" in line]
    # 20 per 10 s: one window, or two if this machine is very slow; unthrottled it is 120
    assert 1 <= len(logged) <= 40, len(logged)


def test_printable_escapes_and_truncates():
    assert eplog.printable("a\nb\x1b[0m\u2028") == "a\\nb\\x1b[0m\\u2028"
    assert eplog.printable([1, "x"]) == "[1, 'x']"
    long = eplog.printable("y" * 1000, limit=10)
    assert long.startswith("y" * 10) and "990 more" in long and len(long) < 40


def test_throttle_counts_what_it_suppressed():
    now = [100.0]
    lines = []
    throttle = eplog.Throttle("rejected connection(s)", limit=3, interval=10.0,
                              clock=lambda: now[0], write=lines.append)
    for i in range(50):
        throttle(f"line {i}")
    assert lines == ["line 0", "line 1", "line 2"]
    now[0] += 10.5
    throttle.flush()
    assert lines[-1].startswith("47 more rejected connection(s) in the last")
    throttle("next")
    assert lines[-1] == "next"


# -- monotonic clock --------------------------------------------------------------------------

@pytest.mark.parametrize("silent", ["children", "main"])
def test_wall_clock_jump_does_not_fail_a_healthy_job(server_factory, monkeypatch, silent):
    """Heartbeat timeouts run on the monotonic clock: NTP stepping the wall clock by an hour
    must not declare a healthy peer lost. The side under watch hears nothing from the ``silent``
    one after the jump (its heartbeats are 30 s apart), so a timeout read off the wall clock
    would fire at its first check, with no heartbeat in between to hide it."""
    quiet = {"hb_interval": 30.0}
    # 10 s: a stalled test process is not a lost peer, and the hour's jump still exceeds it
    server = server_factory(hb_timeout=10.0, **(quiet if silent == "main" else {}))
    clients = [make_client(server.port, index, hb_timeout=10.0,
                           **(quiet if silent == "children" else {})) for index in (1, 2)]
    try:
        for c in clients:
            c.register(time.time() + 5, quiet=True)
            c.ready()
            c.start()
        assert server.wait(5) == []
        server.go(lambda t: {}, rendezvous.NodeInfo(0, "10.9.0.1", 1, KEY))
        assert [c.next_event(5)[0] for c in clients] == ["go", "go"]
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600.0)
        watcher = server if silent == "children" else clients[0]
        assert watcher.next_event(2.5) is None
    finally:
        for c in clients:
            c.close()


def test_heartbeat_floor_leaves_room_for_the_loop_ticks():
    interval = min(2.0, rendezvous.MIN_HEARTBEAT_TIMEOUT / 4.0)  # main.py's choice
    gap = max(interval, rendezvous.CLIENT_TICK) + rendezvous.LOOP_TICK
    assert 2 * gap <= rendezvous.MIN_HEARTBEAT_TIMEOUT


def test_concurrent_flood_and_registration(server_factory):
    """Attack threads and the real children at the same time (bounded: 4 threads x 2 s).
    The attackers do not know the secret (one who does is a node, and may replace one)."""
    server = server_factory()
    stop = time.monotonic() + 2.0
    rng_seed = [0]

    def attacker():
        rng_seed[0] += 1
        rng = random.Random(rng_seed[0])
        while time.monotonic() < stop:
            try:
                sock, reader, hello = connect(server.port)
            except (OSError, ValueError, AssertionError):  # after go: "already started"
                continue
            with sock, reader, contextlib.suppress(OSError):
                sock.sendall(mutate(rng, hello, WRONG))

    threads = [threading.Thread(target=attacker) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        assert_children_still_register(server)
    finally:
        for thread in threads:
            thread.join(10)


# -- the child's side: a main node (or an impostor on its port) sending odd messages -------

def fake_main(script):
    """A one-connection main node on 127.0.0.1 that runs ``script(sock, reader, hello_sn)``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as reader:
            sn = "s" * 32
            conn.sendall(raw({"t": "hello", "v": 1, "sn": sn}))
            script(conn, reader, sn)
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


@pytest.mark.parametrize("bad", [
    {"t": "go", "nodes": [[0, "10.9.0.1", 1], ["1\nX", "10.9.0.2", 1]]},
    {"t": "go", "nodes": "all"},
    {"t": "go", "nodes": [[0, ["10.9.0.1"], 1]]},
    {"t": "done", "status": "0\nmnp-entrypoint[child 1/3]: FORGED"},
    {"t": "surprise"},
])
def test_child_treats_a_malformed_message_from_the_main_node_as_lost(bad):
    def script(conn, reader, sn):
        register = json.loads(reader.readline())
        session = protocol.Session(SECRET, sn, register["cn"], protocol.S2C)
        conn.sendall(session.seal({"t": "welcome", "client_key": KEY}))
        reader.readline()  # ready
        conn.sendall(session.seal(bad))
        time.sleep(1.0)

    port, thread = fake_main(script)
    client = make_client(port, 1)
    try:
        client.register(time.time() + 5, quiet=True)
        client.ready()
        client.start()
        kind, reason = client.next_event(5)
        assert kind == "lost" and "\n" not in reason, (kind, reason)
    finally:
        client.close()
        thread.join(5)


def test_child_refuses_a_welcome_with_a_non_string_key():
    def script(conn, reader, sn):
        register = json.loads(reader.readline())
        session = protocol.Session(SECRET, sn, register["cn"], protocol.S2C)
        conn.sendall(session.seal({"t": "welcome", "client_key": ["ssh-ed25519 AAAA"]}))
        time.sleep(0.5)

    port, thread = fake_main(script)
    client = make_client(port, 1)
    try:
        with pytest.raises(rendezvous.RendezvousError):
            client.register(time.time() + 1.5, quiet=True)
    finally:
        client.close()
        thread.join(5)


def test_a_connection_opened_before_go_cannot_register_after_it(server_factory):
    """Otherwise a peer could connect early, wait for ``go`` and then replace a running node
    (whose connection the server would close: the job would fail)."""
    server = server_factory()
    early, reader, hello = connect(server.port)
    with early, reader:
        clients = [make_client(server.port, i) for i in (1, 2)]
        try:
            for client in clients:
                client.register(time.time() + 5, quiet=True)
                client.ready()
                client.start()
            assert server.wait(5) == []
            assert server.go(lambda t: {}, rendezvous.NodeInfo(0, "10.9.0.1", 1, KEY))
            early.sendall(raw(sealed(hello, SECRET, addr="10.9.0.66")))
            assert answer_of(reader)["t"] == "reject"
            assert server.next_event(1.0) is None  # node 1 is not lost
            assert server.table(rendezvous.NodeInfo(0, "10.9.0.1", 1, KEY))[1].address == \
                "10.9.0.2"
        finally:
            for client in clients:
                client.close()


# -- the same on the oldest supported Python ---------------------------------------------------

PY36_SCRIPT = r'''
import json, socket, sys, time
sys.path.insert(0, sys.argv[1])
from entrypoint.rendezvous import protocol
from entrypoint.rendezvous import server as rendezvous
KEY = sys.argv[2]
for secret in (b"k", None):
    server = rendezvous.Server(secret, "job-9", 3, 0, {"client_key": KEY}, 0, host="127.0.0.1",
                               hb_interval=0.2).start()
    for packet in (
            {"index": [1]}, {"mac": "\u00e9" * 64}, {"job": 12345}, {"index": "1\nX"}, None):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        reader = sock.makefile("rb")
        hello = json.loads(reader.readline().decode())
        if packet is None:
            sock.sendall(b"[" * 30000 + b"]" * 30000 + b"\n")
        else:
            msg = {"t": "register", "v": 1, "job": "job-9", "index": 1, "addr": "10.9.0.2",
                   "slots": 1, "host_key": KEY}
            sealed = json.loads(protocol.Session(b"wrong" if secret else None, hello["sn"],
                                                 "c" * 32, protocol.C2S).seal(msg).decode())
            sealed.update(packet)
            sock.sendall(json.dumps(sealed).encode() + b"\n")
        reader.readline()
        sock.close()
    clients = []
    for index in (1, 2):
        client = rendezvous.Client(secret, "127.0.0.1", server.port, {
            "job": "job-9", "index": index, "addr": "10.9.0.%d" % (index + 1), "slots": 1,
            "host_key": KEY}, hb_interval=0.2)
        client.register(time.time() + 5, quiet=True)
        client.ready()
        client.start()
        clients.append(client)
    assert server.wait(5) == [], server.missing()
    assert server.go(lambda t: {"nodes": [[n.index, n.address, n.slots] for n in t]},
                     rendezvous.NodeInfo(0, "10.9.0.1", 1, KEY)) is not None
    assert [c.next_event(5)[0] for c in clients] == ["go", "go"]
    assert server.failure is None
    for client in clients:
        client.close()
    server.stop()
print("ok")
'''


def test_hostile_packets_on_python_3_6(tmp_path):
    """The entrypoint runs on Python 3.6 (Ubuntu 18.04 images): same attack, same outcome."""
    candidates = [Path.home() / ".pyenv/versions/3.6.15/bin/python3", Path("/usr/bin/python3.6")]
    python = next((p for p in candidates if p.exists()), None)
    if python is None:
        pytest.skip("no Python 3.6 interpreter on this host")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([str(python), "-c", PY36_SCRIPT, str(root), KEY],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
    assert "rendezvous server failed" not in result.stderr
