"""``invoke explain`` is faithful to a real node: the plan the entrypoint computes inside the real
``cpu-tcp`` image (``MNP_DRY_RUN=json``, facts probed in the container) and the plan
``matrix.jobs.explain`` computes from ``stacks.yaml`` and the instance table make the same decisions."""

import json
from pathlib import Path

import pytest

from entrypoint import launchers
from matrix.jobs import jobdef
from matrix.jobs.explain import IMAGE_URI, explain
from matrix.model.instances import INSTANCE_TYPES
from matrix.model.loader import load_matrix
from tests.helpers import written

pytestmark = [pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
INSTANCE = "c5n.18xlarge"
PLACEHOLDERS = ("<node-0>", "127.0.0.1")


def in_image(docker_client, image, launcher):
    # the main node as Batch starts it from what invoke jobdef writes (jobdef.batch_roles)
    definition = written("jobdef", "--stack", "cpu-tcp", "--nodes", "2", "--instance-type",
                         INSTANCE, "--image-uri", IMAGE_URI, "--launcher", launcher,
                         command=["python3", "train.py"])
    env = dict(jobdef.batch_roles(definition)[0].env, MNP_DRY_RUN="json")
    # /dev/shm as the job definition sets it (linuxParameters.sharedMemorySize): the row's
    out = docker_client.containers.run(image, ["python3", "train.py"], environment=env,
                                       remove=True, stdout=True, stderr=False,
                                       shm_size=f"{INSTANCE_TYPES[INSTANCE].shm_mib}m")
    return json.loads(out.decode("utf-8"))


def shape(argv, address, known):
    """The argv with the address as a placeholder and without the ``-x NAME`` of variables that
    only the image's own ENV has (every variable of the job reaches the ranks; ``explain`` knows
    the job definition's, not the image's)."""
    out = []
    i = 0
    while i < len(argv):
        if argv[i] == "-x" and i + 1 < len(argv) and argv[i + 1] not in known:
            i += 2
            continue
        out.append(argv[i].replace(address, "<addr>"))
        i += 1
    return out


@pytest.mark.parametrize("launcher", [n for n in launchers.NAMES if n != "none"])
def test_explain_matches_the_plan_probed_in_the_image(docker_client, cluster_image, launcher):
    real = in_image(docker_client, cluster_image, launcher)
    told = explain(load_matrix(ROOT / "stacks.yaml"), "cpu-tcp", INSTANCE, 2, launcher,
                   ["python3", "train.py"]).plan.to_dict()
    assert real["problems"] == told["problems"] == []
    for key in ("unit", "needs_ssh", "env_propagation", "runner"):
        assert real["launcher"].get(key) == told["launcher"].get(key), key
    assert real["fabric"]["kind"] == told["fabric"]["kind"] == "tcp"
    assert real["slots"]["count"] == told["slots"]["count"]
    names = {e["name"] for e in real["env"]}
    assert names == {e["name"] for e in told["env"]}
    for entry in told["env"]:
        if entry["name"].startswith("MNP_") and "ADDRESS" in entry["name"]:
            continue
        assert real["environment"][entry["name"]] == entry["value"], entry["name"]
    known = set(told["environment"])
    assert shape(real["argv"], real["address"]["address"], known) == shape(
        told["argv"], "<node-0>", known)
    # what the real node found is what stacks.yaml declares
    assert real["facts"]["versions"]["libfabric"] == "1.17.0"
    if "deepspeed" in told["facts"]["versions"]:
        assert real["facts"]["versions"]["deepspeed"] == told["facts"]["versions"]["deepspeed"]
