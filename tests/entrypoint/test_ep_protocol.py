"""Message sealing: HMAC, nonces, direction, sequence."""

import json

import pytest

from entrypoint import protocol


def pair(secret=b"k"):
    client = protocol.Session(secret, "s" * 32, "c" * 32, protocol.C2S)
    server = protocol.Session(secret, "s" * 32, "c" * 32, protocol.S2C)
    return client, server


def roundtrip(sender, receiver, message):
    return receiver.open(protocol.decode(sender.seal(message).rstrip(b"\n")))


def test_roundtrip_both_ways():
    client, server = pair()
    assert roundtrip(client, server, {"t": "register", "index": 1})["index"] == 1
    assert roundtrip(server, client, {"t": "welcome"})["t"] == "welcome"
    assert roundtrip(client, server, {"t": "hb"})["seq"] == 1


def test_wrong_secret():
    client, _ = pair(b"one")
    _, server = pair(b"two")
    with pytest.raises(protocol.AuthError, match="HMAC"):
        roundtrip(client, server, {"t": "register"})


def test_replay_within_a_session():
    client, server = pair()
    line = client.seal({"t": "hb"})
    server.open(protocol.decode(line.rstrip(b"\n")))
    with pytest.raises(protocol.AuthError, match="sequence"):
        server.open(protocol.decode(line.rstrip(b"\n")))


def test_reflection_is_refused():
    client, server = pair()
    line = server.seal({"t": "welcome"})
    with pytest.raises(protocol.AuthError, match="direction"):
        server.open(protocol.decode(line.rstrip(b"\n")))


def test_other_session_is_refused():
    client, _ = pair()
    other = protocol.Session(b"k", "x" * 32, "c" * 32, protocol.S2C)
    with pytest.raises(protocol.AuthError, match="nonce"):
        roundtrip(client, other, {"t": "register"})


def test_no_secret_still_checks_sequence():
    client, server = pair(None)
    line = client.seal({"t": "hb"})
    assert "mac" not in json.loads(line)
    server.open(protocol.decode(line.rstrip(b"\n")))
    with pytest.raises(protocol.AuthError):
        server.open(protocol.decode(line.rstrip(b"\n")))


def test_decode_and_line_limits():
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(b"not json")
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(b"[1, 2]")
    buf = protocol.LineBuffer()
    assert buf.feed(b'{"t":"a"}\n{"t"') == [b'{"t":"a"}']
    assert buf.feed(b':"b"}\n') == [b'{"t":"b"}']
    with pytest.raises(protocol.ProtocolError):
        buf.feed(b"x" * (protocol.MAX_LINE + 1))
