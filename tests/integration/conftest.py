"""Fixtures for the entrypoint's Docker cluster tests.

``cluster_image``: the image the cluster tests run. ``MNP_TEST_IMAGE`` when set (development),
else the ``cpu_tcp_image`` fixture from ``tests/conftest.py`` (the real ``cpu-tcp`` stack).
``MNP_TEST_MOUNT_ENTRYPOINT=1`` bind-mounts this checkout's ``entrypoint/`` over the image's copy.
"""

import os

import pytest

from .cluster import Cluster, docker_client_or_skip


@pytest.fixture(scope="session")
def cluster_image(request):
    image = os.environ.get("MNP_TEST_IMAGE")
    if image:
        return image
    try:
        return request.getfixturevalue("cpu_tcp_image")
    except pytest.FixtureLookupError:
        pytest.skip("no cpu_tcp_image fixture and MNP_TEST_IMAGE is not set")


@pytest.fixture(scope="session")
def docker_client():
    return docker_client_or_skip()


@pytest.fixture
def cluster(docker_client, cluster_image, request):
    mount = os.environ.get("MNP_TEST_MOUNT_ENTRYPOINT") == "1"
    c = Cluster(docker_client, cluster_image, request.node.name, mount_entrypoint=mount)
    try:
        yield c
    finally:
        c.cleanup()
