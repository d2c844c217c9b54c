"""Publish a built stack to a registry.

A stack is a chain of layer images, each tagged by the hash of its build inputs
(``repo:<content tag>``), the last of which is the stack's final image (also ``repo:<stack>``).
:func:`push_stack` publishes it in two phases:

1. every layer image under its content tag, skipping tags the registry already has (a content
   tag names its inputs, so it never needs re-pushing, and immutable repositories refuse it);
2. only when every layer is in, the final image under ``<stack>-<git sha>`` and ``<stack>``.

After each push the manifest digest is read back from the registry through the engine and must
equal the digest the engine reported. The final image must have passed its tests
(:mod:`matrix.image.testrecord`) unless ``force`` is given. Registry errors go by kind
(matrix/image/registry.py ``classify``): only a busy or unreachable registry (5xx, 429, a refused,
lost or timed-out connection) is retried with exponential backoff; a registry that stays down
ends the push with one :class:`UserError`, and running the push again later resumes where it
stopped (finished tags are skipped). A refusal (405, ``denied``, ``unsupported``, any other 4xx)
or a registry host whose name does not resolve ends it at once, in one line.

Every registry call goes through the engine, so a registry that accepts a blob upload and never
answers shows up as an engine call with no progress: each call runs with a read timeout of
``RetryPolicy.stall_s`` (per request and per streamed event, not per push), so a stall is a
transient error like any other: retried, then one line naming the registry and what stalled.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import docker
import docker.errors
import requests
import urllib3
from docker.utils import parse_repository_tag

from matrix.deploy import ecr
from matrix.errors import UserError
from matrix.image import registry as reg
from matrix.image.testrecord import DEFAULT_STATE_DIR, has_passed

Log = Callable[[str], None]

_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REGISTRY = re.compile(r"^[A-Za-z0-9.-]+(?::\d+)?(?:/[a-z0-9._/-]+)?$")
@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for transient registry errors: ``attempts`` tries in all, waiting
    ``first_delay_s``, then ``factor`` times longer each time, never more than ``max_delay_s``.

    ``stall_s`` is how long one registry call may go without a byte of answer (a manifest
    check, or the gap between two progress events of a push) before it counts as stalled; a
    blob upload reports progress as it goes, so this bounds a silent wait, not an upload.
    """

    attempts: int = 4
    first_delay_s: float = 2.0
    factor: float = 2.0
    max_delay_s: float = 30.0
    stall_s: float = 120.0

    def delays(self) -> Iterable[float]:
        """The waits between attempts (``attempts - 1`` of them)."""
        delay = self.first_delay_s
        for _ in range(self.attempts - 1):
            yield min(delay, self.max_delay_s)
            delay *= self.factor


@dataclass(frozen=True)
class TagPush:
    """What happened to one remote tag.

    ``action`` is ``pushed`` (sent now), ``present`` (the registry already had it, nothing sent)
    or ``kept`` (an immutable tag already pointing elsewhere; left as it is). ``blobs_pushed``
    counts layer blobs uploaded for it (0 unless pushed).
    """

    ref: str
    digest: str
    action: str
    blobs_pushed: int = 0


@dataclass
class PushResult:
    """The outcome of :func:`push_stack`: layer tags, then final tags, in push order."""

    stack: str
    registry: str
    image_id: str
    forced: bool
    layers: list[TagPush] = field(default_factory=list)
    final: list[TagPush] = field(default_factory=list)

    @property
    def pushed(self) -> list[TagPush]:
        """Tags sent in this run."""
        return [tag for tag in self.layers + self.final if tag.action == "pushed"]

    @property
    def blobs_pushed(self) -> int:
        """Layer blobs uploaded in this run (0 when the registry already had everything)."""
        return sum(tag.blobs_pushed for tag in self.layers + self.final)

    def summary(self) -> str:
        """One line for the end of a push: counts, never the tag objects themselves."""
        tags = self.layers + self.final
        counts = {action: sum(tag.action == action for tag in tags)
                  for action in ("pushed", "present", "kept")}
        blobs = self.blobs_pushed
        return (f"{self.stack}: {counts['pushed']} tag(s) pushed, {counts['present']} already "
                f"present, {counts['kept']} kept; {blobs} new blob{'s' if blobs != 1 else ''} "
                f"sent to {self.registry}; image: {self.image_digest_uri}")

    @property
    def image_digest_uri(self) -> str | None:
        """The pushed final image by digest (``registry/repo@sha256:...``), for job definitions.

        Taken from a stack tag that points at this image, else from the last layer's content
        tag when it was pushed in this run; None when neither holds (e.g. every tag was kept).
        """
        candidates = [tag for tag in self.final if tag.action in ("pushed", "present")]
        candidates += [tag for tag in self.layers[-1:] if tag.action == "pushed"]
        if not candidates:
            return None
        return f"{candidates[0].ref.rsplit(':', 1)[0]}@{candidates[0].digest}"


class _Transient(Exception):
    """A registry error worth retrying (connection refused, 5xx, timeouts...)."""


# What a call through the engine raises when it gets no answer in time or loses its connection.
_NO_ANSWER = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError,
              http.client.HTTPException, ConnectionError, TimeoutError)


@contextlib.contextmanager
def _stall_timeout(client: docker.DockerClient, seconds: float) -> Iterator[None]:
    """Run engine calls with a read timeout of ``seconds`` (docker-py reads ``api.timeout`` per
    request and applies it to every read of a streamed answer)."""
    saved = client.api.timeout
    client.api.timeout = seconds
    try:
        yield
    finally:
        client.api.timeout = saved


def _stalled(exc: BaseException, base: str, doing: str, seconds: float) -> _Transient:
    """A transient error naming the registry and what stalled."""
    kind = "stalled" if "timed out" in str(exc).lower() else "lost the connection"
    return _Transient(f"registry {base} {kind} while {doing} (no answer within {seconds:g} s: "
                      f"{type(exc).__name__})")


class _TagExists(Exception):
    """The registry refused the push because the (immutable) tag already exists."""


@dataclass(frozen=True)
class _Target:
    """Where to push: the registry base (host[:port][/prefix]) and the credentials to use."""

    base: str
    auth_config: dict[str, str] | None

    def remote_repo(self, repo: str) -> str:
        """``base/repo`` with any registry host already in ``repo`` dropped."""
        return f"{self.base}/{_local_path(repo)}"


def _local_path(repo: str) -> str:
    """The repository path of a local reference, without a registry host if it has one."""
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return rest
    return repo


def _split_ref(ref: str, what: str) -> tuple[str, str]:
    """``repo:tag`` -> (repo, tag); a reference without a tag is a UserError."""
    repo, tag = parse_repository_tag(ref)
    if not tag or "@" in repo:
        raise UserError(f"{what} {ref!r} must be a tagged reference repo:tag")
    return repo, tag


def _local_image(client: docker.DockerClient, ref: str, stack: str) -> Any:
    """The local image ``ref``; a missing one is a UserError that says how to build it."""
    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise UserError(
            f"image {ref} is not in the local engine; run `invoke build --stack {stack}` first"
        ) from None


def _registry_base(registry: str) -> str:
    """``registry`` without scheme or trailing slash, checked for shape."""
    base = re.sub(r"^https?://", "", registry.strip()).rstrip("/")
    if not base or not _REGISTRY.match(base):
        raise UserError(f"--registry {registry!r} is not a registry host[:port][/path]")
    return base


def _prepare_target(registry: str, repos: Iterable[str], ecr_client: Any, log: Log) -> _Target:
    """Credentials and repositories for ``registry``.

    For ECR: a token from GetAuthorizationToken and every repository created when missing. For
    any other registry: no explicit credentials, so the engine's own (``docker login``) apply.
    """
    base = _registry_base(registry)
    target = ecr.parse_ecr_registry(base)
    if target is None:
        return _Target(base, None)
    client = ecr_client if ecr_client is not None else ecr.ecr_client(target)
    auth = ecr.get_auth_config(client, target)
    for repo in dict.fromkeys(_local_path(repo) for repo in repos):
        ecr.ensure_repository(client, target, target.repository_name(repo), log)
    return _Target(base, auth)


def _classify(message: str, target: _Target, doing: str, status: int = 0) -> Exception:
    """The exception a registry error ``message`` stands for while ``doing`` (matrix/image/
    registry.py classify): only a busy or unreachable registry (5xx, 429, a refused, lost or
    timed-out connection) is :class:`_Transient`; a refusal (405, ``denied``, ``unsupported``,
    any other 4xx) or an unknown host is one UserError at once, since no retry changes it."""
    if ecr.is_already_exists_error(message):
        return _TagExists(message)
    found = reg.classify(message, status)
    if found.retried:
        return _Transient(f"registry {target.base} answered {found.reason}")
    if found.kind == reg.UNKNOWN_HOST:
        return UserError(f"registry host {reg.host(target.base)} is unknown: "
                         f"{found.reason}; check --registry {target.base}")
    hint = (f"; check the credentials (`{reg.login_hint(target.base)}`) and the "
            f"repository's permissions" if found.kind in (reg.AUTH, reg.DENIED) else "")
    return UserError(f"registry {target.base} refused {doing}: {found.reason}{hint}")


def _remote_digest(client: docker.DockerClient, ref: str, target: _Target,
                   stall_s: float = RetryPolicy.stall_s) -> str | None:
    """The registry's manifest digest for ``ref``, or None when the tag does not exist."""
    try:
        with _stall_timeout(client, stall_s):
            return client.images.get_registry_data(ref, auth_config=target.auth_config).id
    except docker.errors.NotFound:
        return None
    except docker.errors.APIError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        raise _classify(str(exc.explanation or exc), target, f"reading the manifest of {ref}",
                        status) from None
    except _NO_ANSWER as exc:
        raise _stalled(exc, target.base, f"reading the manifest of {ref}", stall_s) from None


def _push_once(
    client: docker.DockerClient, remote_repo: str, tag: str, target: _Target,
    stall_s: float = RetryPolicy.stall_s,
) -> tuple[str, int]:
    """Push ``remote_repo:tag`` once; (digest the engine reported, blobs uploaded)."""
    digest, blobs = None, 0
    try:
        with _stall_timeout(client, stall_s):
            digest, blobs = _push_events(client, remote_repo, tag, target)
    except docker.errors.APIError as exc:
        raise _classify(str(exc.explanation or exc), target,
                        f"the push of {remote_repo}:{tag}") from None
    except _NO_ANSWER as exc:
        raise _stalled(exc, target.base, f"pushing {remote_repo}:{tag}", stall_s) from None
    if digest is None:
        raise _Transient(f"push of {remote_repo}:{tag} ended without a digest")
    return digest, blobs


def _push_events(
    client: docker.DockerClient, remote_repo: str, tag: str, target: _Target
) -> tuple[str | None, int]:
    """Stream one push's events; (digest the engine reported or None, blobs uploaded)."""
    digest, blobs = None, 0
    stream = client.images.push(
        remote_repo, tag=tag, stream=True, decode=True, auth_config=target.auth_config
    )
    for event in stream:
        if "error" in event:
            detail = event.get("errorDetail", {}).get("message") or event["error"]
            raise _classify(str(detail), target, f"the push of {remote_repo}:{tag}")
        if event.get("status") == "Pushed":
            blobs += 1
        aux = event.get("aux") or {}
        if aux.get("Digest") and aux.get("Tag") == tag:
            digest = aux["Digest"]
    return digest, blobs


def _retrying(action: Callable[[], Any], what: str, policy: RetryPolicy, log: Log) -> Any:
    """Run ``action``, retrying :class:`_Transient` errors with backoff; a UserError at the end."""
    delays = iter(policy.delays())
    while True:
        try:
            return action()
        except _Transient as exc:
            delay = next(delays, None)
            if delay is None:
                raise UserError(
                    f"{what} failed after {policy.attempts} attempts: {exc} "
                    "(tags already pushed stay; run the push again when the registry is back)"
                ) from None
            log(f"  {exc}; retrying in {delay:g}s")
            time.sleep(delay)


def _push_tag(
    client: docker.DockerClient,
    image: Any,
    remote_repo: str,
    tag: str,
    target: _Target,
    policy: RetryPolicy,
    log: Log,
    *,
    content_tag: bool,
) -> TagPush:
    """Push ``image`` as ``remote_repo:tag``, verify the digest, and return what happened.

    A tag the registry already has for this image is not pushed (see :func:`_holds`); an
    immutable tag that already exists elsewhere is left as it is (``kept``).
    """
    ref = f"{remote_repo}:{tag}"

    def registry_digest(doing: str) -> str | None:
        return _retrying(lambda: _remote_digest(client, ref, target, policy.stall_s),
                         f"{doing} {ref}", policy, log)

    existing = registry_digest("checking")
    if existing is not None and _holds(image, remote_repo, existing, content_tag=content_tag):
        log(f"  present {ref} ({existing})")
        return TagPush(ref, existing, "present")
    image.tag(remote_repo, tag)
    try:
        digest, blobs = _retrying(
            lambda: _push_once(client, remote_repo, tag, target, policy.stall_s),
            f"pushing {ref}", policy, log,
        )
    except _TagExists:
        current = registry_digest("checking")
        log(f"  kept    {ref} ({current}): the registry's tags are immutable")
        return TagPush(ref, current or "", "kept")
    readback = registry_digest("verifying")
    if readback != digest:
        raise UserError(
            f"digest mismatch for {ref}: the engine pushed {digest}, the registry has {readback}"
        )
    log(f"  pushed  {ref} ({digest}, {blobs} new blob{'s' if blobs != 1 else ''})")
    return TagPush(ref, digest, "pushed", blobs)


def _holds(image: Any, remote_repo: str, digest: str, *, content_tag: bool) -> bool:
    """Whether the registry's ``digest`` already serves for ``image`` under this tag.

    A content tag is satisfied by any image built from the same inputs, so its mere presence
    counts. A stack tag must point at this very image: the digest must be one the engine
    recorded for this image in ``remote_repo`` when it pushed or pulled it.
    """
    if content_tag:
        return True
    image.reload()
    return f"{remote_repo}@{digest}" in (image.attrs.get("RepoDigests") or [])


def _check_gate(image_id: str, stack: str, force: bool, state_dir: Path, log: Log) -> None:
    """Refuse an untested image unless ``force``; with ``force``, say so loudly."""
    if has_passed(image_id, state_dir):
        return
    if not force:
        raise UserError(
            f"stack {stack}: image {image_id} has no passing test record; "
            f"run `invoke test --stack {stack}` (or push with --force in an emergency)"
        )
    banner = "!" * 78
    log(banner)
    log(f"WARNING: --force: pushing stack {stack} image {image_id} WITHOUT passing tests")
    log(banner)


def push_stack(
    client: docker.DockerClient,
    layer_refs: list[str],
    final_ref: str,
    stack: str,
    registry: str,
    git_sha: str,
    *,
    force: bool = False,
    log: Log = print,
    state_dir: Path = DEFAULT_STATE_DIR,
    retry: RetryPolicy | None = None,
    ecr_client: Any = None,
    summary: bool = True,
) -> PushResult:
    """Publish ``stack`` to ``registry``: layers by content tag, then ``<stack>-<git_sha>`` and
    ``<stack>``.

    ``layer_refs`` are local ``repo:<content tag>`` references in build order (base first);
    the last is the same image as ``final_ref`` (``repo:<stack>``). ``registry`` is an ECR
    registry (``<acct>.dkr.ecr.<region>.amazonaws.com[/prefix]``; credentials and repositories
    through ``ecr_client`` or a boto3 client) or any ``host[:port][/prefix]`` (the engine's own
    credentials). ``state_dir`` holds the test records; ``retry`` the backoff for transient
    registry errors. Raises :class:`UserError` with one line on any failure.
    """
    if not layer_refs:
        raise UserError(f"stack {stack}: no layer images to push")
    if not _TAG.match(f"{stack}-{git_sha}"):
        raise UserError(f"git sha {git_sha!r} does not make a valid tag for stack {stack}")
    policy = retry or RetryPolicy()
    layers = [(ref, *_split_ref(ref, "layer image")) for ref in layer_refs]
    final_repo, _ = _split_ref(final_ref, "final image")
    images = {ref: _local_image(client, ref, stack) for ref, _, _ in layers}
    final_image = _local_image(client, final_ref, stack)
    if final_image.id != images[layer_refs[-1]].id:
        raise UserError(
            f"stack {stack}: {final_ref} ({final_image.id}) is not the last layer "
            f"{layer_refs[-1]} ({images[layer_refs[-1]].id}); rebuild the stack"
        )
    _check_gate(final_image.id, stack, force, state_dir, log)

    repos = [repo for _, repo, _ in layers] + [final_repo]
    target = _prepare_target(registry, repos, ecr_client, log)
    result = PushResult(stack, target.base, final_image.id, forced=force)
    log(f"pushing {len(layers)} layer image(s) of {stack} to {target.base}")
    for ref, repo, tag in layers:
        remote = target.remote_repo(repo)
        result.layers.append(
            _push_tag(client, images[ref], remote, tag, target, policy, log, content_tag=True)
        )
    log(f"all layers are in; tagging {stack}")
    remote = target.remote_repo(final_repo)
    for tag in (f"{stack}-{git_sha}", stack):
        result.final.append(
            _push_tag(client, final_image, remote, tag, target, policy, log, content_tag=False)
        )
    if summary:  # the caller prints it last itself when it has more to say (the SBOM)
        log(result.summary())
    return result


SBOM_FILE = "sbom.cdx.json"
SBOM_MEDIA_TYPE = "application/vnd.cyclonedx+json"


def sbom_tag(digest: str) -> str:
    """The cosign-style tag of an image's SBOM: ``sha256-<hex>.sbom`` (cosign's
    ``sbom`` attachment convention, https://github.com/sigstore/cosign/blob/main/specs/SBOM_SPEC.md)."""
    algorithm, _, hex_digest = digest.partition(":")
    return f"{algorithm}-{hex_digest}.sbom"


def push_sbom(client: docker.DockerClient, result: PushResult, text: str, *,
              log: Log = print, retry: RetryPolicy | None = None) -> str:
    """Push ``text`` (CycloneDX JSON) beside the pushed image as a one-file image under
    :func:`sbom_tag` of the image's digest; the remote reference.

    The image holds ``/sbom.cdx.json`` and nothing else (FROM scratch), labelled with the image it
    describes; any registry that takes images takes it, and ``docker create`` + ``docker cp``
    (or ``crane export``) reads it back.
    """
    import io
    import tarfile

    uri = result.image_digest_uri
    if uri is None:
        raise UserError(f"stack {result.stack}: no pushed image digest to attach the SBOM to")
    remote_repo, digest = uri.split("@", 1)
    tag = sbom_tag(digest)
    dockerfile = (f"FROM scratch\nCOPY {SBOM_FILE} /{SBOM_FILE}\n"
                  f'LABEL org.opencontainers.image.description="CycloneDX SBOM of {uri}" '
                  f'io.github.mnp-stacks.sbom.subject="{uri}" '
                  f'io.github.mnp-stacks.sbom.media-type="{SBOM_MEDIA_TYPE}"\n')
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile.encode()), (SBOM_FILE, text.encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, _ = client.images.build(fileobj=context, custom_context=True, tag=f"{remote_repo}:{tag}",
                                   rm=True, forcerm=True, pull=False)
    target = _Target(result.registry, None)
    pushed = _push_tag(client, image, remote_repo, tag, target, retry or RetryPolicy(), log,
                       content_tag=False)
    return pushed.ref
