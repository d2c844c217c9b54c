"""Ask a registry, through the engine, whether it has a manifest; tell its errors apart.

The builder reuses a layer from ``--registry`` when the registry has its content tag. Every
answer but "here it is" used to read as "not there", so a registry that refused us (401/403) or
was busy (429, 5xx, timeouts) looked empty and every layer was rebuilt, silently. Here
(:func:`classify`, which ``invoke push`` uses too, matrix/deploy/publish.py):

- 404 (``manifest unknown``, ``name unknown``): absent; the layer is built;
- 401/403 (``unauthorized``, ``denied``, ``no basic auth credentials``): one line naming the
  registry and what to log in with; the build stops before it starts anything;
- a host whose name does not resolve (``no such host``): one line, at once: no retry changes it;
- a refusal (405 and any other 4xx, ``unsupported``, an answer the engine could not read): one
  line saying what the registry answered, at once;
- only a busy or unreachable registry is retried with backoff (:class:`Retry`): 5xx, 429
  ``toomanyrequests``, a refused, lost or timed-out connection; then one line naming the
  registry and the last answer.

The engine reports the registry's status in its own: 404 and 401 and 429 come through, but a
request it could not authenticate at all (no credentials for a registry that asks for Basic
auth) arrives as a 500 whose message says so; the messages decide where the status cannot. The
messages are dockerd's (seen from Docker Engine 20.10 against loopback servers answering each
way, tests/publish/test_registry_errors.py): ``received unexpected HTTP status: 503 Service
Unavailable``, ``error parsing HTTP 405 response body: invalid character 'M' looking for
beginning of value: "Method not allowed"`` (a body that is not the registry's JSON error format),
``denied: <message>``, ``unsupported: <message>``, ``toomanyrequests: <message>`` (the error
codes of https://github.com/opencontainers/distribution-spec/blob/v1.1.0/spec.md#error-codes,
lower case), and Go's resolver's ``lookup <name> on <server>: no such host``.
"""

from __future__ import annotations

import http
import http.client
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import docker
import requests
import urllib3
from docker.errors import APIError, NotFound

from matrix.errors import UserError

_ECR = re.compile(r"^(\d{12})\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")
# No answer in time, or a connection lost on the way (the engine's or the registry's).
_NO_ANSWER = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError,
              http.client.HTTPException, ConnectionError, TimeoutError)


@dataclass(frozen=True)
class Retry:
    """Backoff for a busy or failing registry: ``attempts`` tries in all, waiting ``first_s``,
    then twice as long each time, never more than ``max_s``."""

    attempts: int = 4
    first_s: float = 2.0
    max_s: float = 30.0

    def delays(self) -> Iterable[float]:
        delay = self.first_s
        for _ in range(self.attempts - 1):
            yield min(delay, self.max_s)
            delay *= 2


def host(registry: str) -> str:
    """The registry's host[:port] (``--registry`` may carry a path prefix)."""
    return re.sub(r"^https?://", "", registry.strip()).split("/", 1)[0]


def login_hint(registry: str) -> str:
    """What to log in with: ``docker login HOST``, or ECR's token piped into it."""
    name = host(registry)
    ecr = _ECR.match(name)
    if ecr:
        return (f"aws ecr get-login-password --region {ecr[2]} | docker login --username AWS "
                f"--password-stdin {name}")
    return f"docker login {name}"


def auth_error(registry: str, doing: str, message: str) -> UserError:
    """One line: the registry refused us; who to log in to and how."""
    first = message.strip().splitlines()[0][:160] if message.strip() else "refused"
    return UserError(f"registry {host(registry)} refused {doing}: authentication failed "
                     f"({first}); log in with `{login_hint(registry)}` (the engine's credentials "
                     "are used) and run the command again")


# Kinds of registry error (:func:`classify`); only BUSY is retried.
ABSENT, AUTH, DENIED, UNKNOWN_HOST, REFUSED, BUSY = (
    "absent", "auth", "denied", "unknown host", "refused", "busy")
_CREDENTIALS = re.compile(r"unauthorized|authentication required|no basic auth credentials",
                          re.IGNORECASE)
_DENIED = re.compile(r"\bdenied\b|forbidden", re.IGNORECASE)
_NO_SUCH_HOST = re.compile(r"lookup (\S+?)(?: on \S+)?: no such host")
_HTTP_STATUS = re.compile(r"(?:unexpected HTTP status|error parsing HTTP)[: ]+(\d{3})")
_PARSE_BODY = re.compile(r'error parsing HTTP \d{3} response body: .*?: "(.*)"\s*$', re.DOTALL)
_TOO_MANY = re.compile(r"toomanyrequests|too many requests", re.IGNORECASE)
# A connection refused, lost or timed out (the engine's Go errors, or docker-py's own timeout).
_NO_CONNECTION = re.compile(r"connection refused|connection reset|broken pipe|\bEOF\b|"
                            r"timeout|timed out|deadline exceeded|no route to host|"
                            r"network is unreachable", re.IGNORECASE)


@dataclass(frozen=True)
class RegistryError:
    """What a registry's answer (as the engine reports it) means: ``kind`` (ABSENT, AUTH,
    DENIED, UNKNOWN_HOST, REFUSED or BUSY, the only one worth retrying) and ``reason``, one
    line of the registry's own words."""

    kind: str
    reason: str

    @property
    def retried(self) -> bool:
        return self.kind == BUSY


def _status_words(status: int) -> str:
    try:
        return f"HTTP {status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def classify(message: str, status: int = 0) -> RegistryError:
    """The kind of a registry error from the engine's ``message`` (and the engine's HTTP
    ``status`` where it passes the registry's on: 401, 403, 404, 429)."""
    text = " ".join(message.split()) or "no message"
    first = text[:200]
    unknown = _NO_SUCH_HOST.search(text)
    if unknown:
        return RegistryError(UNKNOWN_HOST, f"the name {unknown[1]} does not resolve "
                                           "(no such host)")
    if status == 401 or _CREDENTIALS.search(text):
        return RegistryError(AUTH, first)
    if status == 404 or re.search(r"manifest unknown|name unknown|not found", text, re.I):
        return RegistryError(ABSENT, first)
    code = _HTTP_STATUS.search(text)
    registry_status = int(code[1]) if code else (status if status in (403, 429) else 0)
    if registry_status >= 500 or registry_status == 429 or _TOO_MANY.search(text):
        return RegistryError(BUSY, first)
    if status == 403 or _DENIED.search(text):
        return RegistryError(DENIED, first)
    if registry_status:
        body = _PARSE_BODY.search(text)
        said = f" ({body[1].strip()[:120]!r})" if body else ""
        return RegistryError(REFUSED, f"{_status_words(registry_status)}{said}")
    if _NO_CONNECTION.search(text):
        return RegistryError(BUSY, first)
    return RegistryError(REFUSED, first)


def _kind(exc: APIError) -> RegistryError:
    """What an error the engine returned means (:func:`classify`)."""
    status = exc.response.status_code if exc.response is not None else 0
    if isinstance(exc, NotFound):
        status = 404
    return classify(str(exc.explanation or exc), status)


def has_manifest(client: docker.DockerClient, ref: str, registry: str, *,
                 retry: Retry | None = None, log: Callable[[str], None] = print) -> bool:
    """Whether ``registry`` has a manifest for ``ref`` (``registry/repo:tag``).

    Raises :class:`UserError`: one line when the registry refuses our credentials, or when it
    stays busy (429, 5xx, no answer) through every retry.
    """
    return bool(call(client, lambda: client.images.get_registry_data(ref), registry,
                     f"reading the manifest of {ref}", retry=retry, log=log, absent=None))


def call(client: docker.DockerClient, action: Callable[[], Any], registry: str, doing: str, *,
         retry: Retry | None = None, log: Callable[[str], None] = print,
         absent: Any = None) -> Any:
    """Run a registry call through the engine; ``absent`` on a 404, retries while busy, one
    :class:`UserError` on refused credentials or a registry busy through every retry."""
    policy = retry or Retry()
    delays = iter(policy.delays())
    while True:
        try:
            return action()
        except APIError as exc:
            found = _kind(exc)
            if found.kind == ABSENT:
                return absent
            if found.kind in (AUTH, DENIED):
                raise auth_error(registry, doing, str(exc.explanation or exc)) from None
            if not found.retried:
                raise refusal(registry, doing, found) from None
            last = found.reason[:160]
        except _NO_ANSWER as exc:
            last = f"no answer: {type(exc).__name__}"
        delay = next(delays, None)
        if delay is None:
            raise UserError(f"registry {host(registry)} failed {doing} {policy.attempts} times "
                            f"(last: {last}); try again later or build without --registry") from None
        log(f"registry {host(registry)} answered {last!r} {doing}; retrying in {delay:g} s")
        time.sleep(delay)


def refusal(registry: str, doing: str, found: RegistryError) -> UserError:
    """One line for an error no retry changes: an unknown host, or what the registry refused."""
    if found.kind == UNKNOWN_HOST:
        return UserError(f"registry host {host(registry)} is unknown: {found.reason}; check the "
                         f"registry's name (--registry {registry})")
    return UserError(f"registry {host(registry)} refused {doing}: {found.reason}")
