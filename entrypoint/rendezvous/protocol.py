"""Rendezvous wire format: newline-delimited JSON over TCP, every message authenticated.

A connection is a session between one child and the main node:

1. main -> child ``hello``: ``{"t": "hello", "v": 1, "sn": <server nonce>}`` (the challenge).
2. child -> main ``register``: index, address, slots, SSH host public key, job id,
   ``cn`` (client nonce).
3. main -> child ``welcome`` (the main node's SSH client public key) or ``reject`` (reason).
4. child -> main ``ready`` once sshd runs and ``authorized_keys`` is written.
5. Then ``hb`` (heartbeat) both ways; main -> child ``go`` (the node table, the launcher may
   start) and ``done`` (the job ended, with its status); child -> main ``exit`` (a launcher that
   runs on the child, i.e. torchrun, ended, with its status).

With a secret, every message after ``hello`` carries ``mac`` = HMAC-SHA256(secret, canonical JSON
of the message without ``mac``). The canonical JSON includes both nonces, the direction and a
per-direction sequence number, so a message cannot be replayed into another session (the server
nonce is fresh per connection), reflected back to its sender (direction), or replayed, dropped or
reordered within its session (sequence). Without a secret the same fields are sent without
``mac``; anybody who can reach the port can join, and the entrypoint warns about it once.

Only public keys, addresses and counts cross the network.

Decoding is bounded and typed before anything uses a message (a peer may send anything):
a line is at most ``MAX_LINE`` bytes (``MAX_HELLO_LINE`` before a connection authenticates),
JSON nesting deeper than ``MAX_DEPTH`` is refused before ``json`` sees it (so 30,000 ``[`` cannot
reach the parser's recursion), ``NaN``/``Infinity`` are refused, and the session fields
(nonces, direction, sequence, MAC) are type-checked before they are compared.
"""

import binascii
import hashlib
import hmac
import json
import os
import re

VERSION = 1
MAX_LINE = 64 * 1024
# A register message is under 2 KB (an ssh-rsa 4096 host key is ~750 bytes); before a connection
# has authenticated it may not make the server buffer more than this.
MAX_HELLO_LINE = 8 * 1024
# Deepest legitimate message: {"nodes": [[index, addr, slots], ...]} is 3 levels.
MAX_DEPTH = 8
MAC_RE = re.compile(r"^[0-9a-f]{64}\Z")
NONCE_RE = re.compile(r"^[0-9A-Za-z_-]{16,128}\Z")
_JSON_SIGNIFICANT = re.compile(r'["\\\[\]{}]')
C2S = "c2s"
S2C = "s2c"


class ProtocolError(Exception):
    """A malformed or unexpected message."""


class AuthError(ProtocolError):
    """A message whose HMAC, nonces or sequence number do not check out."""


def new_nonce():
    return binascii.hexlify(os.urandom(16)).decode("ascii")


def canonical(message):
    body = dict((k, v) for k, v in message.items() if k != "mac")
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def compute_mac(secret, message):
    return hmac.new(secret, canonical(message), hashlib.sha256).hexdigest()


def encode(message):
    data = json.dumps(message, sort_keys=True, separators=(",", ":")).encode("utf-8") + b"\n"
    if len(data) > MAX_LINE:
        raise ProtocolError("message too long (%d bytes)" % len(data))
    return data


def check_depth(text, limit=MAX_DEPTH):
    """Raise ``ProtocolError`` if JSON ``text`` nests arrays/objects deeper than ``limit``.

    Scans only quotes, backslashes and brackets (brackets inside strings do not count), so it is
    linear and cheap; ``json.loads`` is recursive and would hit ``RecursionError`` on deep input."""
    if text.count("[") + text.count("{") <= limit:
        return
    depth = 0
    in_string = False
    escaped_at = -1
    for match in _JSON_SIGNIFICANT.finditer(text):
        pos = match.start()
        char = text[pos]
        if pos == escaped_at:
            continue
        if in_string:
            if char == "\\":
                escaped_at = pos + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                raise ProtocolError("JSON nested deeper than %d levels" % limit)
        elif char in "]}":
            depth -= 1


def _no_constant(name):
    raise ValueError("%s is not JSON" % name)


def decode(line, max_line=MAX_LINE):
    """Bytes of one line -> message dict with a string ``t``; ``ProtocolError`` otherwise."""
    if not isinstance(line, bytes) or len(line) > max_line:
        raise ProtocolError("line longer than %d bytes" % max_line)
    try:
        text = line.decode("utf-8")
        check_depth(text)
        message = json.loads(text, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ProtocolError("not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        raise ProtocolError("not a message object")
    return message


def is_int(value):
    """An ``int`` that is not a ``bool`` (JSON ``true`` decodes to ``True == 1``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_session_fields(message):
    """Type-check the fields ``Session.open`` compares, before any comparison uses them."""
    for name in ("sn", "cn"):
        if not isinstance(message.get(name), str) or not NONCE_RE.match(message[name]):
            raise AuthError("%s is not a nonce" % name)
    if message.get("dir") not in (C2S, S2C):
        raise AuthError("direction is not %s or %s" % (C2S, S2C))
    if not is_int(message.get("seq")):
        raise AuthError("sequence number is not an integer")


class Session(object):
    """One side of an authenticated session: seals outgoing and opens incoming messages."""

    def __init__(self, secret, server_nonce, client_nonce, outgoing):
        self.secret = secret
        self.sn = server_nonce
        self.cn = client_nonce
        self.outgoing = outgoing
        self.incoming = S2C if outgoing == C2S else C2S
        self.seq_out = 0
        self.seq_in = 0

    def seal(self, message):
        message = dict(message)
        message.update({"sn": self.sn, "cn": self.cn, "dir": self.outgoing, "seq": self.seq_out})
        self.seq_out += 1
        if self.secret is not None:
            message["mac"] = compute_mac(self.secret, message)
        return encode(message)

    def open(self, message):
        """Check an incoming decoded message; returns it or raises ``AuthError``."""
        if self.secret is not None:
            mac = message.get("mac")
            # compare_digest raises TypeError on a non-ASCII str: check the shape first
            if not isinstance(mac, str) or not MAC_RE.match(mac) or not hmac.compare_digest(
                    mac, compute_mac(self.secret, message)):
                raise AuthError("bad HMAC")
        check_session_fields(message)
        if message.get("sn") != self.sn or message.get("cn") != self.cn:
            raise AuthError("nonce mismatch (replayed message?)")
        if message.get("dir") != self.incoming:
            raise AuthError("wrong direction (reflected message?)")
        if message.get("seq") != self.seq_in:
            raise AuthError("sequence %d, expected %d (replayed or dropped message?)"
                            % (message["seq"], self.seq_in))
        self.seq_in += 1
        return message


class LineBuffer(object):
    """Splits a byte stream into lines; refuses lines longer than ``max_line`` (complete or not).

    ``max_line`` may be raised later (``MAX_HELLO_LINE`` before authentication, ``MAX_LINE``
    after)."""

    def __init__(self, max_line=MAX_LINE):
        self.data = b""
        self.max_line = max_line

    def feed(self, chunk):
        self.data += chunk
        lines = []
        while True:
            pos = self.data.find(b"\n")
            if pos < 0:
                break
            if pos > self.max_line:
                raise ProtocolError("line longer than %d bytes" % self.max_line)
            lines.append(self.data[:pos])
            self.data = self.data[pos + 1:]
        if len(self.data) > self.max_line:
            raise ProtocolError("line longer than %d bytes" % self.max_line)
        return lines
