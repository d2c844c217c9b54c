"""Shared fixtures: a Docker engine, and the real cpu-tcp and CUDA images built by the project's
builder, each once per run however many pytest-xdist workers ask for it.

Under ``invoke check`` the suite runs in pytest-xdist workers with ``--dist loadgroup``
(matrix/cli/suite.py). Every test without an ``xdist_group`` mark of its own is given its file as
its group here, so the tests of a file run in one worker, one after the other, as they were
written: a module-scoped fixture (a Slurm cluster, a second engine on a fixed bridge) is set up
once and never shared across processes. A test that must run beside tests of other files (an
engine-wide resource) names a common group: ``@pytest.mark.xdist_group("engine")``.

xdist hands the groups out in collection order, so the groups holding a ``slow`` test (image
builds, container clusters: minutes each) are moved to the front, longest first by the last
``invoke check``'s junit report where there is one: started first, they no longer run alone at
the end while the other workers wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / ".mnp" / "locks"
LAST_JUNIT = ROOT / ".mnp" / "check" / "junit.xml"  # written by invoke check (matrix/cli/suite.py)
CUDA_STACK = "cuda13.2-tcp"

# CI runs several pytest workers on a loaded 2-core machine: a slow example there is the
# machine, not a finding. Loaded here, before any test module builds its @settings, so each
# inherits what it does not set itself (one that sets suppress_health_check lists too_slow too).
settings.register_profile("mnp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mnp")


def file_group(item: pytest.Item) -> str:
    """The xdist group of a test without one of its own: its file."""
    return item.nodeid.split("::", 1)[0]


def pytest_itemcollected(item: pytest.Item) -> None:
    """As each test is collected, before any pytest_collection_modifyitems (xdist's worker
    appends the group to the node ID there, whatever order the hooks run in)."""
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(file_group(item)))


def group_of(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0] if mark and mark.args else file_group(item))


def last_run_seconds(junit: Path = LAST_JUNIT) -> dict[str, float]:
    """Each xdist group's summed seconds in the last ``invoke check`` (none on a fresh machine)."""
    seconds: dict[str, float] = {}
    try:
        cases = ET.parse(junit).getroot().iter("testcase")
    except (OSError, ET.ParseError):
        return seconds
    for case in cases:
        _, at, group = case.get("name", "").rpartition("@")
        if at and "]" not in group:
            seconds[group] = seconds.get(group, 0.0) + float(case.get("time") or 0)
    return seconds


# Without a last run (a fresh machine) nothing says which group is longest, and the one that
# builds the CUDA stack from nothing is, by far: 14 min of a 20 min suite there (fresh runs in
# docs/measurements.md). Handed out later, it ran on after every other group had finished.
BUILDS_FROM_NOTHING = ("cuda_tcp_build",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups with a slow test first, longest first by the last run, and among equals (on a
    fresh machine: all) a group that builds the CUDA stack first; otherwise the order of
    collection (a stable sort)."""
    slow = {group_of(item) for item in items if item.get_closest_marker("slow")}
    seconds = last_run_seconds() if slow else {}
    builders = {group_of(item) for item in items
                if set(BUILDS_FROM_NOTHING) & set(getattr(item, "fixturenames", ()))}
    items.sort(key=lambda item: (group_of(item) not in slow, -seconds.get(group_of(item), 0.0),
                                 group_of(item) not in builders))


@contextlib.contextmanager
def held(name: str) -> Iterator[None]:
    """An exclusive lock shared by every process of this checkout (xdist workers, parallel
    runs): the second to ask waits until the first is done, then finds the work done."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    with (LOCKS / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_stack(client, stack: str):
    """Plan and build ``stack`` with the project's builder, once across processes: the first
    worker builds, the next ones find every layer by its content tag and build nothing."""
    from matrix.image import build, ca
    from matrix.image.plan import plan
    from matrix.model.loader import load_matrix

    with held(f"build-{stack}"):
        # planned under the lock: the worker before may have bootstrapped the base meanwhile,
        # and the builder refuses a plan whose base has changed since
        result = plan(load_matrix(ROOT / "stacks.yaml"), [stack])
        results = build.build(client, result, [stack], ca_bundle=ca.resolve(None),
                              console=Console(highlight=False, width=160))
    return result, results


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
    return build_stack(docker_client, "cpu-tcp")


@pytest.fixture(scope="session")
def cpu_tcp_image(cpu_tcp_build) -> str:
    """Reference of the built cpu-tcp image (its content-addressed tag)."""
    result, _ = cpu_tcp_build
    return result.chains["cpu-tcp"][-1]


@pytest.fixture(scope="session")
def cuda_tcp_build(docker_client):
    """The CUDA TCP stack built once per run (the build takes minutes: every test that needs it
    shares this one; the lock keeps two workers from building it side by side)."""
    result, _ = build_stack(docker_client, CUDA_STACK)
    return result
