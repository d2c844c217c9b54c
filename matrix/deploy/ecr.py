"""Amazon ECR: registry URIs, push credentials and repositories.

Only the control plane goes through the ECR API (boto3): the authorization token and repository
creation. Images themselves are pushed by the Docker engine, with the token's credentials passed
as the push's ``auth_config``.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any, Callable

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from matrix.errors import UserError

_ECR_HOST = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)"
    r"\.amazonaws\.com(?:\.cn)?$"
)

# How the engine reports a push that an IMMUTABLE repository refused because the tag exists.
_ALREADY_EXISTS = re.compile(
    r"ImageTagAlreadyExists|tag invalid.*already exists|cannot be overwritten because the "
    r"(?:repository|tag) is immutable",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class EcrRegistry:
    """An ECR registry, optionally with a repository path prefix (``host/prefix``)."""

    account: str
    region: str
    host: str
    prefix: str = ""

    def repository_name(self, repo: str) -> str:
        """The ECR repository name for local repository ``repo`` (``prefix/repo``)."""
        return f"{self.prefix}/{repo}" if self.prefix else repo


def parse_ecr_registry(uri: str) -> EcrRegistry | None:
    """The ECR registry named by ``uri`` (``[https://]<acct>.dkr.ecr.<region>.amazonaws.com[/p]``),
    or None when ``uri`` is some other registry."""
    rest = re.sub(r"^https?://", "", uri.strip()).rstrip("/")
    host, _, prefix = rest.partition("/")
    match = _ECR_HOST.match(host)
    if not match:
        return None
    return EcrRegistry(match["account"], match["region"], host, prefix)


def is_already_exists_error(message: str) -> bool:
    """True when a push error says the tag already exists and may not be overwritten."""
    return bool(_ALREADY_EXISTS.search(message))


def ecr_client(registry: EcrRegistry) -> Any:
    """A boto3 ECR client for the registry's region (credentials from the usual AWS chain)."""
    import boto3

    return boto3.client("ecr", region_name=registry.region)


def _api_error(action: str, exc: Exception) -> UserError:
    """One clear line for an ECR API failure."""
    if isinstance(exc, NoCredentialsError):
        return UserError(f"ECR {action}: no AWS credentials found (configure a profile or role)")
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return UserError(f"ECR {action} refused: {error.get('Code')}: {error.get('Message')}")
    return UserError(f"ECR {action} failed: {exc}")


def get_auth_config(client: Any, registry: EcrRegistry) -> dict[str, str]:
    """Docker push credentials for ``registry`` from ``GetAuthorizationToken``.

    The token is base64 of ``AWS:<password>`` and is valid for 12 hours; the result is the
    ``auth_config`` dict the docker SDK takes (``username``, ``password``, ``serveraddress``).
    """
    try:
        response = client.get_authorization_token(registryIds=[registry.account])
    except (ClientError, BotoCoreError) as exc:
        raise _api_error("GetAuthorizationToken", exc) from None
    data = response.get("authorizationData") or []
    if not data or "authorizationToken" not in data[0]:
        raise UserError("ECR GetAuthorizationToken returned no authorization data")
    username, _, password = base64.b64decode(data[0]["authorizationToken"]).decode().partition(":")
    if not password:
        raise UserError("ECR GetAuthorizationToken returned a malformed token")
    return {
        "username": username,
        "password": password,
        "serveraddress": data[0].get("proxyEndpoint") or f"https://{registry.host}",
    }


def ensure_repository(
    client: Any, registry: EcrRegistry, name: str, log: Callable[[str], None] = print
) -> bool:
    """Make sure ECR repository ``name`` exists; create it when missing. True when created.

    New repositories get immutable tags (content tags must never be overwritten) and scan on
    push. An existing repository is used as it is. A creation race with another pusher
    (``RepositoryAlreadyExistsException``) counts as "exists".
    """
    try:
        client.describe_repositories(registryId=registry.account, repositoryNames=[name])
        return False
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "RepositoryNotFoundException":
            raise _api_error("DescribeRepositories", exc) from None
    except BotoCoreError as exc:
        raise _api_error("DescribeRepositories", exc) from None
    try:
        client.create_repository(
            registryId=registry.account,
            repositoryName=name,
            imageTagMutability="IMMUTABLE",
            imageScanningConfiguration={"scanOnPush": True},
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "RepositoryAlreadyExistsException":
            return False
        raise _api_error("CreateRepository", exc) from None
    except BotoCoreError as exc:
        raise _api_error("CreateRepository", exc) from None
    log(f"created ECR repository {registry.host}/{name} (immutable tags, scan on push)")
    return True
