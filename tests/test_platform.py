"""arm64 as a platform (issue 45): the platform is data in the stack schema, the instance table
(`arch` in every row), a rule class (instance-platform) that `invoke stacks` and every writer
apply, every content tag and `invoke plan --json`; Kubernetes manifests select
kubernetes.io/arch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrix.image import bootstrap
from matrix.image.plan import content_tag, plan
from matrix.model.instances import INSTANCE_TYPES, TABLE
from matrix.model.loader import load_matrix
from matrix.model.rules import check_matrix, known_runners, load_rules
from tests.helpers import one_line, project_matrix, stacks_with

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu-tcp-arm64@sha256:" + "e" * 64
RULE = "instance-platform"
CI_RULE = "ci-runner-platform"
ARM64_STACK = "cpu-tcp-arm64"
TASKS = {"jobdef": ["jobdef"], "sbatch": ["sbatch"], "k8s": ["k8s", "--kind", "mpijob"]}


def invoke(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_every_instance_row_says_its_architecture_and_cites_it():
    raw = yaml.safe_load(TABLE.read_text(encoding="utf-8"))["instances"]
    assert all("arch" in row for row in raw.values()), [n for n, r in raw.items() if "arch" not in r]
    arm = {name for name, row in INSTANCE_TYPES.items() if row.arch == "arm64"}
    assert arm == {"c7gn.16xlarge", "hpc7g.16xlarge", "p6e-gb200.36xlarge"}
    assert {row.arch for row in INSTANCE_TYPES.values()} == {"amd64", "arm64"}
    for row in INSTANCE_TYPES.values():
        assert "kubernetes.io/arch" in row.source or row.name == "p6e-gb200.36xlarge", row.name
    gb200 = INSTANCE_TYPES["p6e-gb200.36xlarge"]
    assert (gb200.gpus, gb200.gpu_model, gb200.efa_interfaces, gb200.imex_channel) == \
        (4, "GB200", 4, True)
    assert "AL2023 ARM NVIDIA" in gb200.source


def test_a_stack_on_a_type_of_another_architecture_is_invalid_with_the_rule(tmp_path):
    stacks = stacks_with(tmp_path, {"cpu-tcp-arm64": "c7gn.16xlarge, c5n.18xlarge",
                                    "cpu-mpi": "c5n.18xlarge, hpc7g.16xlarge"})
    proc = invoke("stacks", "--stacks", str(stacks), "--json")
    assert one_line(proc, 1) == f"error: 2 stack(s) in {stacks} break compatibility rules"
    rows = {row["name"]: row for row in json.loads(proc.stdout)["stacks"]}
    rule = {rule.id: rule for rule in load_rules()}[RULE]
    assert rows["cpu-tcp-arm64"]["violations"] == [
        f"instance c5n.18xlarge is amd64; the stack is built for linux/arm64 "
        f"[rule class {RULE}: {rule.why}; source: {rule.source}]"]
    assert rows["cpu-mpi"]["violations"] == [
        f"instance hpc7g.16xlarge is arm64; the stack is built for linux/amd64 "
        f"[rule class {RULE}: {rule.why}; source: {rule.source}]"]


def test_a_stack_whose_ci_runner_is_of_another_architecture_is_invalid_with_the_rule(tmp_path):
    stacks = stacks_with(tmp_path, {"cpu-tcp-arm64": "ubuntu-24.04",
                                    "cpu-mpi": "ubuntu-22.04-arm"}, key="ci")
    proc = invoke("stacks", "--stacks", str(stacks), "--json")
    assert one_line(proc, 1) == f"error: 2 stack(s) in {stacks} break compatibility rules"
    rows = {row["name"]: row for row in json.loads(proc.stdout)["stacks"]}
    rule = {rule.id: rule for rule in load_rules()}[CI_RULE]
    tail = f" [rule class {CI_RULE}: {rule.why}; source: {rule.source}]"
    assert rows["cpu-tcp-arm64"]["violations"] == [
        "ci.runner ubuntu-24.04 runs jobs on amd64; the stack is built for linux/arm64 "
        "(runners of linux/arm64: ubuntu-22.04-arm, ubuntu-24.04-arm)" + tail]
    assert rows["cpu-mpi"]["violations"] == [
        "ci.runner ubuntu-22.04-arm runs jobs on arm64; the stack is built for linux/amd64 "
        "(runners of linux/amd64: ubuntu-22.04, ubuntu-24.04)" + tail]
    # the build refuses it too, with the rule's source
    line = one_line(invoke("plan", "--stacks", str(stacks), "--stack", "cpu-tcp-arm64"), 1)
    assert f"[rule {CI_RULE}; source: {rule.source}" in line, line


def test_every_known_runner_label_is_in_the_rules_source():
    """The runner table is data from GitHub's runner reference, not a guess from the name."""
    rule = {rule.id: rule for rule in load_rules()}[CI_RULE]
    runners = known_runners()
    assert runners == {"ubuntu-24.04": "amd64", "ubuntu-22.04": "amd64",
                       "ubuntu-24.04-arm": "arm64", "ubuntu-22.04-arm": "arm64"}
    assert "docs.github.com/en/actions/reference/runners/github-hosted-runners" in rule.source
    for label in runners:
        assert label in rule.source, label
    # every stack of the project that names a runner names one of them, of its platform
    matrix = project_matrix()
    named = {s.name: s.ci_runner for s in matrix.stacks.values() if s.ci_runner}
    assert {n: runners[r] for n, r in named.items() if runners[r] != matrix.stack(n).arch} == {}
    assert named["cpu-tcp-arm64"] == named["cuda13.2-tcp-arm64"] == "ubuntu-24.04-arm"


def test_an_unknown_ci_runner_label_is_refused_in_one_line_naming_the_key(tmp_path):
    stacks = stacks_with(tmp_path, {"cpu-tcp-arm64": "ubuntu-24.04-arm64"}, key="ci")
    line = one_line(invoke("stacks", "--stacks", str(stacks)), 1)
    row = next(n for n, text in enumerate(stacks.read_text().splitlines(), 1)
               if "ubuntu-24.04-arm64" in text)
    assert line == (
        f"error: {stacks}:{row}: stacks/cpu-tcp-arm64/ci/runner: runner label "
        f"'ubuntu-24.04-arm64' is not one rule class {CI_RULE} knows the architecture of; did "
        "you mean ubuntu-24.04-arm? (known: ubuntu-22.04, ubuntu-22.04-arm, ubuntu-24.04, "
        "ubuntu-24.04-arm; a new one goes in matrix/model/rules.yaml with its source)"), line


def test_the_project_stacks_keep_to_their_platform():
    matrix = project_matrix()
    assert {n: [str(v) for v in found] for n, found in check_matrix(matrix).items() if found} == {}
    assert matrix.stack("cpu-tcp-arm64").platform == "linux/arm64"
    assert matrix.stack("cuda13.2-efa-arm64").platform == "linux/arm64"
    assert matrix.stack("cuda13.2-efa-arm64").fabric == "efa"
    assert matrix.stack("cpu-tcp").platform == "linux/amd64"


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize(("stack", "instance", "arch", "platform"), [
    ("cpu-tcp-arm64", "c5n.18xlarge", "amd64", "linux/arm64"),
    ("cpu-mpi", "c7gn.16xlarge", "arm64", "linux/amd64"),
    ("cuda13.2-efa-arm64", "p5.48xlarge", "amd64", "linux/arm64"),
])
def test_every_writer_refuses_a_stack_on_a_type_of_another_architecture(
        tmp_path, task, stack, instance, arch, platform):
    target = tmp_path / "out"
    line = one_line(invoke(*TASKS[task], "--stack", stack, "--instance-type", instance,
                           "--nodes", "2", "--image-uri", IMAGE, "--output", str(target),
                           "--", "python3", "train.py"), 1)
    assert (f"stack {stack} cannot run on {instance}" in line
            and f"instance {instance} is {arch}; the stack is built for {platform} "
                f"[rule {RULE}]" in line), line
    assert not target.exists()


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize(("stack", "instance"), [("cpu-tcp-arm64", "hpc7g.16xlarge"),
                                                 ("cuda13.2-efa-arm64", "p6e-gb200.36xlarge")])
def test_every_writer_accepts_an_arm64_stack_on_its_arm64_types(tmp_path, task, stack, instance):
    target = tmp_path / "out"
    proc = invoke(*TASKS[task], "--stack", stack, "--instance-type", instance,
                  "--nodes", "2", "--image-uri", IMAGE, "--output", str(target),
                  "--", "python3", "train.py")
    assert proc.returncode == 0, proc.stderr
    if task == "k8s":
        text = target.read_text(encoding="utf-8")
        assert "kubernetes.io/arch: arm64" in text


def test_an_arm64_layer_of_the_same_dockerfile_gets_another_tag():
    matrix = project_matrix()
    result = plan(matrix, ["cpu-mpi", "cpu-tcp-arm64"], engine=None)
    amd = {layer.component: layer for layer in result.chain("cpu-mpi")}
    arm = {layer.component: layer for layer in result.chain("cpu-tcp-arm64")}
    for component in ("ssh", "libfabric", "openmpi", "python", "entrypoint"):
        assert amd[component].tag != arm[component].tag, component
        assert "-arm64-" in arm[component].tag and "arm64" not in amd[component].tag
        assert (amd[component].platform, arm[component].platform) == \
            ("linux/amd64", "linux/arm64")
    # the same Dockerfile on the same parent name: only the platform tells them apart
    ssh = amd["ssh"]
    same = content_tag("debian:bookworm", ssh.dockerfile, ssh.context, ssh.build_args)
    other = content_tag("debian:bookworm", ssh.dockerfile, ssh.context, ssh.build_args,
                        "linux/arm64")
    assert same != other
    # amd64 hashes nothing more: its tags are those before stacks had a platform
    assert content_tag("p", "d", [], {}, "linux/amd64") == content_tag("p", "d", [], {})


def test_a_bases_include_is_part_of_its_recipe_and_the_default_keeps_the_old_tags():
    bases = project_matrix().bases
    amd64, arm64 = bases["debian-12"], bases["debian-12-arm64"]
    assert bootstrap.packages(amd64) == ["ca-certificates"]  # stacks.yaml names none: the default
    spelled = dataclasses.replace(amd64, bootstrap={**amd64.bootstrap,
                                                     "include": ["ca-certificates"]})
    assert bootstrap.recipe_digest(spelled) == bootstrap.recipe_digest(amd64)
    # the arm64 base adds nothing to minbase; with the default it would be another recipe
    assert bootstrap.packages(arm64) == []
    default = dataclasses.replace(arm64, bootstrap={key: value for key, value in
                                                    arm64.bootstrap.items() if key != "include"})
    assert bootstrap.recipe_digest(default) != bootstrap.recipe_digest(arm64)


def test_plan_json_shows_each_layers_platform():
    proc = invoke("plan", "--stack", "cpu-tcp-arm64", "--stack", "cuda13.2-efa-arm64", "--json")
    assert proc.returncode == 0, proc.stderr
    layers = json.loads(proc.stdout)["layers"]
    assert layers and {row["platform"] for row in layers} == {"linux/arm64"}
    assert "efa" in {row["component"] for row in layers}
    proc = invoke("plan", "--stack", "cpu-mpi", "--json")
    assert {row["platform"] for row in json.loads(proc.stdout)["layers"]} == {"linux/amd64"}


def test_the_efa_layer_looks_for_the_plugin_in_its_platforms_multiarch_folder():
    """The installer's Debian packages put the bundled aws-ofi-nccl plugin in the multiarch
    folder of the architecture (aarch64-linux-gnu on arm64; installers from 1.48 use lib on
    both): the arm64 efa layer puts that folder on LD_LIBRARY_PATH and accepts it at build time,
    where an x86_64 folder would make the build refuse the plugin. The amd64 layer keeps its
    x86_64 folder and its tag (no platform in it), so no amd64 layer rebuilds."""
    result = plan(project_matrix(), ["cuda13.2-efa", "cuda13.2-efa-arm64"], engine=None)
    folders = {"cuda13.2-efa": "x86_64-linux-gnu", "cuda13.2-efa-arm64": "aarch64-linux-gnu"}
    for stack, folder in folders.items():
        efa = next(layer for layer in result.chain(stack) if layer.component == "efa")
        plugin = f"/opt/amazon/ofi-nccl/lib/{folder}"
        library_path = efa.dockerfile.split("LD_LIBRARY_PATH=", 1)[1].split(":$LD_LIBRARY_PATH")[0]
        assert library_path.split(":")[0] == plugin, (stack, library_path)
        assert f'case "$plugin_dir" in {plugin}|' in efa.dockerfile, stack
        other = next(f for s, f in folders.items() if s != stack)
        assert other not in efa.dockerfile, stack
    generated = ROOT / "images" / "generated" / "cuda13.2-efa"
    efa = next(layer for layer in result.chain("cuda13.2-efa") if layer.component == "efa")
    assert next(generated.glob("*-efa.Dockerfile")).read_text(encoding="utf-8") == efa.dockerfile
    assert "arm64" not in efa.tag


def test_explain_on_p6e_gb200_says_what_multi_node_nvlink_needs():
    proc = invoke("explain", "--stack", "cuda13.2-tcp-arm64", "--instance-type",
                  "p6e-gb200.36xlarge", "--nodes", "2", "--launcher", "torchrun")
    assert ("p6e-gb200 multi-node NVLink needs the NVIDIA IMEX service on each host and an IMEX "
            "channel /dev/nvidia-caps-imex-channels/channelN in the container") in proc.stdout
    source = INSTANCE_TYPES["p6e-gb200.36xlarge"].source
    for fact in ("imexchannels.html", "switch/nvidia_imex", "CVE-2024-42511",
                 "computedomain.go", "src/mnnvl.cc", "capacity-blocks-nvidia-imex.html"):
        assert fact in source, fact


@pytest.mark.docker
def test_a_base_of_another_architecture_is_refused_in_one_line(docker_client, tmp_path):
    """The engine would build the arm64 stack on an amd64 base without a word (20.10's builder
    enforces no platform): `invoke build` refuses it before any layer, in one line."""
    amd64 = load_matrix(ROOT / "stacks.yaml").stack("cpu-tcp").base.image
    if not bootstrap._local(docker_client, amd64):
        pytest.skip(f"needs the amd64 base {amd64} (the cpu-tcp build makes it)")
    text = (ROOT / "stacks.yaml").read_text(encoding="utf-8")
    start = text.index("\n  debian-12-arm64:\n")
    line = text.index("    image: arm64v8/debian:bookworm\n", start)
    text = text.replace(text[line:text.index("\n  ubuntu-18.04:\n", line)],
                        f"    image: {amd64}\n    os: debian12\n"
                        '    provides: {debian: "12", python: "3.11.2"}', 1)
    stacks = tmp_path / "stacks.yaml"
    stacks.write_text(text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "invoke", "build", "--stacks", str(stacks),
                           "--stack", ARM64_STACK], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert one_line(proc, 1) == (
        f"error: base 'debian-12-arm64' of stack {ARM64_STACK}: {amd64} is linux/amd64 (its image "
        f"config's Architecture), not linux/arm64 as the stack's platform says; remove it "
        f"(docker rmi {amd64}) so that it is pulled or bootstrapped for linux/arm64")
