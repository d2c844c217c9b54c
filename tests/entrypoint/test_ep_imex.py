"""GB200's multi-node NVLink checked (issue 45): on an instance type whose row has
``imex_channel`` (p6e-gb200.36xlarge), the start-up health gate wants an NVIDIA IMEX channel
character device /dev/nvidia-caps-imex-channels/channel<N> in the container; without one the plan
has a PROBLEM naming the node and the missing device (the dry run shows it, a real run stops)."""

import os
import stat

import pytest

from entrypoint.plan import make as plan
from entrypoint.probe import facts, netaddr
from entrypoint.settings import config

GB200 = {"MNP_INSTANCE_TYPE": "p6e-gb200.36xlarge", "MNP_FABRIC": "tcp"}


def probe(root, env):
    cfg = config.load(env)
    found = facts.probe(cfg, {"PATH": "/bin"}, root=str(root), run=lambda argv: None,
                        which=lambda name: "/usr/bin/" + name,
                        address=netaddr.Choice("10.0.0.7", "eth0", "test"))
    return plan.make_plan(cfg, found, ["python3", "train.py"], {"PATH": "/bin"})


def imex_problems(result):
    return [p for p in result.problems if "IMEX channel" in p]


def channel(root, name, char=True):
    folder = os.path.join(str(root), "dev/nvidia-caps-imex-channels")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    if char:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # any character device
    else:
        open(path, "w").close()


def test_a_gb200_node_without_a_channel_has_a_problem_naming_it_and_the_device(tmp_path):
    (line,) = imex_problems(probe(tmp_path, GB200))
    assert line.startswith("node 10.0.0.7 (p6e-gb200.36xlarge): no NVIDIA IMEX channel: no "
                           "character device /dev/nvidia-caps-imex-channels/channel<N>")
    assert "switch/nvidia_imex" in line and "ComputeDomain" in line and "https://" in line
    assert "PROBLEM" in probe(tmp_path, GB200).text()


def test_a_plain_file_is_no_channel(tmp_path):
    channel(tmp_path, "channel0", char=False)
    assert len(imex_problems(probe(tmp_path, GB200))) == 1


@pytest.mark.parametrize("name", ["channel0", "channel7"])  # DRA / NVreg give 0, Slurm N >= 1
def test_any_channel_device_passes(tmp_path, name):
    channel(tmp_path, name)
    assert imex_problems(probe(tmp_path, GB200)) == []


def test_no_check_on_other_types_or_with_the_gate_off(tmp_path):
    assert imex_problems(probe(tmp_path, {"MNP_INSTANCE_TYPE": "p5.48xlarge",
                                          "MNP_FABRIC": "tcp"})) == []
    assert imex_problems(probe(tmp_path, dict(GB200, MNP_HEALTH="off"))) == []
