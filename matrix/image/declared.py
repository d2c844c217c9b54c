"""What a stack's image holds where the entrypoint looks, from its templates, without a build.

Two sources, both rendered with the stack's own layers and options:

- each template's top-level ``{% set installs = {...} %}``: the programs it installs by absolute
  path (``programs``), library folders (``libdirs``), the NCCL net plugin (``plugin``), the
  HCCL wrapper (``hccl_wrapper``) and whether its libfabric has the EFA provider
  (``fi_info_efa``). A prefix option moves what the template declares with what
  it installs; the set writes nothing into the Dockerfile.
- the rendered Dockerfiles' ``ENV`` instructions (the last stage of each), in layer order, over
  Docker's default ``PATH`` (moby ``pkg/system`` ``DefaultPathEnv``, what a container gets where
  no image sets one), and ``HOME`` of root, which Docker sets from the user's passwd entry. The
  base image's own ``ENV`` is not rendered here (an NVIDIA CUDA base adds its own ``PATH`` and
  library path): a fact of the pulled base, not of this project's templates.

A program is found as the entrypoint's probe finds it (``shutil.which`` over ``PATH``): of the
layers that install it, the one whose folder comes first on the image's ``PATH``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matrix.image.render import IMAGES, TEMPLATE, environment, render_layer
from matrix.model.cuda_arch import family_archs
from matrix.model.entities import Matrix, Stack

DOCKER_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_HOME = "/root"
# The ENTRYPOINT wrapper (images/entrypoint/mnp-entrypoint) puts the package on PYTHONPATH.
WRAPPER = IMAGES / "entrypoint" / "mnp-entrypoint"
_WRAPPER_PYTHONPATH = re.compile(r"^PYTHONPATH=([^$\s]+)", re.MULTILINE)
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass
class ImageFacts:
    """What the image declares: its environment, programs, library folders and plugins."""

    env: dict[str, str]
    programs: dict[str, str]
    libdirs: list[str] = field(default_factory=list)
    plugin: str | None = None
    hccl_wrapper: str | None = None
    fi_info_efa: bool | None = None  # None: no libfabric with the EFA provider declared
    sources: dict[str, str] = field(default_factory=dict)  # what -> the template that says so


def image_facts(matrix: Matrix, stack: Stack, images: Path = IMAGES) -> ImageFacts:
    """The image of ``stack`` as its templates declare it (see the module's docstring)."""
    env = {"PATH": DOCKER_DEFAULT_PATH, "HOME": ROOT_HOME}
    candidates: dict[str, list[str]] = {}
    facts = ImageFacts(env, {})
    archs = tuple(family_archs(matrix, stack))
    for layer in stack.layers:
        text = render_layer(layer, "scratch", stack.base, stack.fabric, images, archs)
        env.update(env_instructions(text, env))
        installs = _installs(layer, stack, images, archs)
        where = f"images/{layer.component}/{TEMPLATE} ({layer.component} {layer.version})"
        for name, path in (installs.get("programs") or {}).items():
            candidates.setdefault(name, []).append(path)
            facts.sources[name] = where
        for key in ("plugin", "hccl_wrapper", "fi_info_efa"):
            if installs.get(key):
                setattr(facts, key, installs[key])
                facts.sources[key] = where
        facts.libdirs += [d for d in installs.get("libdirs") or () if d not in facts.libdirs]
    wrapper = _WRAPPER_PYTHONPATH.search(WRAPPER.read_text())
    if wrapper and any(layer.component == "entrypoint" for layer in stack.layers):
        env["PYTHONPATH"] = wrapper.group(1)
    facts.programs = {name: on_path(paths, env["PATH"]) for name, paths in candidates.items()}
    return facts


def on_path(paths: list[str], path_variable: str) -> str:
    """Of ``paths`` (one program installed by several layers), the one ``which`` finds first."""
    order = path_variable.split(":")
    return min(paths, key=lambda p: (order.index(str(Path(p).parent))
                                     if str(Path(p).parent) in order else len(order)))


def _installs(layer: Any, stack: Stack, images: Path, archs: tuple[str, ...]) -> dict[str, Any]:
    """The template's ``installs`` rendered with the layer's options ({} where it has none)."""
    template = environment(images).get_template(f"{layer.component}/{TEMPLATE}")
    module = template.make_module(dict(component=layer.component, version=layer.version,
                                       spec=layer.spec, parent="scratch", base=stack.base,
                                       stack_fabric=stack.fabric, cuda_archs=list(archs)))
    return dict(getattr(module, "installs", None) or {})


def env_instructions(dockerfile: str, env: dict[str, str]) -> dict[str, str]:
    """The variables the Dockerfile's last stage sets with ``ENV``, ``$NAME`` expanded from
    ``env`` and from earlier instructions."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    stage = re.split(r"^FROM .*$", joined, flags=re.MULTILINE)[-1]
    current = dict(env)
    found: dict[str, str] = {}
    for line in stage.splitlines():
        if not line.startswith("ENV "):
            continue
        words = shlex.split(line[4:], posix=True)
        pairs = ([word.partition("=")[::2] for word in words] if "=" in words[0]
                 else [(words[0], " ".join(words[1:]))])
        # one instruction expands every value with the variables as they were before it
        # (https://docs.docker.com/reference/dockerfile/#environment-replacement)
        values = {name: _expand(value, current) for name, value in pairs}
        current.update(values)
        found.update(values)
    return found


def _expand(value: str, env: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` in ``value`` from ``env`` (unset: empty)."""
    return _VARIABLE.sub(lambda match: env.get(match.group(1) or match.group(2), ""), value)
