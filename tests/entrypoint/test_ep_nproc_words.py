"""``PET_NPROC_PER_NODE`` as torchrun reads it (issue 25): ``auto``, ``cpu`` and ``gpu`` are
torchrun's own words (torch/distributed/run.py ``determine_local_world_size``, cited in
``schedulers/torchenv.py``); the plan counts them on the node as torchrun does and says so, and any
other word (``abc``) is one line naming the variable, not the detected slot count."""

import os

import pytest

from entrypoint import schedulers
from entrypoint.core.errors import ConfigError
from entrypoint.plan import make as plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config

BINARIES = {"torchrun": "/usr/local/bin/torchrun", "python3": "/usr/bin/python3"}
CPUS = os.cpu_count() or 1


def node(gpus=0, hpus=0):
    slots = gpus or hpus or 1
    return NodeFacts(address="10.0.0.5", interface="eth0", is_root=True, binaries=dict(BINARIES),
                     versions={"pytorch": "2.4.0"}, gpus=gpus, hpus=hpus, slots=slots,
                     slots_source=f"nvidia-smi -L ({gpus} GPUs)" if gpus else "default")


def planned(word, facts, kind="pytorchjob", **settings):
    env = schedulers.MODULES[kind].example(2, 1)
    env.update(settings, PET_NPROC_PER_NODE=word)
    return plan.make_plan(config.load(env), facts, ["python3", "train.py"], {"PATH": "/bin"})


def nproc(p):
    return int(p.argv[p.argv.index("--nproc_per_node") + 1])


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("word, gpus, expected, said", [
    ("auto", 8, 8, "PET_NPROC_PER_NODE=auto: this node's 8 GPUs, as torchrun counts CUDA devices"),
    ("gpu", 4, 4, "PET_NPROC_PER_NODE=gpu: this node's 4 GPUs"),
    ("auto", 0, CPUS, f"PET_NPROC_PER_NODE=auto: this node's {CPUS} CPUs (os.cpu_count()), as "
                      "torchrun counts them where there is no GPU"),
    ("cpu", 8, CPUS, f"PET_NPROC_PER_NODE=cpu: this node's {CPUS} CPUs"),
])
def test_torchruns_words_are_counted_as_torchrun_counts_them(kind, word, gpus, expected, said):
    p = planned(word, node(gpus=gpus), kind)
    assert p.problems == []
    assert nproc(p) == expected and p.slots["count"] == expected
    assert p.slots["source"].startswith(said)
    assert f"devices: {expected} slot(s) from {said}" in p.text()


def test_gpu_on_a_node_without_gpus_is_a_problem_as_it_stops_torchrun():
    p = planned("gpu", node())
    assert p.problems == ['PET_NPROC_PER_NODE=gpu: torchrun stops on a node without a CUDA GPU '
                          '("Cuda is not available.") and this one has none: set a number']


def test_auto_on_a_gaudi_node_is_a_problem_since_torchruns_count_depends_on_its_release():
    p = planned("auto", node(hpus=8))
    assert len(p.problems) == 1 and "depends on its PyTorch release: set a number" in p.problems[0]


def test_mnp_slots_per_node_wins_over_the_word():
    p = planned("gpu", node(), MNP_SLOTS_PER_NODE="3")
    assert p.problems == [] and nproc(p) == 3


@pytest.mark.parametrize("word, hint", [
    ("abc", ""), ("AUTO", " (did you mean auto? torchrun reads the words as written)"),
    ("4.5", ""), ("xpu", ""),
])
def test_any_other_word_is_an_error_naming_the_variable(word, hint):
    with pytest.raises(ConfigError) as info:
        config.load(dict(schedulers.pytorchjob.example(2, 1), PET_NPROC_PER_NODE=word))
    assert str(info.value) == (f"PET_NPROC_PER_NODE: {word!r} is neither a number of processes "
                               f"nor one of torchrun's words auto, cpu, gpu{hint}")


def test_the_entrypoint_refuses_abc_in_one_line(local_node):
    env = dict(schedulers.pytorchjob.example(2, 1), PET_NPROC_PER_NODE="abc")
    result = local_node.run(["python3", "train.py"], MNP_DRY_RUN="1", **env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "PET_NPROC_PER_NODE: 'abc' is neither a number" in lines[0], lines


def test_the_entrypoints_dry_run_counts_cpu_as_torchrun_does(local_node):
    bindir = local_node.fake_program("torchrun", "#!/bin/sh\nexit 0\n")
    env = dict(schedulers.pytorchjob.example(2, 1), PET_NPROC_PER_NODE="cpu",
               PATH=f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    result = local_node.run(["python3", "train.py"], MNP_DRY_RUN="1", **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"--nproc_per_node {CPUS} " in result.stdout
    assert f"PET_NPROC_PER_NODE=cpu: this node's {CPUS} CPUs (os.cpu_count())" in result.stdout
