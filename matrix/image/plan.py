"""The build plan: every layer of every stack as one DAG of content-addressed images.

A layer's tag is a hash of its parent's reference, its rendered Dockerfile, every file in its
build context and its build arguments. Identical inputs give identical tags, so stacks that share
a base and the same first layers share those images, and a change to one layer changes its tag
and, through the FROM line, the tags of its descendants only.

A base enters the first layer's tag by its content, not its name (as docker-library's bashbrew
hashes the resolved parent digests, meta-scripts/builds.go): a ``@sha256:`` pinned in stacks.yaml,
else the image ID of the base in the local engine (what was pulled or bootstrapped;
:func:`resolve_bases`). A base re-pushed under the same name and tag thus gives new tags once it
is pulled. Where no engine answers, or the base is not local yet, the base is *unresolved* and
its name stands in (the committed ``images/generated/`` Dockerfiles are rendered that way, so
they do not depend on a machine's engine).

A layer's platform is part of its tag too (as bashbrew puts the architecture in its build id,
meta-scripts/builds.go ``BuildIDParts.Arch``, and in its staging name ``staging-ARCH``): an
arm64 layer from the same Dockerfile on the same (unresolved) base name gets another hash and an
``-arm64`` in its name. linux/amd64, the platform of every stack before stacks had one, hashes
nothing more, so its tags are the ones they were.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matrix.image.render import (
    IMAGES,
    ROOT,
    ContextFile,
    context_files,
    render_layer,
    render_stack_labels,
)
from matrix.model import reference
from matrix.model.cuda_arch import family_archs
from matrix.model.entities import (
    DEFAULT_PLATFORM,
    Base,
    ComponentVersion,
    Matrix,
    Stack,
    tag_safe,
)
from matrix.model.rules import require_valid

LABEL_PREFIX = "io.github.mnp-stacks"
# On every built layer: the image ID of the parent it was built on. A layer from a registry is
# used only when this matches the local parent (matrix/image/build.py).
PARENT_LABEL = f"{LABEL_PREFIX}.parent"
# On a bootstrapped base: the hash of its recipe (matrix/image/bootstrap.py).
from matrix.model.entities import RECIPE_LABEL  # noqa: E402,F401 (plan.RECIPE_LABEL: read here)

NO_ENGINE = "unresolved: no Docker engine answers"


@dataclass(frozen=True)
class BaseDigest:
    """What a base is by content: ``digest`` ("" while unresolved) and where it came from."""

    image: str
    digest: str = ""
    source: str = "unresolved"

    @property
    def client_missing(self) -> bool:
        """Unresolved because no engine answered (not because the base is not local yet)."""
        return self.source == NO_ENGINE

    @property
    def identity(self) -> str:
        """What the first layer's tag hashes: the name with its digest (the name alone while
        unresolved, as before bases were resolved)."""
        if not self.digest or "@" in self.image:
            return self.image
        return f"{self.image}@{self.digest}"


def resolve_base(client: Any, base: Base) -> BaseDigest:
    """``base``'s digest: pinned in stacks.yaml, else the ID of the local image (never pulls)."""
    from docker.errors import ImageNotFound

    pinned = reference.parse(base.image).digest
    if pinned:
        return BaseDigest(base.image, pinned, "pinned in stacks.yaml")
    if client is None:
        return BaseDigest(base.image, "", NO_ENGINE)
    try:
        image = client.images.get(base.image)
    except ImageNotFound:
        return BaseDigest(base.image, "", "unresolved: not in the local engine yet (the build "
                                          "pulls or bootstraps it)")
    name = reference.parse(base.image).name
    pulled = [d for d in image.attrs.get("RepoDigests") or [] if d.split("@")[0].endswith(name)]
    recipe = (image.labels or {}).get(RECIPE_LABEL)
    if pulled:
        source = f"pulled: {pulled[0]}"
    elif recipe:
        source = f"bootstrapped here: recipe {recipe}"
    else:
        source = "local image, no registry digest"
    return BaseDigest(base.image, image.id, source)


def resolve_bases(matrix: Matrix, names: list[str], client: Any = "auto") -> dict[str, BaseDigest]:
    """Every named stack's base by digest; ``client="auto"`` asks the local engine when one
    answers, ``None`` asks none (pinned digests still count)."""
    if client == "auto":
        client = _engine_or_none()
    bases = {matrix.stack(n).base.name: matrix.stack(n).base for n in names}
    return {name: resolve_base(client, base) for name, base in bases.items()}


def _engine_or_none() -> Any:
    import docker

    from matrix.image.engine import ENGINE_FAULTS

    try:
        client = docker.from_env(timeout=20)
        client.ping()
        return client
    except ENGINE_FAULTS:
        return None


@dataclass
class Layer:
    """One image to build: its Dockerfile, its context and its content-addressed reference."""

    component: str
    version: str
    parent: str
    dockerfile: str
    context: list[ContextFile]
    build_args: dict[str, str]
    ref: str
    stacks: list[str] = field(default_factory=list)
    # The OCI platform the layer is built for (its stack's).
    platform: str = DEFAULT_PLATFORM

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]

    @property
    def name(self) -> str:
        return self.component if self.component == "_stack" else f"{self.component} {self.version}"


@dataclass
class Plan:
    """Layers keyed by reference (insertion order is a valid build order) and each stack's chain."""

    matrix: Matrix
    layers: dict[str, Layer] = field(default_factory=dict)
    chains: dict[str, list[str]] = field(default_factory=dict)
    bases: dict[str, BaseDigest] = field(default_factory=dict)

    def chain(self, stack: str) -> list[Layer]:
        return [self.layers[ref] for ref in self.chains[stack]]

    def final_ref(self, stack: str) -> str:
        return f"{self.matrix.repository}:{stack}"

    def order(self, stacks: list[str]) -> list[Layer]:
        """The layers the named stacks need, each once, parents before children."""
        wanted = {ref for s in stacks for ref in self.chains[s]}
        return [layer for ref, layer in self.layers.items() if ref in wanted]


def content_tag(parent: str, dockerfile: str, context: list[ContextFile],
                build_args: dict[str, str], platform: str = DEFAULT_PLATFORM) -> str:
    """The hash in a layer's tag; ``platform`` counts unless it is linux/amd64 (whose tags
    predate platforms and stay as they were)."""
    digest = hashlib.sha256()
    parts = [parent, dockerfile, json.dumps(build_args, sort_keys=True)]
    if platform != DEFAULT_PLATFORM:
        parts.append(f"platform={platform}")
    for part in parts:
        digest.update(part.encode() + b"\0")
    for item in context:
        digest.update(f"{item.path}\0{int(item.executable)}\0{item.digest()}\0".encode())
    return digest.hexdigest()[:16]


def make_layer(repository: str, component: str, version: str, parent: str, dockerfile: str,
               context: list[ContextFile], build_args: dict[str, str] | None = None,
               parent_identity: str | None = None, platform: str = DEFAULT_PLATFORM) -> Layer:
    """``parent_identity`` is what the tag hashes for the parent (a base's name and digest);
    the parent's reference by default (a layer's reference is its content already). A
    platform other than linux/amd64 is hashed and named in the tag (``-arm64-``)."""
    args = build_args or {}
    digest = content_tag(parent_identity or parent, dockerfile, context, args, platform)
    name = "stack" if component == "_stack" else f"{component}-{tag_safe(version)}"
    if platform != DEFAULT_PLATFORM:
        name = f"{name[:90]}-{tag_safe(platform.split('/', 1)[1])}"
    return Layer(component, version, parent, dockerfile, context, args,
                 f"{repository}:{name[:100]}-{digest}", platform=platform)


def stack_labels(matrix: Matrix, stack: Stack, base: BaseDigest | None = None) -> dict[str, str]:
    """OCI labels of a stack's final image (component versions come from each layer's LABEL)."""
    labels = {
        "org.opencontainers.image.title": stack.name,
        "org.opencontainers.image.description": stack.description,
        "org.opencontainers.image.base.name": stack.base.image,
        f"{LABEL_PREFIX}.stack": stack.name,
        f"{LABEL_PREFIX}.instances": ",".join(stack.instances),
        f"{LABEL_PREFIX}.fabric": stack.fabric,
    }
    if base is not None and base.digest:
        labels["org.opencontainers.image.base.digest"] = base.digest
    if matrix.source:
        labels["org.opencontainers.image.source"] = matrix.source
    return labels


def plan(matrix: Matrix, stacks: list[str] | None = None, images: Path = IMAGES,
         root: Path = ROOT, bases: dict[str, BaseDigest] | None = None,
         engine: Any = "auto") -> Plan:
    """Plan the named stacks (all by default); refuses stacks that break a compatibility rule.

    ``bases`` are the bases by digest; by default they are read from ``engine`` (``"auto"``:
    the local engine when one answers; ``None``: none, every unpinned base unresolved).
    """
    names = list(matrix.stacks) if stacks is None else stacks
    require_valid(matrix, names)
    resolved = bases if bases is not None else resolve_bases(matrix, names, engine)
    result = Plan(matrix, bases=resolved)
    contexts: dict[str, list[ContextFile]] = {}
    for name in names:
        stack = matrix.stack(name)
        base = resolved.get(stack.base.name) or BaseDigest(stack.base.image)
        parent, identity = stack.base.image, base.identity
        chain = []
        for cv in stack.layers:
            layer = _layer(matrix, stack, cv, parent, images, root, contexts, identity)
            chain.append(_add(result, layer, name))
            parent, identity = layer.ref, None
        final = make_layer(matrix.repository, "_stack", stack.name, parent,
                           render_stack_labels(parent, stack_labels(matrix, stack, base), images),
                           [], parent_identity=identity, platform=stack.platform)
        chain.append(_add(result, final, name))
        result.chains[name] = chain
    return result


def _layer(matrix: Matrix, stack: Stack, cv: ComponentVersion, parent: str, images: Path,
           root: Path, contexts: dict[str, list[ContextFile]],
           parent_identity: str | None) -> Layer:
    dockerfile = render_layer(cv, parent, stack.base, stack.fabric, images,
                              tuple(family_archs(matrix, stack)), stack.platform)
    if cv.component not in contexts:
        contexts[cv.component] = context_files(cv.component, images, root)
    return make_layer(matrix.repository, cv.component, cv.version, parent, dockerfile,
                      contexts[cv.component], parent_identity=parent_identity,
                      platform=stack.platform)


def _add(result: Plan, layer: Layer, stack: str) -> str:
    existing = result.layers.setdefault(layer.ref, layer)
    existing.stacks.append(stack)
    return layer.ref
