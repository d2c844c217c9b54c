"""Issue 44: the image a writer names without ``--image-uri`` (matrix/deploy/digest_uri.py) is
never a digest only this machine's loopback registry holds, and a private-range one is said."""

from __future__ import annotations

import pytest

from matrix.deploy.digest_uri import default_image_uri, reach, registry_host
from matrix.deploy.publish import RetryPolicy, push_stack
from matrix.errors import UserError
from matrix.image.testrecord import record_pass

DIGEST = "sha256:" + "c" * 64
ECR = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/stacks@{DIGEST}"


@pytest.mark.parametrize(("host", "where"), [
    ("127.0.0.1:5599", "loopback"), ("localhost:5000", "loopback"), ("[::1]:5000", "loopback"),
    ("10.0.3.7:5000", "private"), ("172.16.0.9", "private"), ("192.168.1.2:443", "private"),
    ("[fd00::1]:5000", "private"), ("169.254.1.1:5000", "private"),
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com", "public"), ("ghcr.io", "public"),
    ("8.8.8.8:5000", "public"), ("", "public"),
])
def test_registry_hosts_are_told_apart(host, where):
    assert reach(host) == where


def test_a_public_digest_is_the_default_whatever_else_was_pushed():
    found = default_image_uri("mnp-stacks:cpu-tcp", [f"127.0.0.1:5599/mnp-stacks@{DIGEST}",
                                                     f"10.0.0.5:5000/mnp-stacks@{DIGEST}", ECR])
    assert (found.uri, found.note) == (ECR, "")
    assert registry_host(f"mnp-stacks@{DIGEST}") == ""  # Docker Hub
    assert default_image_uri("x:y", [f"mnp-stacks@{DIGEST}"]).uri == f"mnp-stacks@{DIGEST}"


def test_a_private_range_digest_is_used_and_said():
    uri = f"10.0.0.5:5000/mnp-stacks@{DIGEST}"
    found = default_image_uri("mnp-stacks:cpu-tcp", [f"127.0.0.1:5599/mnp-stacks@{DIGEST}", uri])
    assert found.uri == uri
    assert "10.0.0.5:5000, a private-range registry: the job's hosts must reach it" in found.note
    assert "--image-uri" in found.note and "\n" not in found.note


def test_no_digest_at_all_asks_for_image_uri():
    with pytest.raises(UserError, match=r"no pushed digest for mnp-stacks:cpu-tcp in the local "
                                        r"engine; push it first .* pass --image-uri"):
        default_image_uri("mnp-stacks:cpu-tcp", [])


@pytest.mark.docker
def test_after_a_push_to_the_loopback_registry_the_writer_asks_for_image_uri(
        docker_client, chain, registry, state_dir):
    """A real push to the loopback registry leaves its digest in the engine's RepoDigests, as it
    did before `invoke jobdef` wrote 127.0.0.1:5599/...@sha256:... into a job definition."""
    record_pass(chain.image_id, chain.stack, state_dir)
    pushed = push_stack(docker_client, chain.layer_refs, chain.final_ref, chain.stack,
                        registry.host, "0123abc", state_dir=state_dir, log=lambda _: None,
                        retry=RetryPolicy(attempts=2, first_delay_s=0.1))
    digests = docker_client.images.get(chain.final_ref).attrs["RepoDigests"]
    assert pushed.image_digest_uri in digests  # what the writers used to take
    with pytest.raises(UserError) as refused:
        default_image_uri(chain.final_ref, digests)
    message = str(refused.value)
    assert "\n" not in message
    # every loopback registry that holds it is named: other tests push the same chain to theirs
    loopback = message.split("this machine's loopback (", 1)[1].split(")", 1)[0].split(", ")
    assert "pushed only to a registry on this machine's loopback (" in message
    assert registry.host in loopback, message
    assert "pass --image-uri REPO@sha256:..." in message
