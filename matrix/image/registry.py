"""Ask a registry, through the engine, whether it has a manifest; tell its errors apart.

The builder reuses a layer from ``--registry`` when the registry has its content tag. Every
answer but "here it is" used to read as "not there", so a registry that refused us (401/403) or
was busy (429, 5xx, timeouts) looked empty and every layer was rebuilt, silently. Here:

- 404 (``manifest unknown``, ``name unknown``): absent; the layer is built;
- 401/403 (``unauthorized``, ``denied``, ``no basic auth credentials``): one line naming the
  registry and what to log in with; the build stops before it starts anything;
- anything else (429 ``toomanyrequests``, 5xx, a refused or timed-out connection): retried with
  backoff (:class:`Retry`), then one line naming the registry and the last answer.

The engine reports the registry's status in its own: 404 and 401 and 429 come through, but a
request it could not authenticate at all (no credentials for a registry that asks for Basic
auth) arrives as a 500 whose message says so; the messages decide where the status cannot.
"""

from __future__ import annotations

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

# What the engine says when the registry refused our credentials or asked for some we lack.
_AUTH = re.compile(r"unauthorized|authentication required|no basic auth credentials|denied|"
                   r"forbidden|requested access to the resource is denied", re.IGNORECASE)
_ABSENT = re.compile(r"manifest unknown|name unknown|not found", re.IGNORECASE)
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


def _kind(exc: APIError) -> str:
    """``absent``, ``auth`` or ``busy`` for an error the engine returned."""
    message = str(exc.explanation or exc)
    status = exc.response.status_code if exc.response is not None else 0
    if status in (401, 403) or _AUTH.search(message):
        return "auth"
    if isinstance(exc, NotFound) or status == 404 or _ABSENT.search(message):
        return "absent"
    return "busy"


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
            kind = _kind(exc)
            if kind == "absent":
                return absent
            if kind == "auth":
                raise auth_error(registry, doing, str(exc.explanation or exc)) from None
            last = str(exc.explanation or exc).strip().splitlines()[0][:160]
        except _NO_ANSWER as exc:
            last = f"no answer: {type(exc).__name__}"
        delay = next(delays, None)
        if delay is None:
            raise UserError(f"registry {host(registry)} failed {doing} {policy.attempts} times "
                            f"(last: {last}); try again later or build without --registry") from None
        log(f"registry {host(registry)} answered {last!r} {doing}; retrying in {delay:g} s")
        time.sleep(delay)
