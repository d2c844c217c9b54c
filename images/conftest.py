"""Fixtures for the per-layer testinfra tests in ``images/<component>/test_*.py``.

``invoke test --stack S`` runs each layer's tests against a container of that layer's image:
pytest gets ``--hosts=docker://<container>`` (testinfra's ``host`` fixture) and
``--mnp-layer=<json file>`` describing the layer (component, version, its stacks.yaml entry, the
whole stack's versions). Collected without ``--mnp-layer`` (a plain ``pytest`` run), the tests are
skipped: they need a built image, never the machine running pytest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--mnp-layer", default=None,
                     help="JSON file describing the layer under test (written by invoke test)")


@pytest.fixture(scope="session")
def layer(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The layer under test: component, version, spec, versions, stack, fabric, image."""
    path = request.config.getoption("--mnp-layer")
    return json.loads(Path(path).read_text(encoding="utf-8"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--mnp-layer"):
        return
    skip = pytest.mark.skip(reason="layer test: runs against a built image via `invoke test`")
    # a prefix of the path's text: the whole suite's items pass here, and building each one's
    # list of parents took 0.3 s of every collection
    here = f"{Path(__file__).parent}{os.sep}"
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(skip)
