"""The build plan: every layer of every stack as one DAG of content-addressed images.

A layer's tag is a hash of its parent's reference, its rendered Dockerfile, every file in its
build context and its build arguments. Identical inputs give identical tags, so stacks that share
a base and the same first layers share those images, and a change to one layer changes its tag
and, through the FROM line, the tags of its descendants only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from matrix.image.render import (
    IMAGES,
    ROOT,
    ContextFile,
    context_files,
    render_layer,
    render_stack_labels,
)
from matrix.model.cuda_arch import family_archs
from matrix.model.entities import ComponentVersion, Matrix, Stack, tag_safe
from matrix.model.rules import require_valid

LABEL_PREFIX = "io.github.mnp-stacks"


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

    def chain(self, stack: str) -> list[Layer]:
        return [self.layers[ref] for ref in self.chains[stack]]

    def final_ref(self, stack: str) -> str:
        return f"{self.matrix.repository}:{stack}"

    def order(self, stacks: list[str]) -> list[Layer]:
        """The layers the named stacks need, each once, parents before children."""
        wanted = {ref for s in stacks for ref in self.chains[s]}
        return [layer for ref, layer in self.layers.items() if ref in wanted]


def content_tag(parent: str, dockerfile: str, context: list[ContextFile],
                build_args: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for part in (parent, dockerfile, json.dumps(build_args, sort_keys=True)):
        digest.update(part.encode() + b"\0")
    for item in context:
        digest.update(f"{item.path}\0{int(item.executable)}\0{item.digest()}\0".encode())
    return digest.hexdigest()[:16]


def make_layer(repository: str, component: str, version: str, parent: str, dockerfile: str,
               context: list[ContextFile], build_args: dict[str, str] | None = None) -> Layer:
    args = build_args or {}
    digest = content_tag(parent, dockerfile, context, args)
    name = "stack" if component == "_stack" else f"{component}-{tag_safe(version)}"
    return Layer(component, version, parent, dockerfile, context, args,
                 f"{repository}:{name[:100]}-{digest}")


def stack_labels(matrix: Matrix, stack: Stack) -> dict[str, str]:
    """OCI labels of a stack's final image (component versions come from each layer's LABEL)."""
    labels = {
        "org.opencontainers.image.title": stack.name,
        "org.opencontainers.image.description": stack.description,
        "org.opencontainers.image.base.name": stack.base.image,
        f"{LABEL_PREFIX}.stack": stack.name,
        f"{LABEL_PREFIX}.instances": ",".join(stack.instances),
        f"{LABEL_PREFIX}.fabric": stack.fabric,
    }
    if matrix.source:
        labels["org.opencontainers.image.source"] = matrix.source
    return labels


def plan(matrix: Matrix, stacks: list[str] | None = None, images: Path = IMAGES,
         root: Path = ROOT) -> Plan:
    """Plan the named stacks (all by default); refuses stacks that break a compatibility rule."""
    names = list(matrix.stacks) if stacks is None else stacks
    require_valid(matrix, names)
    result = Plan(matrix)
    contexts: dict[str, list[ContextFile]] = {}
    for name in names:
        stack = matrix.stack(name)
        parent = stack.base.image
        chain = []
        for cv in stack.layers:
            layer = _layer(matrix, stack, cv, parent, images, root, contexts)
            chain.append(_add(result, layer, name))
            parent = layer.ref
        final = make_layer(matrix.repository, "_stack", stack.name, parent,
                           render_stack_labels(parent, stack_labels(matrix, stack), images), [])
        chain.append(_add(result, final, name))
        result.chains[name] = chain
    return result


def _layer(matrix: Matrix, stack: Stack, cv: ComponentVersion, parent: str, images: Path,
           root: Path, contexts: dict[str, list[ContextFile]]) -> Layer:
    dockerfile = render_layer(cv, parent, stack.base, stack.fabric, images,
                              tuple(family_archs(matrix, stack)))
    if cv.component not in contexts:
        contexts[cv.component] = context_files(cv.component, images, root)
    return make_layer(matrix.repository, cv.component, cv.version, parent, dockerfile,
                      contexts[cv.component])


def _add(result: Plan, layer: Layer, stack: str) -> str:
    existing = result.layers.setdefault(layer.ref, layer)
    existing.stacks.append(stack)
    return layer.ref
