"""Rendezvous on loopback against the real server and client: registration, duplicates, HMAC."""

import json
import socket
import threading
import time

import pytest

from entrypoint.rendezvous import protocol
from entrypoint.rendezvous import server as rendezvous

SECRET = b"correct horse battery staple"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDmT1cNnhtrXNHhRkWpCZ8ClN3nc8aUtQj1lnN4hvUCw"


def make_server(num_nodes=3, secret=SECRET, **kwargs):
    kwargs.setdefault("hb_interval", 0.2)
    kwargs.setdefault("hb_timeout", 10.0)  # a stalled test process must not read as "lost"
    server = rendezvous.Server(secret, "job-1", num_nodes, 0, {"client_key": KEY}, 0,
                               host="127.0.0.1", **kwargs)
    return server.start()


def make_client(server_port, index, secret=SECRET, addr=None, **kwargs):
    kwargs.setdefault("hb_interval", 0.2)
    kwargs.setdefault("hb_timeout", 10.0)  # a stalled test process must not read as "lost"
    fields = {"job": f"job-1#{index}", "index": index, "addr": addr or f"10.9.0.{index + 1}",
              "slots": 2, "host_key": KEY}
    return rendezvous.Client(secret, "127.0.0.1", server_port, fields, **kwargs)


def join(client, deadline=5.0):
    welcome = client.register(time.time() + deadline, quiet=True)
    client.ready()
    client.start()
    return welcome


@pytest.fixture
def cleanup():
    things = []
    yield things
    for thing in things:
        if isinstance(thing, rendezvous.Server):
            thing.stop()
        else:
            thing.close()


def main_info():
    return rendezvous.NodeInfo(0, "10.9.0.1", 2, KEY)


def test_all_nodes_register_and_get_go(cleanup):
    server = make_server(4)
    cleanup.append(server)
    clients = [make_client(server.port, i) for i in (3, 1, 2)]
    cleanup.extend(clients)
    for client in clients:
        welcome = join(client)
        assert welcome["client_key"] == KEY
    assert server.wait(5) == []
    table = server.go(lambda t: {"nodes": [[n.index, n.address, n.slots] for n in t]},
                      main_info())
    assert [n.index for n in table] == [0, 1, 2, 3]
    assert [n.address for n in table] == ["10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.0.4"]
    for client in clients:
        kind, msg = client.next_event(5)
        assert kind == "go"
        assert msg["nodes"][1] == [1, "10.9.0.2", 2]


def test_without_secret(cleanup):
    server = make_server(2, secret=None)
    client = make_client(server.port, 1, secret=None)
    cleanup.extend([server, client])
    join(client)
    assert server.wait(5) == []


def test_timeout_names_missing_indices(cleanup):
    server = make_server(4)
    client = make_client(server.port, 2)
    cleanup.extend([server, client])
    join(client)
    assert server.wait(0.5) == [1, 3]


def test_children_may_start_before_the_main_node(cleanup):
    port = _free_port()
    client = make_client(port, 1)
    cleanup.append(client)
    result = {}

    def register():
        result["welcome"] = join(client, deadline=10)

    thread = threading.Thread(target=register)
    thread.start()
    time.sleep(0.5)
    server = rendezvous.Server(SECRET, "job-1", 2, 0, {"client_key": KEY}, port,
                               host="127.0.0.1").start()
    cleanup.append(server)
    thread.join(10)
    assert result["welcome"]["t"] == "welcome"
    assert client.attempts > 1
    assert server.wait(5) == []


def test_register_gives_up_at_deadline():
    client = make_client(_free_port(), 1)
    start = time.time()
    with pytest.raises(rendezvous.RendezvousError, match="could not register"):
        client.register(time.time() + 0.6, quiet=True)
    assert time.time() - start < 6


def test_duplicate_registration_replaces_the_old_entry(cleanup):
    server = make_server(3)
    cleanup.append(server)
    first = make_client(server.port, 1, addr="10.9.0.50")
    cleanup.append(first)
    join(first)
    second = make_client(server.port, 1, addr="10.9.0.51")  # restarted container, new address
    cleanup.append(second)
    join(second)
    other = make_client(server.port, 2)
    cleanup.append(other)
    join(other)
    assert server.wait(5) == []
    table = server.go(lambda t: {"nodes": []}, main_info())
    assert [(n.index, n.address) for n in table] == [
        (0, "10.9.0.1"), (1, "10.9.0.51"), (2, "10.9.0.3")]
    # the replaced connection is closed: that client sees the main node go away
    kind, reason = first.next_event(5)
    assert kind == "lost"


def test_wrong_secret_is_rejected_and_never_listed(cleanup):
    server = make_server(2)
    cleanup.append(server)
    intruder = make_client(server.port, 1, secret=b"wrong", addr="10.9.0.66")
    with pytest.raises(rendezvous.Rejected, match="MNP_SECRET"):
        intruder.register(time.time() + 5, quiet=True)
    assert server.rejected and "authentication failed" in server.rejected[0][1]
    assert server.missing() == [1]
    good = make_client(server.port, 1)
    cleanup.append(good)
    join(good)
    assert server.wait(5) == []
    assert server.table(main_info())[1].address == "10.9.0.2"


def test_secretless_client_is_rejected_by_a_server_with_secret(cleanup):
    server = make_server(2)
    cleanup.append(server)
    client = make_client(server.port, 1, secret=None)
    with pytest.raises(rendezvous.Rejected):
        client.register(time.time() + 5, quiet=True)
    assert server.missing() == [1]


def _raw_hello(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    reader = sock.makefile("rb")
    hello = json.loads(reader.readline())
    return sock, reader, hello


def _register_message(sn, cn="c" * 32, **overrides):
    msg = {"t": "register", "v": 1, "job": "job-1", "index": 1, "addr": "10.9.0.2", "slots": 1,
           "host_key": KEY}
    msg.update(overrides)
    session = protocol.Session(SECRET, sn, cn, protocol.C2S)
    return session.seal(msg)


def test_replayed_registration_is_rejected(cleanup):
    server = make_server(2)
    cleanup.append(server)
    sock, reader, hello = _raw_hello(server.port)
    captured = _register_message(hello["sn"])
    sock.close()
    sock, reader, hello2 = _raw_hello(server.port)
    assert hello2["sn"] != hello["sn"]
    sock.sendall(captured)  # valid HMAC, but for another session's nonce
    answer = json.loads(reader.readline())
    assert answer["t"] == "reject"
    sock.close()
    assert server.missing() == [1]
    assert "nonce" in server.rejected[-1][1]


def test_tampered_registration_is_rejected(cleanup):
    server = make_server(2)
    cleanup.append(server)
    sock, reader, hello = _raw_hello(server.port)
    data = json.loads(_register_message(hello["sn"]))
    data["addr"] = "10.9.0.99"  # changed after the MAC was computed
    sock.sendall(protocol.encode(data))
    assert json.loads(reader.readline())["t"] == "reject"
    sock.close()
    assert "bad HMAC" in server.rejected[-1][1]


@pytest.mark.parametrize("override,reason", [
    ({"index": 0}, "main node"),
    ({"index": 5}, "out of range"),
    ({"index": True}, "out of range"),
    ({"addr": "127.0.0.1"}, "not usable"),
    ({"addr": "169.254.172.2"}, "not usable"),
    ({"addr": "node-1"}, "not IPv4"),
    ({"slots": 0}, "slots"),
    ({"host_key": "ssh-ed25519 AAAA\nevil"}, "host key"),
    ({"host_key": ""}, "no SSH host key"),
    ({"job": "other-job"}, "job id"),
    ({"v": 2}, "version"),
])
def test_invalid_registrations_are_rejected(cleanup, override, reason):
    server = make_server(3)
    cleanup.append(server)
    sock, reader, hello = _raw_hello(server.port)
    sock.sendall(_register_message(hello["sn"], **override))
    assert json.loads(reader.readline())["t"] == "reject"
    sock.close()
    assert reason in server.rejected[-1][1]
    assert server.missing() == [1, 2]


def test_garbage_is_rejected(cleanup):
    server = make_server(2)
    cleanup.append(server)
    sock, reader, hello = _raw_hello(server.port)
    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
    assert json.loads(reader.readline())["t"] == "reject"
    sock.close()


def test_registration_after_go_is_refused(cleanup):
    server = make_server(2)
    client = make_client(server.port, 1)
    cleanup.extend([server, client])
    join(client)
    assert server.go(lambda t: {}, main_info()) is not None
    late = make_client(server.port, 1, addr="10.9.0.77")
    with pytest.raises(rendezvous.Rejected, match="already started"):
        late.register(time.time() + 5, quiet=True)


def test_child_exit_and_loss_after_go_are_events(cleanup):
    server = make_server(3)
    one, two = make_client(server.port, 1), make_client(server.port, 2)
    cleanup.extend([server, one, two])
    join(one)
    join(two)
    server.go(lambda t: {}, main_info())
    assert one.next_event(5)[0] == "go"
    one.report_exit(3)
    assert server.next_event(5) == ("exit", 1, 3)
    two.close()
    kind, index, reason = server.next_event(5)
    assert (kind, index) == ("lost", 2)


def test_silent_child_is_lost(cleanup):
    server = make_server(2, hb_timeout=0.6)
    client = make_client(server.port, 1, hb_interval=100)  # never sends heartbeats
    cleanup.extend([server, client])
    join(client)
    server.go(lambda t: {}, main_info())
    kind, index, reason = server.next_event(5)
    assert (kind, index) == ("lost", 1) and "heartbeat" in reason


def test_done_reaches_children(cleanup):
    server = make_server(2)
    client = make_client(server.port, 1)
    cleanup.extend([server, client])
    join(client)
    server.go(lambda t: {}, main_info())
    assert client.next_event(5)[0] == "go"
    server.done(7)
    kind, msg = client.next_event(5)
    assert kind == "done" and msg["status"] == 7


def test_child_notices_the_main_node_vanishing(cleanup):
    server = make_server(2, hb_interval=100)  # the server stays silent
    client = make_client(server.port, 1, hb_timeout=0.8)
    cleanup.extend([server, client])
    join(client)
    start = time.time()
    kind, reason = client.next_event(10)
    assert kind == "lost" and "no message" in reason
    assert time.time() - start < 6  # its 0.8 s, not the default 15 s


def test_child_notices_the_main_node_closing(cleanup):
    server = make_server(2)
    client = make_client(server.port, 1)
    cleanup.append(client)
    join(client)
    server.stop()
    kind, reason = client.next_event(5)
    assert kind == "lost"


def test_drop_before_go_is_waited_for_again(cleanup):
    server = make_server(2)
    cleanup.append(server)
    client = make_client(server.port, 1)
    join(client)
    assert server.wait(5) == []
    client.close()
    deadline = time.time() + 5
    while not server.missing() and time.time() < deadline:
        time.sleep(0.05)
    assert server.missing() == [1]
    assert server.go(lambda t: {}, main_info()) is None
    again = make_client(server.port, 1)
    cleanup.append(again)
    join(again)
    assert server.wait(5) == []
    assert server.go(lambda t: {}, main_info()) is not None


def _free_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port
