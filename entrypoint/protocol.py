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
"""

import binascii
import hashlib
import hmac
import json
import os

VERSION = 1
MAX_LINE = 64 * 1024
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


def decode(line):
    try:
        message = json.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        raise ProtocolError("not a message object")
    return message


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
            if not isinstance(mac, str) or not hmac.compare_digest(
                    mac, compute_mac(self.secret, message)):
                raise AuthError("bad HMAC")
        if message.get("sn") != self.sn or message.get("cn") != self.cn:
            raise AuthError("nonce mismatch (replayed message?)")
        if message.get("dir") != self.incoming:
            raise AuthError("wrong direction (reflected message?)")
        if message.get("seq") != self.seq_in:
            raise AuthError("sequence %r, expected %d (replayed or dropped message?)"
                            % (message.get("seq"), self.seq_in))
        self.seq_in += 1
        return message


class LineBuffer(object):
    """Splits a byte stream into lines; refuses lines longer than ``MAX_LINE``."""

    def __init__(self):
        self.data = b""

    def feed(self, chunk):
        self.data += chunk
        lines = []
        while True:
            pos = self.data.find(b"\n")
            if pos < 0:
                break
            lines.append(self.data[:pos])
            self.data = self.data[pos + 1:]
        if len(self.data) > MAX_LINE:
            raise ProtocolError("line longer than %d bytes" % MAX_LINE)
        return lines
