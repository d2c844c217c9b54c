"""A throwaway project for builder tests: small templates, a stacks file, and a unique repository.

Shared by tests/test_build.py and tests/test_build_faults.py, which each turn
:func:`project_files` into their ``project`` fixture.
"""

from __future__ import annotations

import contextlib
import io
import uuid
from pathlib import Path

from rich.console import Console

from matrix.image import build
from matrix.image.plan import plan
from matrix.model.loader import load_matrix

TEMPLATE = """{% import "_macros.j2" as m %}
FROM {{ parent }}
{{ m.preamble(component, version) }}
RUN echo "{{ component }} {{ version }}" > /layer-{{ component }}
"""
CA_TEMPLATE = """{% import "_macros.j2" as m %}
FROM {{ parent }}
{{ m.preamble(component, version) }}
ARG MNP_CA_URL
RUN {{ m.ca_begin() }}; \\
    test -s /tmp/mnp-ca.pem && test "$PIP_CERT" = /tmp/mnp-ca.pem \\
 && sha256sum /tmp/mnp-ca.pem | cut -c1-64 > /ca-seen-during-build; \\
    {{ m.ca_end() }}
"""


def stacks_text(repo: str, budget: str = "") -> str:
    components = "\n".join(
        f"  {name}:\n    description: test layer\n    versions:\n      \"1.0\": {{source: apt}}"
        for name in ("alpha", "beta", "gamma", "delta", "withca"))
    return f"""repository: {repo}
bases:
  debian-12:
    image: debian:bookworm
    os: debian12
    provides: {{python: "3.11.2"}}
components:
{components}
stacks:
  one:
    description: first
    base: debian-12
    instances: [c5n.18xlarge]
    fabric: tcp
{budget}    layers:
      - alpha: "1.0"
      - beta: "1.0"
      - gamma: "1.0"
  two:
    description: shares alpha and beta with one
    base: debian-12
    instances: [c5n.18xlarge]
    fabric: tcp
    layers:
      - alpha: "1.0"
      - beta: "1.0"
      - delta: "1.0"
  ca:
    description: downloads through the extra CA
    base: debian-12
    instances: [c5n.18xlarge]
    fabric: tcp
    layers:
      - withca: "1.0"
"""


def project_files(tmp_path: Path, docker_client):
    """A throwaway project: stacks file, templates, and a unique repository cleaned up after."""
    from matrix.model.settings import IMAGES

    repo = f"mnp-test-{uuid.uuid4().hex[:8]}"
    images = tmp_path / "images"
    images.mkdir()
    (images / "_macros.j2").write_text((IMAGES / "_macros.j2").read_text())
    (images / "_stack").mkdir()
    (images / "_stack" / "Dockerfile.j2").write_text(
        (IMAGES / "_stack" / "Dockerfile.j2").read_text())
    for name in ("alpha", "beta", "gamma", "delta"):
        (images / name).mkdir()
        (images / name / "Dockerfile.j2").write_text(TEMPLATE)
    (images / "withca").mkdir()
    (images / "withca" / "Dockerfile.j2").write_text(CA_TEMPLATE)
    stacks = tmp_path / "stacks.yaml"
    stacks.write_text(stacks_text(repo))
    yield {"stacks": stacks, "images": images, "repo": repo, "state": tmp_path / "state"}
    remove_repository(docker_client, repo)


def remove_repository(client, repo: str) -> None:
    """Untag every image of ``repo``, newest first, so children go before their parents.

    Only ``repo``'s own tags: two projects' identical layers are one cached image with both
    projects' tags, and another test may be building with its tag at this moment."""
    from docker.errors import APIError

    for tag in repository_tags(client, repo):
        with contextlib.suppress(APIError):
            client.images.remove(tag)


def repository_tags(client, repo: str) -> list[str]:
    """The engine's tags of ``repo``, local or registry-named (a layer pushed to or pulled from
    a test registry is tagged ``host:port/repo:tag``), newest image first.

    Read from the image summaries (GET /images/json), one answer with tags and creation times.
    docker-py's ``images.list()`` inspects every image after listing, so an image that a test in
    another worker removes in between fails the whole listing with ImageNotFound."""
    summaries = sorted(client.api.images(), key=lambda summary: summary["Created"], reverse=True)
    return [tag for summary in summaries for tag in summary.get("RepoTags") or []
            if (name := tag.rsplit(":", 1)[0]) == repo or name.endswith(f"/{repo}")]


def run_build(client, project, names, **kwargs):
    matrix = load_matrix(project["stacks"])
    result = plan(matrix, names, images=project["images"], root=project["images"].parent)
    out = io.StringIO()
    console = Console(file=out, width=200, highlight=False)
    try:
        statuses = build.build(client, result, names, console=console, state=project["state"],
                               **kwargs)
    finally:
        project["log"] = out.getvalue()
    return result, [(r.layer.name, r.status) for r in statuses]


def built_on_parent_or_why(client, result, names) -> list[str]:
    """Every layer whose image is not built on the image its parent's tag names (empty: none)."""
    wrong = []
    for name in names:
        for ref in result.chains[name]:
            layer = result.layers[ref]
            parent_id = client.images.get(layer.parent).id
            history = [entry.get("Id") for entry in client.api.history(ref)]
            parent_layers = client.images.get(layer.parent).attrs["RootFS"]["Layers"]
            own_layers = client.images.get(ref).attrs["RootFS"]["Layers"]
            if parent_id not in history or own_layers[:len(parent_layers)] != parent_layers:
                wrong.append(f"{layer.name} is not built on {layer.parent} ({parent_id[:19]})")
    return wrong
