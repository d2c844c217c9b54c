"""push_stack against a real registry server with real images."""

from __future__ import annotations

import pytest

from matrix.deploy import publish
from matrix.deploy.publish import RetryPolicy, push_stack
from matrix.errors import UserError
from matrix.image.testrecord import record_pass

pytestmark = pytest.mark.docker

FAST_RETRY = RetryPolicy(attempts=2, first_delay_s=0.1)
SHA = "0123abc"


def _push(client, chain, registry, state_dir, **kwargs):
    kwargs.setdefault("log", lambda line: None)
    kwargs.setdefault("retry", FAST_RETRY)
    return push_stack(
        client,
        chain.layer_refs,
        chain.final_ref,
        chain.stack,
        registry.host,
        SHA,
        state_dir=state_dir,
        **kwargs,
    )


def _uploads(requests: list[str]) -> list[str]:
    """Requests that write to the registry (blob uploads and manifest puts)."""
    return [line for line in requests if line.split(" ")[0] in {"POST", "PUT", "PATCH"}]


def test_push_then_push_again_sends_nothing(docker_client, chain, registry, state_dir):
    record_pass(chain.image_id, chain.stack, state_dir)

    first = _push(docker_client, chain, registry, state_dir)

    assert [tag.action for tag in first.layers] == ["pushed", "pushed"]
    assert [tag.ref.rsplit(":", 1)[1] for tag in first.final] == [f"tinystack-{SHA}", "tinystack"]
    assert first.blobs_pushed > 0
    # Every digest the push reported is what the registry itself serves for that tag.
    for tag in first.layers + first.final:
        repo, reference = tag.ref.split("/", 1)[1].rsplit(":", 1)
        assert registry.manifest_digest(repo, reference) == tag.digest
    # The final tags name the same manifest as the last layer's content tag.
    assert {tag.digest for tag in first.final} == {first.layers[-1].digest}
    assert first.image_digest_uri == f"{registry.host}/{chain.repo}@{first.layers[-1].digest}"

    offset = registry.log_size()
    lines: list[str] = []
    second = _push(docker_client, chain, registry, state_dir, log=lines.append)

    assert second.pushed == []
    assert second.blobs_pushed == 0
    assert {tag.action for tag in second.layers + second.final} == {"present"}
    assert _uploads(registry.requests_since(offset)) == []
    assert [tag.digest for tag in second.final] == [tag.digest for tag in first.final]
    # The push ends with counts, not a list of TagPush objects.
    assert lines[-1] == (f"tinystack: 0 tag(s) pushed, 4 already present, 0 kept; 0 new blobs "
                         f"sent to {registry.host}; image: {second.image_digest_uri}")
    assert first.summary().startswith("tinystack: 4 tag(s) pushed, 0 already present, 0 kept; ")


def test_untested_image_is_refused(docker_client, chain, registry, state_dir):
    offset = registry.log_size()
    with pytest.raises(UserError, match=r"no passing test record.*invoke test --stack tinystack"):
        _push(docker_client, chain, registry, state_dir)
    assert registry.requests_since(offset) == []


def test_force_pushes_untested_image_loudly(docker_client, chain, registry, state_dir):
    lines: list[str] = []
    result = _push(docker_client, chain, registry, state_dir, force=True, log=lines.append)
    assert result.forced
    assert any("WARNING" in line and "WITHOUT passing tests" in line for line in lines)
    assert registry.manifest_digest(chain.repo, "tinystack") == result.final[-1].digest


def test_a_test_record_for_another_image_does_not_count(docker_client, chain, registry, state_dir):
    record_pass("sha256:" + "0" * 64, chain.stack, state_dir)
    with pytest.raises(UserError, match="no passing test record"):
        _push(docker_client, chain, registry, state_dir)


def test_registry_down_mid_push_then_retry_completes(docker_client, chain, registry, state_dir):
    record_pass(chain.image_id, chain.stack, state_dir)
    lines: list[str] = []

    def stop_after_first_layer(line: str) -> None:
        lines.append(line)
        if line.strip().startswith("pushed") and chain.layer_refs[0].split(":")[1] in line:
            registry.stop()

    with pytest.raises(UserError) as failure:
        _push(docker_client, chain, registry, state_dir, log=stop_after_first_layer)
    message = str(failure.value)
    assert "\n" not in message
    assert "after 2 attempts" in message and "run the push again" in message
    assert any("retrying" in line for line in lines)
    # The stack's tags never moved: the final image was not tagged while layers were missing.
    registry.start()
    assert registry.manifest_digest(chain.repo, "tinystack") is None

    result = _push(docker_client, chain, registry, state_dir)
    assert [tag.action for tag in result.layers] == ["present", "pushed"]
    assert [tag.action for tag in result.final] == ["pushed", "pushed"]
    assert registry.manifest_digest(chain.repo, "tinystack") == result.layers[-1].digest


def test_digest_mismatch_is_an_error(docker_client, chain, registry, state_dir, monkeypatch):
    record_pass(chain.image_id, chain.stack, state_dir)
    real_push_once = publish._push_once

    def engine_reports_another_digest(*args, **kwargs):
        digest, blobs = real_push_once(*args, **kwargs)
        return "sha256:" + "f" * 64, blobs

    monkeypatch.setattr(publish, "_push_once", engine_reports_another_digest)
    with pytest.raises(UserError, match="digest mismatch for .*registry has sha256:"):
        _push(docker_client, chain, registry, state_dir)
    assert registry.manifest_digest(chain.repo, "tinystack") is None


def test_immutable_stack_tag_is_kept_not_fatal(
    docker_client, chain, registry, state_dir, monkeypatch
):
    """An ECR-style immutable refusal of the moving <stack> tag leaves it and warns."""
    record_pass(chain.image_id, chain.stack, state_dir)
    real_push_once = publish._push_once

    def immutable_stack_tag(client, remote_repo, tag, target, *rest):
        if tag == chain.stack:
            raise publish._TagExists(
                f"tag invalid: The image tag '{tag}' already exists in the 'x' repository and "
                "cannot be overwritten because the repository is immutable."
            )
        return real_push_once(client, remote_repo, tag, target, *rest)

    monkeypatch.setattr(publish, "_push_once", immutable_stack_tag)
    lines: list[str] = []
    result = _push(docker_client, chain, registry, state_dir, log=lines.append)
    assert [tag.action for tag in result.final] == ["pushed", "kept"]
    assert any(line.strip().startswith("kept") and "immutable" in line for line in lines)
    assert result.image_digest_uri.endswith(result.final[0].digest)


def test_missing_local_image_says_how_to_build(docker_client, chain, registry, state_dir):
    with pytest.raises(UserError, match=r"not in the local engine; run `invoke build --stack x`"):
        push_stack(
            docker_client, [f"{chain.repo}:nope"], f"{chain.repo}:x", "x", registry.host, SHA
        )


def test_final_ref_must_be_the_last_layer(docker_client, chain, registry, state_dir):
    with pytest.raises(UserError, match="is not the last layer"):
        push_stack(
            docker_client,
            chain.layer_refs[:1],
            chain.final_ref,
            chain.stack,
            registry.host,
            SHA,
            state_dir=state_dir,
        )


@pytest.mark.parametrize("bad", ["", "http://", "host name", "reg:port:x"])
def test_bad_registry_is_one_clear_line(docker_client, chain, state_dir, bad):
    record_pass(chain.image_id, chain.stack, state_dir)
    with pytest.raises(UserError, match="--registry"):
        push_stack(
            docker_client,
            chain.layer_refs,
            chain.final_ref,
            chain.stack,
            bad,
            SHA,
            state_dir=state_dir,
        )


def test_registry_that_never_answers(docker_client, chain, state_dir, unused_port):
    record_pass(chain.image_id, chain.stack, state_dir)

    with pytest.raises(UserError, match=r"checking 127\.0\.0\.1:\d+/.*failed after 2 attempts"):
        push_stack(
            docker_client,
            chain.layer_refs,
            chain.final_ref,
            chain.stack,
            f"127.0.0.1:{unused_port}",
            SHA,
            state_dir=state_dir,
            retry=FAST_RETRY,
            log=lambda line: None,
        )


def test_registry_that_accepts_uploads_and_never_answers(
    docker_client, chain, registry, state_dir
):
    """A stalled blob upload times out per request, is retried, then ends in one line."""
    from tests.publish.stall_proxy import StallProxy

    record_pass(chain.image_id, chain.stack, state_dir)
    lines: list[str] = []
    policy = RetryPolicy(attempts=2, first_delay_s=0.1, stall_s=5)
    with StallProxy(registry.port) as proxy, pytest.raises(UserError) as failure:
        push_stack(docker_client, chain.layer_refs, chain.final_ref, chain.stack, proxy.host, SHA,
                   state_dir=state_dir, retry=policy, log=lines.append)
    message = str(failure.value)
    assert "\n" not in message
    assert f"pushing {proxy.host}/{chain.repo}:" in message and "after 2 attempts" in message
    assert f"registry {proxy.host} stalled while pushing" in message
    assert "no answer within 5 s" in message
    assert any("retrying" in line for line in lines)
    assert proxy.stalled  # it really was the upload that got no answer
    assert registry.manifest_digest(chain.repo, "tinystack") is None
