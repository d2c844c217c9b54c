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

The same declarations say which folders the image installs into (:attr:`ImageFacts.folders`,
:func:`image_folders`): each declared program's folder, library folder, plugin folder and the
template's own ``folders`` (what it installs or configures that the probe does not look for,
e.g. ssh's ``/etc/ssh``); every folder a layer's ``ENV`` adds to a variable of absolute paths
(``PATH``, ``LD_LIBRARY_PATH``, ``CUDA_HOME``); the folder of a layer's ``ENTRYPOINT`` program
and the wrapper's package folder; and Docker's default ``PATH``, the base image's programs. A
data mount there would hide them from the job (:func:`matrix.jobs.mounts.refuse_image_folders`).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matrix.image.render import IMAGES, TEMPLATE, environment, layer_context, render_layer
from matrix.model.cuda_arch import family_archs
from matrix.model.entities import Matrix, Stack

DOCKER_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_HOME = "/root"
# The ENTRYPOINT wrapper (images/entrypoint/mnp-entrypoint) puts the package on PYTHONPATH.
WRAPPER = IMAGES / "entrypoint" / "mnp-entrypoint"
_WRAPPER_PYTHONPATH = re.compile(r"^PYTHONPATH=([^$\s]+)", re.MULTILINE)
_WRAPPER_MODULE = re.compile(r"python3 -m (\w+)")
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_ENTRYPOINT = re.compile(r"^ENTRYPOINT\s+(.*)$", re.MULTILINE)
# moby's DefaultPathEnv (pkg/system/path.go), the PATH a container gets where no image sets one
DOCKER_PATH_SOURCE = "moby pkg/system/path.go DefaultPathEnv"


@dataclass(frozen=True)
class FolderUse:
    """Why a folder is the image's: who puts something there (``owner``, a layer as
    ``component version`` or the base image), what (``what``), and the file that says so.
    ``component`` is the layer's component, None for the base image."""

    owner: str
    what: str
    source: str
    component: str | None = None

    def sentence(self) -> str:
        return f"{self.owner} {self.what}, {self.source}"

    @property
    def starts_the_job(self) -> bool:
        """Whether it is the entrypoint's: hidden, no node of any job starts at all."""
        return self.component == "entrypoint"


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
    # folder -> why it is the image's, in layer order (the base's default PATH first)
    folders: dict[str, list[FolderUse]] = field(default_factory=dict)

    def add_folder(self, folder: str, use: FolderUse) -> None:
        normal = posixpath.normpath(folder)
        uses = self.folders.setdefault(normal, [])
        if use not in uses:
            uses.append(use)


def image_facts(matrix: Matrix, stack: Stack, images: Path = IMAGES) -> ImageFacts:
    """The image of ``stack`` as its templates declare it (see the module's docstring)."""
    env = {"PATH": DOCKER_DEFAULT_PATH, "HOME": ROOT_HOME}
    candidates: dict[str, list[str]] = {}
    facts = ImageFacts(env, {})
    base = FolderUse(f"the base image {stack.base.image}", "keeps its programs there "
                     "(Docker's default PATH)", DOCKER_PATH_SOURCE)
    for folder in DOCKER_DEFAULT_PATH.split(":"):
        facts.add_folder(folder, base)
    archs = tuple(family_archs(matrix, stack))
    for layer in stack.layers:
        text = render_layer(layer, "scratch", stack.base, stack.fabric, images, archs,
                            stack.platform)
        layer_env = env_instructions(text, env)
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
        _layer_folders(facts, layer, installs, text, layer_env)
        env.update(layer_env)
    wrapper_text = WRAPPER.read_text()
    wrapper = _WRAPPER_PYTHONPATH.search(wrapper_text)
    entrypoint = next((layer for layer in stack.layers if layer.component == "entrypoint"), None)
    if wrapper and entrypoint:
        env["PYTHONPATH"] = wrapper.group(1)
        module = _WRAPPER_MODULE.search(wrapper_text)
        use = FolderUse(f"entrypoint {entrypoint.version}",
                        f"installs its package{' ' + module.group(1) if module else ''} there",
                        "images/entrypoint/mnp-entrypoint", entrypoint.component)
        facts.add_folder(wrapper.group(1), use)
        if module:
            facts.add_folder(posixpath.join(wrapper.group(1), module.group(1)), use)
    facts.programs = {name: on_path(paths, env["PATH"]) for name, paths in candidates.items()}
    return facts


def _layer_folders(facts: ImageFacts, layer: Any, installs: dict[str, Any], dockerfile: str,
                   layer_env: dict[str, str]) -> None:
    """The folders one layer installs into, as its template declares them (``installs``), as
    its ``ENV`` adds them to a variable of paths (over ``facts.env``, the image below it) and
    as its ``ENTRYPOINT`` starts from them."""
    template = f"images/{layer.component}/{TEMPLATE}"

    def add(folder: str, what: str) -> None:
        facts.add_folder(folder, FolderUse(f"{layer.component} {layer.version}", what, template,
                                           layer.component))

    for name, path in (installs.get("programs") or {}).items():
        add(posixpath.dirname(path), f"installs {name} there")
    for key, what in (("plugin", "the NCCL net plugin"), ("hccl_wrapper", "the HCCL wrapper")):
        if installs.get(key):
            add(posixpath.dirname(installs[key]), f"installs {what} there")
    for folder in installs.get("libdirs") or ():
        add(folder, "installs libraries there")
    for folder, what in (installs.get("folders") or {}).items():
        add(folder, f"installs {what} there")
    for name, value in layer_env.items():
        for folder in _new_folders(value, facts.env.get(name, "")):
            add(folder, f"puts it in ENV {name}")
    for program in _entrypoint_programs(dockerfile):
        add(posixpath.dirname(program), f"starts the job from it (ENTRYPOINT {program})")


_FACTS: dict[tuple[str, str], ImageFacts] = {}


def declared_facts(matrix: Matrix, stack: Stack) -> ImageFacts:
    """:func:`image_facts` rendered once per process and stacks file (the templates do not change
    while a task runs; each writer and ``invoke explain`` ask for them per command)."""
    key = (str(matrix.path), stack.name)
    if key not in _FACTS:
        _FACTS[key] = image_facts(matrix, stack)
    return _FACTS[key]


def image_folders(matrix: Matrix, stack: Stack) -> dict[str, str]:
    """Every folder ``stack``'s image installs into -> who puts what there, as one clause
    (``deepspeed 0.14.4 installs deepspeed there, images/deepspeed/Dockerfile.j2``), in the
    order :func:`most_telling` gives."""
    return {folder: "; ".join(use.sentence() for use in most_telling(uses))
            for folder, uses in declared_facts(matrix, stack).folders.items()}


def most_telling(uses: list[FolderUse]) -> list[FolderUse]:
    """``uses`` with the entrypoint's first (without it no node starts), then the other layers'
    in layer order, the base image's last."""
    return sorted(uses, key=lambda use: (not use.starts_the_job, use.component is None))


def _new_folders(value: str, before: str) -> list[str]:
    """The absolute paths ``value`` (a variable an ``ENV`` sets) adds to its value ``before``,
    where every entry of it is an absolute path (``PATH``, ``LD_LIBRARY_PATH``, ``CUDA_HOME``;
    not ``NVIDIA_REQUIRE_CUDA="cuda>=12.1"``)."""
    entries = [entry for entry in value.split(":") if entry]
    if not entries or not all(entry.startswith("/") for entry in entries):
        return []
    known = set(before.split(":"))
    return [entry for entry in entries if entry not in known]


def _entrypoint_programs(dockerfile: str) -> list[str]:
    """The program of the last stage's ``ENTRYPOINT`` (exec form, a JSON list), if it has one."""
    stage = re.split(r"^FROM .*$", dockerfile, flags=re.MULTILINE)[-1]
    programs = []
    for match in _ENTRYPOINT.finditer(stage):
        try:
            words = json.loads(match.group(1))
        except ValueError:  # shell form: /bin/sh -c runs it (Dockerfile reference, ENTRYPOINT)
            words = ["/bin/sh"]
        if words and str(words[0]).startswith("/"):
            programs.append(str(words[0]))
    return programs


def on_path(paths: list[str], path_variable: str) -> str:
    """Of ``paths`` (one program installed by several layers), the one ``which`` finds first."""
    order = path_variable.split(":")
    return min(paths, key=lambda p: (order.index(str(Path(p).parent))
                                     if str(Path(p).parent) in order else len(order)))


def _installs(layer: Any, stack: Stack, images: Path, archs: tuple[str, ...]) -> dict[str, Any]:
    """The template's ``installs`` rendered with the layer's options ({} where it has none)."""
    template = environment(images).get_template(f"{layer.component}/{TEMPLATE}")
    module = template.make_module(layer_context(layer, "scratch", stack.base, stack.fabric, archs,
                                                stack.platform))
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
