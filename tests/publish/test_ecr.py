"""ECR: registry parsing, push credentials and repositories, against botocore's ECR model.

The ECR API is the one thing mocked: a real botocore client with a :class:`Stubber`, which
checks every request against the ECR service model; the canned responses are checked against
the model's output shapes here too, and error codes against the operation's declared errors.
"""

from __future__ import annotations

import base64
import datetime

import botocore.session
import pytest
from botocore.stub import Stubber
from botocore.validate import validate_parameters

from matrix.deploy import ecr, publish
from matrix.errors import UserError

REGISTRY = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
MODEL = botocore.session.get_session().get_service_model("ecr")


def _client():
    session = botocore.session.get_session()
    return session.create_client(
        "ecr", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="y"
    )


def _response(method: str, body: dict) -> dict:
    """``body``, after checking it against the operation's output shape in the ECR model."""
    validate_parameters(body, MODEL.operation_model(xform_api(method)).output_shape)
    return body


def xform_api(method: str) -> str:
    """``describe_repositories`` -> ``DescribeRepositories`` (the model's operation name)."""
    return "".join(part.capitalize() for part in method.split("_"))


def _error(stubber: Stubber, method: str, code: str) -> None:
    """Queue ``code`` for ``method``; a code the model declares for it (or a generic IAM one)."""
    declared = {shape.name for shape in MODEL.operation_model(xform_api(method)).error_shapes}
    assert code in declared or code == "AccessDeniedException", (method, code)
    stubber.add_client_error(method, service_error_code=code, service_message=f"{code}!")


def _token_response(password: str = "s3cr3t") -> dict:
    token = base64.b64encode(f"AWS:{password}".encode()).decode()
    return _response(
        "get_authorization_token",
        {
            "authorizationData": [
                {
                    "authorizationToken": token,
                    "expiresAt": datetime.datetime(2030, 1, 1),
                    "proxyEndpoint": f"https://{REGISTRY}",
                }
            ]
        },
    )


def _repository(name: str) -> dict:
    return {
        "repositoryArn": f"arn:aws:ecr:us-west-2:123456789012:repository/{name}",
        "registryId": "123456789012",
        "repositoryName": name,
        "repositoryUri": f"{REGISTRY}/{name}",
        "imageTagMutability": "IMMUTABLE",
        "imageScanningConfiguration": {"scanOnPush": True},
    }


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (REGISTRY, ecr.EcrRegistry("123456789012", "us-west-2", REGISTRY, "")),
        (
            f"https://{REGISTRY}/team/mnp/",
            ecr.EcrRegistry("123456789012", "us-west-2", REGISTRY, "team/mnp"),
        ),
        (
            "123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com",
            ecr.EcrRegistry(
                "123456789012",
                "us-gov-west-1",
                "123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com",
            ),
        ),
        ("127.0.0.1:5000", None),
        ("ghcr.io/org", None),
        ("12345.dkr.ecr.us-west-2.amazonaws.com", None),
    ],
)
def test_parse_ecr_registry(uri, expected):
    assert ecr.parse_ecr_registry(uri) == expected


def test_repository_name_uses_the_prefix():
    registry = ecr.parse_ecr_registry(f"{REGISTRY}/team")
    assert registry.repository_name("mnp/cpu-tcp") == "team/mnp/cpu-tcp"


def test_auth_config_from_token():
    client = _client()
    registry = ecr.parse_ecr_registry(REGISTRY)
    with Stubber(client) as stubber:
        stubber.add_response(
            "get_authorization_token", _token_response(), {"registryIds": ["123456789012"]}
        )
        auth = ecr.get_auth_config(client, registry)
        stubber.assert_no_pending_responses()
    assert auth == {
        "username": "AWS",
        "password": "s3cr3t",
        "serveraddress": f"https://{REGISTRY}",
    }


def test_token_refusal_is_one_line():
    client = _client()
    with Stubber(client) as stubber:
        _error(stubber, "get_authorization_token", "AccessDeniedException")
        with pytest.raises(UserError, match="GetAuthorizationToken refused: AccessDenied"):
            ecr.get_auth_config(client, ecr.parse_ecr_registry(REGISTRY))


def test_missing_repository_is_created_immutable_with_scan_on_push():
    client = _client()
    registry = ecr.parse_ecr_registry(REGISTRY)
    lines: list[str] = []
    with Stubber(client) as stubber:
        _error(stubber, "describe_repositories", "RepositoryNotFoundException")
        stubber.add_response(
            "create_repository",
            _response("create_repository", {"repository": _repository("mnp/cpu-tcp")}),
            {
                "registryId": "123456789012",
                "repositoryName": "mnp/cpu-tcp",
                "imageTagMutability": "IMMUTABLE",
                "imageScanningConfiguration": {"scanOnPush": True},
            },
        )
        assert ecr.ensure_repository(client, registry, "mnp/cpu-tcp", lines.append) is True
        stubber.assert_no_pending_responses()
    assert lines == [
        f"created ECR repository {REGISTRY}/mnp/cpu-tcp (immutable tags, scan on push)"
    ]


def test_existing_repository_is_left_alone():
    client = _client()
    with Stubber(client) as stubber:
        stubber.add_response(
            "describe_repositories",
            _response("describe_repositories", {"repositories": [_repository("mnp/x")]}),
            {"registryId": "123456789012", "repositoryNames": ["mnp/x"]},
        )
        assert ecr.ensure_repository(client, ecr.parse_ecr_registry(REGISTRY), "mnp/x") is False
        stubber.assert_no_pending_responses()


def test_repository_created_concurrently_counts_as_existing():
    client = _client()
    with Stubber(client) as stubber:
        _error(stubber, "describe_repositories", "RepositoryNotFoundException")
        _error(stubber, "create_repository", "RepositoryAlreadyExistsException")
        assert ecr.ensure_repository(client, ecr.parse_ecr_registry(REGISTRY), "mnp/x") is False


def test_repository_creation_refused_is_one_line():
    client = _client()
    with Stubber(client) as stubber:
        _error(stubber, "describe_repositories", "RepositoryNotFoundException")
        _error(stubber, "create_repository", "LimitExceededException")
        with pytest.raises(UserError, match="CreateRepository refused: LimitExceededException"):
            ecr.ensure_repository(client, ecr.parse_ecr_registry(REGISTRY), "mnp/x")


def test_push_target_for_ecr_gets_token_and_repositories():
    """publish's ECR preparation: one token, each distinct repository ensured under the prefix."""
    client = _client()
    with Stubber(client) as stubber:
        stubber.add_response("get_authorization_token", _token_response("pw"))
        for name in ("team/mnp/base", "team/mnp/cpu-tcp"):
            _error(stubber, "describe_repositories", "RepositoryNotFoundException")
            stubber.add_response(
                "create_repository",
                _response("create_repository", {"repository": _repository(name)}),
            )
        target = publish._prepare_target(
            f"https://{REGISTRY}/team",
            ["mnp/base", "mnp/cpu-tcp", "mnp/cpu-tcp"],
            client,
            log=lambda line: None,
        )
        stubber.assert_no_pending_responses()
    assert target.base == f"{REGISTRY}/team"
    assert target.auth_config["username"] == "AWS" and target.auth_config["password"] == "pw"
    assert target.remote_repo("mnp/base") == f"{REGISTRY}/team/mnp/base"


def test_other_registries_use_the_engine_credentials():
    target = publish._prepare_target("127.0.0.1:5000/x", ["mnp/a"], None, log=print)
    assert target.auth_config is None
    assert target.remote_repo("localhost:5000/mnp/a") == "127.0.0.1:5000/x/mnp/a"


@pytest.mark.parametrize(
    "message",
    [
        "tag invalid: The image tag 'abc' already exists in the 'mnp/x' repository and cannot be "
        "overwritten because the repository is immutable.",
        "ImageTagAlreadyExistsException: The image tag 'abc' already exists",
    ],
)
def test_immutable_tag_refusals_mean_already_there(message):
    assert ecr.is_already_exists_error(message)
    assert isinstance(_classify(message), publish._TagExists)


def _classify(message: str) -> Exception:
    return publish._classify(message, publish._Target(ECR_HOST, None), "the push of x:1")


ECR_HOST = "123456789012.dkr.ecr.us-east-1.amazonaws.com"


def test_error_classification():
    assert isinstance(_classify("dial tcp: connect: connection refused"), publish._Transient)
    assert isinstance(_classify("received unexpected HTTP status: 503"), publish._Transient)
    denied = _classify("denied: not authorized")
    assert isinstance(denied, UserError)
    assert str(denied) == (f"registry {ECR_HOST} refused the push of x:1: denied: not authorized; "
                           "check the credentials (`aws ecr get-login-password --region us-east-1 "
                           f"| docker login --username AWS --password-stdin {ECR_HOST}`) and the "
                           "repository's permissions")
