"""Fixtures for the entrypoint's Docker cluster tests.

``cluster_image``: the image the cluster tests run. ``MNP_TEST_IMAGE`` when set (development),
else the ``cpu_tcp_image`` fixture from ``tests/conftest.py`` (the real ``cpu-tcp`` stack).
``MNP_TEST_MOUNT_ENTRYPOINT=1`` bind-mounts this checkout's ``entrypoint/`` over the image's copy.
The Docker engine is ``tests/conftest.py``'s ``docker_client``: no engine fails these tests, as it
fails every other Docker test, rather than skipping them.
"""

import os

import pytest

from .cluster import Cluster


@pytest.fixture(scope="session")
def cluster_image(request):
    return os.environ.get("MNP_TEST_IMAGE") or request.getfixturevalue("cpu_tcp_image")


@pytest.fixture
def cluster(docker_client, cluster_image, request):
    mount = os.environ.get("MNP_TEST_MOUNT_ENTRYPOINT") == "1"
    c = Cluster(docker_client, cluster_image, request.node.name, mount_entrypoint=mount)
    try:
        yield c
    finally:
        c.cleanup()
