"""Message sealing: HMAC, nonces, direction, sequence."""

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.rendezvous import protocol


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


# -- bounded, typed decoding (issue 12) ----------------------------------------------------

def test_deep_nesting_is_refused_before_the_parser():
    for depth in (9, 1000, 30000):
        line = b"[" * depth + b"]" * depth
        with pytest.raises(protocol.ProtocolError, match="nested deeper"):
            protocol.decode(b'{"t":"x","a":' + line + b"}")
    # brackets inside strings (escaped quotes too) are text, not nesting
    text = '{"t":"x","a":"[[[[[[[[[[[[\\"[[[[[[[[[[","b":[[[[[[1]]]]]]}'
    assert protocol.decode(text.encode())["a"].startswith("[[[")


def test_decode_refuses_nan_oversize_and_non_bytes():
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(b'{"t":"x","a":NaN}')
    with pytest.raises(protocol.ProtocolError, match="longer"):
        protocol.decode(b'{"t":"x"}' + b" " * protocol.MAX_LINE)
    with pytest.raises(protocol.ProtocolError, match="longer"):
        protocol.decode(b'{"t":"x"}' + b" " * 100, max_line=50)
    with pytest.raises(protocol.ProtocolError):
        protocol.decode('{"t":"x"}')


def test_a_complete_line_over_the_limit_is_refused():
    buf = protocol.LineBuffer(max_line=100)
    with pytest.raises(protocol.ProtocolError, match="longer than 100"):
        buf.feed(b"x" * 200 + b"\n")
    buf = protocol.LineBuffer(max_line=100)
    assert buf.feed(b"y" * 100 + b"\n") == [b"y" * 100]


@pytest.mark.parametrize("field,value", [
    ("mac", "\u00e9" * 64), ("mac", ["a"]), ("mac", "A" * 64), ("seq", True), ("seq", "0"),
    ("sn", ["s"]), ("cn", 7), ("dir", None), ("cn", "c" * 32 + "\n"),
])
def test_session_fields_are_type_checked_before_comparison(field, value):
    client, server = pair()
    message = json.loads(client.seal({"t": "hb"}))
    message[field] = value
    with pytest.raises(protocol.AuthError):
        server.open(message)
    if field != "mac":  # without a secret the MAC is not checked, the rest is
        _, plain = pair(None)
        with pytest.raises(protocol.AuthError):
            plain.open(message)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_decode_of_any_bytes_is_a_message_or_a_protocol_error(data):
    try:
        message = protocol.decode(data)
    except protocol.ProtocolError:
        return
    assert isinstance(message, dict) and isinstance(message["t"], str)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["t", "sn", "cn", "dir", "seq", "mac", "index"]),
                       JSON_VALUES, max_size=7))
def test_open_of_any_json_object_is_the_message_or_an_auth_error(message):
    for secret in (b"k", None):
        _, server = pair(secret)
        with contextlib.suppress(protocol.AuthError):
            assert server.open(message) is message
