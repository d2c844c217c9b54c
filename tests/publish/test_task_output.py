"""What the tasks print, read from the real commands (``.venv/bin/invoke``, as a subprocess).

``invoke push`` must end with its summary line (tags pushed, already present, kept; new blobs;
the image by digest), never with the Python repr of the tags it pushed (issue 26): checked for a
push that sends everything, one that sends nothing and one with ``--force``, against the
loopback registry of conftest.py. Then every other task that builds, tests or deploys a stack
(build, test, jobdef --output, sbatch, k8s) runs once, and none may print a dataclass's repr.

The stacks file here is a one-stack copy of the project's own (its Debian base and component
entries, the project's templates), in a repository of its own, so nothing the project builds is
touched. The push tests tag two small real images under that stack's planned references
(pushing needs images, not what is in them); the build/test check builds the stack for real.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from matrix.image.plan import plan
from matrix.image.testrecord import DEFAULT_STATE_DIR, record_pass
from matrix.model.loader import load_matrix
from tests.build_project import repository_tags
from tests.publish.conftest import build_image

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
# The console script pip installed beside this interpreter (.venv/bin/invoke under ./dev), as
# a user types it; the same program through the interpreter where scripts went elsewhere.
_SCRIPT = Path(sys.executable).with_name("invoke")
INVOKE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "invoke"]
STACK = "tiny"
# A dataclass's repr, e.g. TagPush(ref='...', digest=...): a class name, "(", a field name, "=".
DATACLASS_REPR = re.compile(r"\b[A-Z][A-Za-z]+\((\w+=)")
IMAGE_URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp-stacks@sha256:" + "c" * 64


def invoke(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*INVOKE, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def succeeded(proc: subprocess.CompletedProcess) -> str:
    """stdout and stderr of a task that must have worked."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, (proc.args, proc.returncode, output[-3000:])
    return output


def ends_with(proc: subprocess.CompletedProcess, line: re.Pattern) -> None:
    """The task worked and the last line it printed is ``line``."""
    output = succeeded(proc)
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    assert line.fullmatch(last), f"last line {last!r} is not {line.pattern!r}; output:\n{output}"


def reprs(output: str) -> list[str]:
    """The lines of ``output`` that hold a dataclass repr."""
    return [line for line in output.splitlines() if DATACLASS_REPR.search(line)]


def write_stacks(folder: Path, repo: str, layers: list[dict[str, str]]) -> Path:
    """A stacks file of one stack, ``tiny``, on the project's Debian base, with the project's
    entries for ``layers``' components (``invoke`` renders them from the project's images/)."""
    project = yaml.safe_load((ROOT / "stacks.yaml").read_text(encoding="utf-8"))
    components = [name for layer in layers for name in layer]
    data = {
        "repository": repo,
        "bases": {"debian-12": project["bases"]["debian-12"]},
        "components": {name: project["components"][name] for name in components},
        "stacks": {STACK: {"description": "a small stack for output tests", "base": "debian-12",
                           "instances": ["c5n.18xlarge"], "fabric": "tcp", "layers": layers}},
    }
    path = folder / "stacks.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def forget(docker_client, repo: str, image_ids: list[str]) -> None:
    """Remove every local tag naming ``repo`` (registry-named ones too) and the test records
    this module wrote to the project's state folder. The untagged parents stay: they are the
    engine's build cache, so the next run's build of the same layers takes seconds (the build
    is still the real one, every instruction checked against its cache), not a minute of apt."""
    import docker.errors

    for tag in repository_tags(docker_client, repo):
        with contextlib.suppress(docker.errors.APIError):  # gone with another tag
            docker_client.images.remove(tag, noprune=True)
    for image_id in image_ids:
        (DEFAULT_STATE_DIR / f"{image_id.split(':', 1)[1]}.json").unlink(missing_ok=True)


# --- invoke push's last line -----------------------------------------------------------------

@dataclass
class Pushable:
    """A stack whose planned layer images exist locally: the stacks file, repository, image."""

    stacks: Path
    repo: str
    image_id: str

    def push(self, registry: str, *extra: str) -> subprocess.CompletedProcess:
        return invoke("push", "--stacks", str(self.stacks), "--stack", STACK, "--registry",
                      registry, *extra)


@pytest.fixture
def pushable(docker_client, shell_base, tmp_path) -> Iterator[Pushable]:
    """Two fresh images (a nonce in each: a push really sends data) on the shell-only base
    (tests/publish/conftest.py), tagged as the two references ``invoke`` plans for the stack,
    the last also as ``repo:tiny``; untested."""
    repo = f"mnp-output-{secrets.token_hex(4)}"
    stacks = write_stacks(tmp_path, repo, [{"python": "3.11.2"}])
    chain = plan(load_matrix(stacks), [STACK]).chains[STACK]
    assert len(chain) == 2  # the python layer and the stack's label layer
    nonce = secrets.token_hex(8)
    first = build_image(docker_client, f"FROM {shell_base}\nRUN echo {nonce} > /layer-a\n")
    final = build_image(docker_client, f"FROM {first}\nRUN echo {nonce} > /layer-b\n")
    for ref, image_id in zip(chain, (first, final)):
        docker_client.images.get(image_id).tag(*ref.rsplit(":", 1))
    docker_client.images.get(final).tag(repo, STACK)
    yield Pushable(stacks, repo, final)
    forget(docker_client, repo, [final])


def summary(registry, repo: str, pushed: int, present: int, blobs: str) -> re.Pattern:
    """PushResult.summary()'s line for the four tags of a two-layer stack; ``blobs`` a regex."""
    digest = registry.manifest_digest(repo, STACK)
    assert digest, f"{repo}:{STACK} is not in the registry"
    return re.compile(
        rf"{STACK}: {pushed} tag\(s\) pushed, {present} already present, 0 kept; {blobs} new "
        rf"blobs? sent to {re.escape(registry.host)}; image: "
        rf"{re.escape(f'{registry.host}/{repo}@{digest}')}")


def test_a_push_that_sends_everything_ends_with_its_summary(pushable, registry):
    record_pass(pushable.image_id, STACK)

    proc = pushable.push(registry.host)

    ends_with(proc, summary(registry, pushable.repo, 4, 0, r"[1-9]\d*"))
    assert reprs(proc.stdout + proc.stderr) == []


def test_a_push_that_sends_nothing_ends_with_its_summary(pushable, registry):
    record_pass(pushable.image_id, STACK)
    succeeded(pushable.push(registry.host))
    offset = registry.log_size()

    proc = pushable.push(registry.host)

    ends_with(proc, summary(registry, pushable.repo, 0, 4, "0"))
    assert reprs(proc.stdout + proc.stderr) == []
    writes = [line for line in registry.requests_since(offset)
              if line.split(" ")[0] in {"POST", "PUT", "PATCH"}]
    assert writes == []  # it really sent nothing


def test_a_forced_push_of_an_untested_image_ends_with_its_summary(pushable, registry):
    proc = pushable.push(registry.host, "--force")

    ends_with(proc, summary(registry, pushable.repo, 4, 0, r"[1-9]\d*"))
    assert "WITHOUT passing tests" in proc.stdout  # the warning came, before the summary
    assert reprs(proc.stdout + proc.stderr) == []


# --- every other task ----------------------------------------------------------------------------

@pytest.fixture
def small_stack(docker_client, base_image, tmp_path) -> Iterator[Path]:
    """The smallest stack that builds and passes its tests: Python, then the entrypoint."""
    repo = f"mnp-output-{secrets.token_hex(4)}"
    stacks = write_stacks(tmp_path, repo, [{"python": "3.11.2"}, {"entrypoint": "0.1.0"}])
    yield stacks
    tested = [image.id for image in docker_client.images.list(name=repo)]
    forget(docker_client, repo, tested)


def test_no_task_prints_a_dataclass_repr(small_stack, tmp_path):
    """build and test on a stack built here; the generators on the project's cpu-tcp, whose
    image they only name (--image-uri), so nothing of it is built."""
    job = ["--stack", "cpu-tcp", "--nodes", "2", "--instance-type", "c5n.18xlarge",
           "--image-uri", IMAGE_URI]
    on_small = ["--stacks", str(small_stack), "--stack", STACK]
    jobdef_file = tmp_path / "jobdef.json"
    tasks = {
        "build": ["build", *on_small, "--metadata-file", str(tmp_path / "build.json")],
        "test": ["test", *on_small],
        "jobdef --output": ["jobdef", *job, "--output", str(jobdef_file), "--", "python3",
                            "train.py"],
        "sbatch": ["sbatch", *job, "--", "python3", "train.py"],
        "k8s": ["k8s", "--kind", "pytorchjob", *job, "--", "python3", "train.py"],
    }
    found = {}
    for task, args in tasks.items():
        output = succeeded(invoke(*args, timeout=900))
        if task == "jobdef --output":
            output += jobdef_file.read_text(encoding="utf-8")
        found[task] = reprs(output)
    assert found == {task: [] for task in tasks}
