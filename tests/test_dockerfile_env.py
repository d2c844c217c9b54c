"""What the rendered layers set with ``ENV``, read as Docker reads a Dockerfile, not by substring.

A variable a layer must hand to every container (``NCCL_NET_PLUGIN=ofi`` on the EFA layers that
bundle the aws-ofi-nccl plugin: without it an NGC base's ``NCCL_NET_PLUGIN=spcx`` hides the
plugin from NCCL, images/efa/Dockerfile.j2 says why) persists only through an ``ENV``
instruction: a ``RUN export`` of it lasts one shell. The layers are the ones the builder builds
(``Layer.dockerfile`` of the project's plan), so what is checked is what is built.

The reading follows the Dockerfile reference (https://docs.docker.com/reference/dockerfile/):
a backslash at the end of a line continues the instruction, ``#`` starts a comment line,
``ENV <key>=<value> ...`` sets several variables (values may be quoted), and the older
``ENV <key> <value>`` sets one.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from matrix.image.plan import plan
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parent.parent


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions, each (KEYWORD, arguments) with continuations joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        if whole:
            keyword, _, arguments = whole.partition(" ")
            found.append((keyword.upper(), arguments.strip()))
    if pending.strip():
        keyword, _, arguments = pending.strip().partition(" ")
        found.append((keyword.upper(), arguments.strip()))
    return found


def env_values(text: str) -> dict[str, str]:
    """Every variable the Dockerfile's ENV instructions set, the last value winning."""
    values: dict[str, str] = {}
    for keyword, arguments in instructions(text):
        if keyword != "ENV":
            continue
        words = shlex.split(arguments)
        if words and "=" not in words[0]:  # ENV <key> <value>
            values[words[0]] = arguments.split(None, 1)[1] if len(words) > 1 else ""
            continue
        for word in words:
            key, _, value = word.partition("=")
            values[key] = value
    return values


@pytest.fixture(scope="module")
def efa_layers() -> dict[str, tuple[str, dict]]:
    """stack -> (the efa layer's Dockerfile as built, the efa version's spec), for every stack
    with an EFA layer."""
    matrix = load_matrix(ROOT / "stacks.yaml")
    result = plan(matrix)
    layers = {}
    for stack in result.chains:
        for layer in result.chain(stack):
            if layer.component == "efa":
                spec = next(cv.spec for cv in matrix.stack(stack).layers if cv.component == "efa")
                layers[stack] = (layer.dockerfile, spec)
    return layers


def test_efa_layers_with_the_bundled_plugin_set_nccl_net_plugin_by_env(efa_layers):
    bundled = {stack: text for stack, (text, spec) in efa_layers.items()
               if "aws-ofi-nccl" in spec.get("provides", {}) and "download" in spec}
    assert bundled, "no stack's EFA layer bundles aws-ofi-nccl: the check below checks nothing"
    for stack, text in bundled.items():
        assert env_values(text).get("NCCL_NET_PLUGIN") == "ofi", \
            f"{stack}: the efa layer's ENV does not set NCCL_NET_PLUGIN=ofi"


def test_efa_layers_without_the_bundled_plugin_leave_it_alone(efa_layers):
    separate = {stack: text for stack, (text, spec) in efa_layers.items()
                if "aws-ofi-nccl" not in spec.get("provides", {})}
    assert separate
    for stack, text in separate.items():
        assert "NCCL_NET_PLUGIN" not in env_values(text), stack


def test_the_reader_takes_env_from_env_instructions_only():
    text = """# ENV IN_A_COMMENT=1
FROM x
ENV PATH=/a:$PATH \\
    LD_LIBRARY_PATH=/b \\
    QUOTED="two words" NCCL_NET_PLUGIN=ofi
RUN export MOVED=ofi \\
 && echo "ENV NOT_ENV=1"
ENV OLD_FORM some value
env lower=case
"""
    assert env_values(text) == {"PATH": "/a:$PATH", "LD_LIBRARY_PATH": "/b",
                                "QUOTED": "two words", "NCCL_NET_PLUGIN": "ofi",
                                "OLD_FORM": "some value", "lower": "case"}
    assert [keyword for keyword, _ in instructions(text)] == ["FROM", "ENV", "RUN", "ENV", "ENV"]
