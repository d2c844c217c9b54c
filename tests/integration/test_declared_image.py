"""What the templates declare for ``invoke explain`` (``matrix.image.declared``: each template's
``installs`` and the rendered ENV lines) is what the built image holds: every declared program
is the one ``command -v`` finds on the image's PATH, every declared library folder and plugin
exists, and each variable the layers' ENV sets has the declared value. Run on the images this
machine builds: cpu-tcp (Debian's packages) and the CUDA TCP stack (pip wheels, CUDA's PATH).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from matrix.image.declared import image_facts
from tests.conftest import CUDA_LAYER_TESTS, CUDA_STACK
from tests.helpers import project_matrix

# In the group of the CUDA stack's layer tests (tests/test_cuda_tcp.py says why): on a fresh
# machine its build takes minutes behind a lock, and a worker of its own would only wait there.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group(CUDA_LAYER_TESTS)]

ROOT = Path(__file__).resolve().parents[2]
MATRIX = project_matrix()
# Set by the ENTRYPOINT wrapper as it starts the entrypoint, not by the image's ENV.
WRAPPER_SETS = ("PYTHONPATH",)


def probe_image(client, image: str, names: list[str], paths: list[str]) -> dict[str, str]:
    """The image's environment, ``command -v`` of each name and which paths exist, as
    ``key=value`` lines from a shell in a container of ``image``."""
    script = "env; " + " ".join(
        f"echo which:{name}=$(command -v {name});" for name in names) + " ".join(
        f"test -e {shlex.quote(path)} && echo exists:{path}=yes;" for path in paths) + " true"
    out = client.containers.run(image, ["-c", script], entrypoint=["/bin/sh"], remove=True,
                                labels={"mnp-test": "1"}).decode()
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize("stack", ["cpu-tcp", CUDA_STACK])
def test_the_templates_declare_what_the_built_image_holds(docker_client, request, stack):
    if stack == "cpu-tcp":
        image = request.getfixturevalue("cpu_tcp_image")
    else:
        image = request.getfixturevalue("cuda_tcp_build").chains[stack][-1]
    facts = image_facts(MATRIX, MATRIX.stack(stack))
    files = [*facts.libdirs, *filter(None, (facts.plugin, facts.hccl_wrapper))]
    found = probe_image(docker_client, image, sorted(facts.programs), files)
    assert facts.programs, "no template of the stack declares a program"
    for name, path in facts.programs.items():
        assert found.get(f"which:{name}") == path, (name, path, facts.sources.get(name))
    for path in files:
        assert found.get(f"exists:{path}") == "yes", path
    for name, value in facts.env.items():
        if name not in WRAPPER_SETS:
            assert found.get(name) == value, (name, value, found.get(name))


def test_the_node_finds_the_nccl_the_stack_declares(docker_client, cuda_tcp_build):
    """The CUDA 13.2 stacks install NCCL from NVIDIA's wheel (a bare libnccl.so.2): the node's
    own dry run must find the version stacks.yaml declares (explain plans with it)."""
    from matrix.jobs.explain import _declared_versions

    image = cuda_tcp_build.chains[CUDA_STACK][-1]
    env = {"MNP_DRY_RUN": "json", "MNP_FABRIC": "tcp"}
    out = docker_client.containers.run(image, ["python3", "train.py"], environment=env,
                                       remove=True, stderr=False, labels={"mnp-test": "1"})
    probed = json.loads(out.decode())["facts"]["versions"]
    declared = _declared_versions(MATRIX.stack(CUDA_STACK))[0]
    assert probed.get("nccl") == declared["nccl"], (probed, declared)
