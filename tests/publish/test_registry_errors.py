"""Issue 44: registry errors by kind. A refusal (405, ``denied``, ``unsupported``) or a host whose
name does not resolve ends the push at once with one line; only a busy or unreachable registry
(5xx, 429, a refused connection, a time-out: test_push.py) is retried. Each kind comes from a
real server on loopback answering that way (tests/publish/answering_registry.py), through the
real engine, so the messages classified are dockerd's own."""

from __future__ import annotations

import pytest

from matrix.deploy.publish import RetryPolicy, push_stack
from matrix.errors import UserError
from matrix.image import registry as reg
from matrix.image.testrecord import record_pass
from tests.publish.answering_registry import Answer, AnsweringRegistry

pytestmark = pytest.mark.docker

RETRY = RetryPolicy(attempts=3, first_delay_s=0.1)
SHA = "0123abc"
# Each refusal's message differs from its code's stock text: dockerd (20.10) keeps such an error
# whole and gives up on it at once, where a stock-text one is retried inside the engine first
# (five uploads over 50 s) before it reaches us; what reaches us is the same kind either way.
REFUSALS = {
    "405 text": (Answer(405, "Method not allowed", "text/plain"),
                 "HTTP 405 Method Not Allowed ('Method not allowed')"),
    "denied": (Answer.error(403, "DENIED", "push to this repository is not allowed by policy"),
               "denied: push to this repository is not allowed by policy"),
    "unsupported": (Answer.error(405, "UNSUPPORTED", "uploads are disabled on this mirror"),
                    "unsupported: uploads are disabled on this mirror"),
}
BUSY = {
    "503": (Answer(503, "Service Unavailable", "text/plain"),
            "received unexpected HTTP status: 503 Service Unavailable"),
    "502": (Answer(502, "<html>Bad Gateway</html>", "text/html"),
            "received unexpected HTTP status: 502 Bad Gateway"),
    "429": (Answer.error(429, "TOOMANYREQUESTS", "slow down"), "toomanyrequests: slow down"),
}


def _push(client, chain, state_dir, host: str, lines: list[str]):
    record_pass(chain.image_id, chain.stack, state_dir)
    return push_stack(client, chain.layer_refs, chain.final_ref, chain.stack, host, SHA,
                      state_dir=state_dir, retry=RETRY, log=lines.append)


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_a_refused_push_ends_at_once_in_one_line(docker_client, chain, state_dir, kind):
    answer, said = REFUSALS[kind]
    lines: list[str] = []
    with AnsweringRegistry(answer, on="write") as server, pytest.raises(UserError) as failure:
        _push(docker_client, chain, state_dir, server.host, lines)
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith(f"registry {server.host} refused the push of {server.host}/"), message
    assert said in message, message
    assert "invalid character" not in message  # not Docker's raw parse error
    # one upload per blob of the first image (the engine starts them side by side): no retry,
    # in the engine or here
    blobs = len(docker_client.images.get(chain.layer_refs[0]).attrs["RootFS"]["Layers"])
    assert 1 <= server.answered <= blobs
    assert not any("retrying" in line for line in lines), lines


def test_an_unknown_registry_host_ends_at_once_in_one_line(docker_client, chain, state_dir):
    """``.invalid`` never resolves (RFC 6761 section 6.4)."""
    host = "mnp-no-such-registry.invalid:5000"
    lines: list[str] = []
    with pytest.raises(UserError) as failure:
        _push(docker_client, chain, state_dir, host, lines)
    assert str(failure.value) == (
        f"registry host {host} is unknown: the name mnp-no-such-registry.invalid does not "
        f"resolve (no such host); check --registry {host}")
    assert not any("retrying" in line for line in lines), lines


@pytest.mark.parametrize("kind", sorted(BUSY))
def test_a_busy_registry_is_retried_then_said(docker_client, chain, state_dir, kind):
    """A registry answering 5xx or 429 is asked again (here its manifest read answers so: no
    upload is started), then one line with its last answer."""
    answer, said = BUSY[kind]
    lines: list[str] = []
    with AnsweringRegistry(answer, on="read") as server, pytest.raises(UserError) as failure:
        _push(docker_client, chain, state_dir, server.host, lines)
    message = str(failure.value)
    assert "\n" not in message
    assert f"failed after {RETRY.attempts} attempts: registry {server.host} answered {said}" \
        in message, message
    assert server.answered >= RETRY.attempts  # the engine makes a few requests an attempt
    assert sum("retrying in" in line for line in lines) == RETRY.attempts - 1, lines


@pytest.mark.parametrize(("message", "status", "kind"), [
    ('error parsing HTTP 405 response body: invalid character \'M\' looking for beginning of '
     'value: "Method not allowed"', 500, reg.REFUSED),
    ("denied: requested access to the resource is denied", 500, reg.DENIED),
    ("unsupported", 500, reg.REFUSED),
    ('Get "https://x.invalid/v2/": dial tcp: lookup x.invalid on 10.0.0.2:53: no such host', 500,
     reg.UNKNOWN_HOST),
    ("received unexpected HTTP status: 500 Internal Server Error", 500, reg.BUSY),
    ("toomanyrequests: slow down", 429, reg.BUSY),
    ('Get "http://127.0.0.1:9/v2/": dial tcp 127.0.0.1:9: connect: connection refused', 500,
     reg.BUSY),
    ("net/http: TLS handshake timeout", 500, reg.BUSY),
    ("unauthorized: authentication required", 401, reg.AUTH),
    ("manifest unknown", 404, reg.ABSENT),
    ("something the engine never said before", 500, reg.REFUSED),
])
def test_the_kinds_of_the_engines_registry_errors(message, status, kind):
    assert reg.classify(message, status).kind == kind
