"""The stack matrix as typed objects: bases, component versions, stacks.

Everything here is immutable data built by :mod:`matrix.model.loader`; nothing touches Docker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from matrix.model.yamlsrc import Located

_RELEASE = re.compile(r"^(?:\d+:)?v?(\d+(?:\.\d+)*)")
# AWS's libfabric builds: 1.22.0amzn3.0 (AWS patch 3.0 on top of upstream 1.22.0) and
# 1.16.0~amzn1.0 (the "~" marks a pre-release of 1.16.0, per the EFA installer release notes,
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-changelog.html, 1.17.0 entry).
_AMZN = re.compile(r"^(?:\d+:)?v?(\d+(?:\.\d+)*)(~?)amzn(\d+)(?:\.(\d+))?")
_CLAUSE = re.compile(r"(===|~=|==|!=|<=|>=|<|>)\s*([^,\s]+)")

# The label a bootstrapped base carries: the digest of its recipe (written by image/bootstrap.py,
# read back by image/plan.py; here so neither imports the other).
RECIPE_LABEL = "io.github.mnp-stacks.bootstrap.recipe"

# The platform a stack is built for when stacks.yaml names none; its content tags hash no
# platform, so they stay what they were before stacks had one.
DEFAULT_PLATFORM = "linux/amd64"


def comparable(version: str) -> Version:
    """The release part of any version string, for ordering.

    Release names in this field are not PEP 440: ``1.8.1amzn1.3`` (libfabric), ``1.7.3-aws``
    (aws-ofi-nccl), ``1:9.2p1-2+deb12u10`` (Debian epoch and revision). Compatibility rules are
    written against the upstream release number, so that is what we compare, except for AWS's
    libfabric builds, whose ``amznA.B`` suffix orders builds of one release (plugins need
    ``1.22.0amzn4.0``; EFA installer 1.36.0 ships ``1.22.0amzn3.0``): ``X.Y.ZamznA.B`` sorts
    after upstream ``X.Y.Z`` and before ``X.Y.(Z+1)``, and ``X.Y.Z~amznA.B`` (a pre-release)
    before ``X.Y.Z``.
    """
    amzn = _AMZN.match(version)
    if amzn:
        release, tilde, major, minor = amzn.groups()
        parts = (release.split(".") + ["0", "0"])[:3]
        if tilde:
            return Version(f"{'.'.join(parts)}rc{int(major) * 1000 + int(minor or 0)}")
        return Version(f"{'.'.join(parts)}.1.{major}.{minor or 0}")
    match = _RELEASE.match(version)
    if not match:
        raise ValueError(f"no numeric release in version {version!r}")
    try:
        return Version(match.group(1))
    except InvalidVersion as exc:  # pragma: no cover - the regex only admits valid releases
        raise ValueError(str(exc)) from None


def specifier(spec: str) -> SpecifierSet:
    """``spec`` as a SpecifierSet, with AWS ``amzn`` versions in it mapped as :func:`comparable`
    maps them (so ``>=1.22.0amzn4.0`` can be written in a rule)."""

    def mapped(match: re.Match[str]) -> str:
        op, version = match.groups()
        return f"{op}{comparable(version)}" if "amzn" in version else match.group(0)

    return SpecifierSet(_CLAUSE.sub(mapped, spec))


def matches(version: str, spec: str) -> bool:
    """Whether ``version`` (any release name :func:`comparable` reads) satisfies ``spec``."""
    return specifier(spec).contains(comparable(version), prereleases=True)


def tag_safe(text: str) -> str:
    """``text`` reduced to the characters a Docker tag allows."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


@dataclass(frozen=True)
class Base:
    """A base image a stack starts from."""

    name: str
    image: str
    os: str
    provides: dict[str, str]
    bootstrap: dict[str, Any] | None = None
    provide_hint: str = ""

    @property
    def python(self) -> str:
        return self.provides.get("python", "")


@dataclass(frozen=True)
class ComponentVersion:
    """One version of one component, with everything its template needs."""

    component: str
    version: str
    spec: dict[str, Any]
    # The options the stack gives this layer itself (``component: {version, options}``), already
    # merged over the version's in ``spec``; kept apart so listings can say what the stack chose.
    stack_options: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.spec.get("source", "")

    @property
    def label(self) -> str:
        return f"{self.component} {self.version}"

    @property
    def unpinned(self) -> bool:
        """A ``download`` component whose archive has no ``download`` (url + sha256) yet: its
        template fails closed, stopping the build with what to add (hccl-ofi-wrapper and
        deepspeed-habana, whose archives could not be hashed where they were written)."""
        return self.source == "download" and "download" not in self.spec


@dataclass(frozen=True)
class Stack:
    """A base plus an ordered list of layers, and where it is meant to run."""

    name: str
    description: str
    base: Base
    layers: tuple[ComponentVersion, ...]
    instances: tuple[str, ...]
    fabric: str
    where: str
    ci_runner: str | None = None
    # OCI platform "os/arch" (arch as GOARCH: amd64, arm64), the one the instance table's
    # `arch` and Kubernetes' kubernetes.io/arch label use.
    platform: str = DEFAULT_PLATFORM
    size_budget_mb: int | None = None
    # Most MB one filesystem layer may add: ("default", n) and (component, n) pairs.
    layer_budget_mb: tuple[tuple[str, int], ...] = ()

    @property
    def arch(self) -> str:
        """The platform's architecture (``arm64`` of ``linux/arm64``)."""
        return self.platform.split("/")[1]

    def layer_budget(self, component: str) -> int | None:
        """The most MB one filesystem layer of ``component``'s image may add (None: no budget)."""
        budgets = dict(self.layer_budget_mb)
        return budgets.get(component, budgets.get("default"))

    def versions(self) -> dict[str, str]:
        """Every component version in the stack, including what the base and layers provide."""
        found = dict(self.base.provides)
        for layer in self.layers:
            found[layer.component] = layer.version
            found.update(layer.spec.get("provides", {}))
        return found

    def unpinned(self) -> list[str]:
        """Labels of the layers that cannot be built yet (see :attr:`ComponentVersion.unpinned`)."""
        return [layer.label for layer in self.layers if layer.unpinned]

    def layer(self, component: str) -> ComponentVersion | None:
        return next((layer for layer in self.layers if layer.component == component), None)


@dataclass
class Matrix:
    """A whole stacks file."""

    path: Path
    repository: str
    source: str
    bases: dict[str, Base]
    stacks: dict[str, Stack]
    located: Located = field(repr=False)

    def stack(self, name: str) -> Stack:
        from matrix.errors import UserError

        if name not in self.stacks:
            known = ", ".join(sorted(self.stacks))
            raise UserError(f"{self.path}: no stack named {name!r} (stacks: {known})")
        return self.stacks[name]
