"""Shared fixtures: a Docker engine, and the real cpu-tcp image built by the project's builder."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent

# CI runs two pytest processes side by side on a loaded 2-core machine: a slow example there is
# the machine, not a finding. Loaded here, before any test module builds its @settings, so
# each inherits what it does not set itself (one that sets suppress_health_check lists
# too_slow too).
settings.register_profile("mnp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mnp")


@pytest.fixture(scope="session")
def docker_client():
    """A client for the local engine; the suite starts one (as CI does) when none answers."""
    from matrix.errors import UserError
    from matrix.image import engine

    try:
        return engine.ensure()
    except UserError as exc:
        pytest.fail(f"these tests need a Docker engine: {exc}")


@pytest.fixture(scope="session")
def cpu_tcp_build(docker_client):
    """Build the default stack with the project's own builder (cached layers are reused)."""
    from matrix.image import build, ca
    from matrix.image.plan import plan
    from matrix.model.loader import load_matrix

    result = plan(load_matrix(ROOT / "stacks.yaml"), ["cpu-tcp"])
    results = build.build(docker_client, result, ["cpu-tcp"], ca_bundle=ca.resolve(None),
                          console=Console(highlight=False, width=160))
    return result, results


@pytest.fixture(scope="session")
def cpu_tcp_image(cpu_tcp_build) -> str:
    """Reference of the built cpu-tcp image (its content-addressed tag)."""
    result, _ = cpu_tcp_build
    return result.chains["cpu-tcp"][-1]
