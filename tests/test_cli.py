"""The command line as a user meets it: `invoke <task>` in a real process, one line per mistake.

Each test here reproduces one defect a new user hit (issue 11) and checks the behaviour now.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrix.cli.options import command_after_dashdash, integer
from matrix.errors import UserError
from tests.helpers import stacks_yaml

ROOT = Path(__file__).resolve().parent.parent
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
STACKS_DATA = stacks_yaml()["stacks"]
ALL_STACKS = list(STACKS_DATA)
# Images of the default stack: one per declared layer plus the label-only stack layer.
CPU_TCP_IMAGES = len(STACKS_DATA["cpu-tcp"]["layers"]) + 1


def invoke(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT,
           timeout: int = 300) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=environment, check=False)


USAGE, CANNOT = 2, 1  # exit statuses: a mistake in the command line; what cannot be done


def one_error_line(proc: subprocess.CompletedProcess, code: int = CANNOT) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# --- integers, missing options, did you mean ----------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    (["jobdef", "--stack", "cpu-tcp", "--nodes", "two", "--instance-type", "c5n.18xlarge"],
     "--nodes 'two': expected a whole number"),
    (["run", "--nodes", "x", "--", "true"], "--nodes 'x': expected a whole number"),
    (["run", "--nodes", "2", "--late-node", "first", "--", "true"], "--late-node 'first'"),
    (["jobdef", "--nodes", "0", "--instance-type", "c5n.18xlarge"],
     "--nodes 0: expected a whole number from 1 to 10000"),
])
def test_integer_options_are_one_line(args, expected):
    assert expected in one_error_line(invoke(*args, env=NO_ENGINE), USAGE)


NODE_TASKS = {
    "explain": ["explain", "--instance-type", "c5n.18xlarge"],
    "jobdef": ["jobdef", "--instance-type", "c5n.18xlarge", "--image-uri",
               "r@sha256:" + "a" * 64],
    "run": ["run"],
}


@pytest.mark.parametrize("task", sorted(NODE_TASKS))
@pytest.mark.parametrize("nodes, expected", [
    ("0", "--nodes 0: expected a whole number from 1 to 10000 (the entrypoint's limit)"),
    ("-1", "--nodes -1: expected a whole number from 1 to 10000"),
    ("10001", "--nodes 10001: expected a whole number from 1 to 10000"),
    ("1000000000", "--nodes 1000000000: expected a whole number from 1 to 10000"),
    ("x", "--nodes 'x': expected a whole number, e.g. --nodes 2"),
])
def test_one_nodes_validator_and_one_exit_code_for_every_task(task, nodes, expected):
    proc = invoke(*NODE_TASKS[task], "--nodes", nodes, "--", "true", env=NO_ENGINE)
    assert one_error_line(proc, USAGE).startswith(f"error: {expected}")


def test_above_batchs_default_node_limit_is_a_note_citing_aws():
    """invoke jobdef says it once on stderr; explain --scheduler batch among its plan's notes;
    no other scheduler's job says it (the limit is AWS Batch's)."""
    pick = ("--instance-type", "c5n.18xlarge", "--nodes", "1001")
    notes = []
    proc = invoke("jobdef", *pick, "--image-uri", "r@sha256:" + "a" * 64, "--", "python3",
                  "train.py", env=NO_ENGINE)
    assert proc.returncode == 0, proc.stderr
    notes.append(proc.stderr.strip())
    proc = invoke("explain", *pick, env=NO_ENGINE)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "1001 x c5n.18xlarge" in proc.stdout
    notes += [line for line in proc.stdout.splitlines() if "default limit" in line]
    for note in notes:
        assert note.startswith("note: --nodes 1001 is above AWS Batch's default limit of 1000 "
                               "nodes"), notes
        assert "https://docs.aws.amazon.com/batch/latest/userguide/mnp-node-groups.html" in note
    assert len(notes) == 2, notes
    proc = invoke("explain", *pick, "--scheduler", "slurm", env=NO_ENGINE)
    assert proc.returncode == 0, proc.stderr
    assert "Batch" not in proc.stdout + proc.stderr


def test_integer_helper():
    assert integer("3", "--nodes") == 3
    with pytest.raises(UserError, match="--nodes '3.5': expected a whole number"):
        integer("3.5", "--nodes")


@pytest.mark.parametrize("args, expected", [
    (["jobdef"], "missing option --nodes"),
    (["jobdef", "--nodes", "2"], "missing option --instance-type"),
    (["push"], "missing option --registry"),
])
def test_missing_options_are_named_as_options(args, expected):
    line = one_error_line(invoke(*args, env=NO_ENGINE), USAGE)
    assert expected in line
    assert "instance_type" not in line and "positional" not in line


@pytest.mark.parametrize("args, expected", [
    (["build", "--stack", "cpu-tpc"], "--stack 'cpu-tpc': no stack of that name; did you mean cpu-tcp?"),
    (["plan", "--stack", "cuda12.1-ef"], "did you mean cuda12.1-efa?"),
    (["jobdef", "--nodes", "2", "--instance-type", "c5n.18xlarg"],
     "--instance-type 'c5n.18xlarg': no instance type of that name; did you mean c5n.18xlarge?"),
    (["jobdef", "--nodes", "2", "--instance-type", "c5n.18xlarge", "--launcher", "torchrn"],
     "--launcher 'torchrn': no launcher of that name; did you mean torchrun?"),
    (["plan", "--stacks", "cpu-tcp"], "did you mean --stack cpu-tcp?"),
])
def test_did_you_mean(args, expected):
    assert expected in one_error_line(invoke(*args, env=NO_ENGINE), USAGE)


@pytest.mark.parametrize("args, expected", [
    # forgetting -- before the command: invoke said "No idea what 'python3' is!"
    (["run", "--nodes", "2", "python3", "train.py"],
     "the command goes after --: invoke run --nodes 2 -- python3 train.py"),
    (["jobdef", "--nodes", "2", "python3", "-c", "print(1)"],
     "the command goes after --: invoke jobdef --nodes 2 -- python3 -c print(1)"),
    # an option without its value: "Flag <Argument: instance_type> needed value ..."
    (["explain", "--instance-type"],
     "--instance-type needs a value, e.g. invoke explain --instance-type c5n.18xlarge"),
    (["jobdef", "--instance-type", "--nodes", "2"], "--instance-type needs a value"),
    # invoke took a bare --stack as an empty list and planned the default stack
    (["plan", "--stack"], "--stack needs a value, e.g. invoke plan --stack cpu-tcp"),
    (["plan", "--stacks", "stacks.yaml", "--stack"], "--stack needs a value"),
    # --json where a task has none: "No idea what '--json' is!"
    (["matrix", "--json"], "invoke matrix has no option --json; --json is an option of: build, "
                           "explain, plan, stacks (its options: --stacks)"),
    (["jobdef", "--json"], "invoke jobdef has no option --json"),
    (["ref", "--json"], "invoke ref has no option --json; --json is an option of: build, "
                        "explain, plan, stacks (its options: --stack, --stacks)"),
    (["ref", "--stack", "cpu-tcp", "--json"], "invoke ref has no option --json"),
    (["lint", "--json"], "invoke lint has no option --json; --json is an option of: build, "
                         "explain, plan, stacks (its options: --stacks)"),
    (["plan", "--jsn"], "invoke plan has no option --jsn; did you mean --json?"),
    (["build", "-t"], "invoke build has no option -t: options have no short forms"),
    (["plna"], "no task named 'plna'; did you mean plan?"),
])
def test_invokes_own_parser_messages_never_reach_users(args, expected):
    proc = invoke(*args, env=NO_ENGINE)
    assert one_error_line(proc, USAGE).startswith(f"error: {expected}"), proc.stderr
    assert "No idea" not in proc.stderr and "Argument" not in proc.stderr


def test_a_stack_given_as_a_word_points_at_the_option():
    line = one_error_line(invoke("plan", "cpu-tcp"), USAGE)
    assert line == "error: stacks are given with --stack: invoke plan --stack cpu-tcp"
    assert one_error_line(invoke("lint", "cpu-mpi"), USAGE) == "error: invoke lint takes no stack"


# --- which stacks: default, --all, repeated --stack ------------------------------------------------

def plan_json(*args: str, env: dict[str, str] | None = None) -> dict:
    proc = invoke("plan", "--json", *args, env=NO_ENGINE if env is None else env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_default_stack_all_and_repeated_stack():
    assert plan_json()["stacks"] == ["cpu-tcp"]  # default_stack in stacks.yaml
    assert plan_json("--all")["stacks"] == ALL_STACKS
    assert plan_json("--stack", "cpu-mpi", "--stack", "cpu-tcp")["stacks"] == ["cpu-mpi", "cpu-tcp"]
    assert "either --stack or --all" in one_error_line(invoke("plan", "--all", "--stack", "cpu-tcp"),
                                                        USAGE)
    assert "--stack given 2 times; this command takes one stack" in one_error_line(
        invoke("ref", "--stack", "cpu-tcp", "--stack", "cpu-mpi"), USAGE)


def test_default_stack_must_name_a_stack(tmp_path):
    text = (ROOT / "stacks.yaml").read_text().replace("default_stack: cpu-tcp", "default_stack: cpu-tpc")
    (tmp_path / "stacks.yaml").write_text(text)
    line = one_error_line(invoke("stacks", "--stacks", str(tmp_path / "stacks.yaml")))
    number = text.splitlines().index("default_stack: cpu-tpc") + 1
    assert f"stacks.yaml:{number}: default_stack: no stack named 'cpu-tpc'; did you mean cpu-tcp?" in line


def test_a_file_without_default_stack_asks_for_one(tmp_path):
    text = (ROOT / "stacks.yaml").read_text().replace("default_stack: cpu-tcp\n", "")
    (tmp_path / "stacks.yaml").write_text(text)
    line = one_error_line(invoke("plan", "--stacks", str(tmp_path / "stacks.yaml")), USAGE)
    assert "missing option --stack (or --all)" in line and "declares no default_stack" in line


def test_many_rule_violations_are_whole_lines_and_a_count(tmp_path):
    """Issue 16 item 10: the line used to be cut at 1000 characters in the middle of a rule."""
    many = ", ".join(["p3.16xlarge", "c5n.18xlarge", "m5.24xlarge", "c6i.32xlarge",
                      "hpc6a.48xlarge", "dl1.24xlarge", "p5.48xlarge", "p6-b200.48xlarge"])
    text = (ROOT / "stacks.yaml").read_text().replace("    instances: [p3.16xlarge]\n",
                                                      f"    instances: [{many}]\n")
    (tmp_path / "stacks.yaml").write_text(text)
    line = one_error_line(invoke("render", "--stacks", str(tmp_path / "stacks.yaml"), "--stack",
                                 "cuda10.1-tcp"))
    shown_items, _, rest = line.rpartition(" | ... and ")
    assert re.fullmatch(r"\d+ more", rest), line[-200:]
    for item in shown_items.split(" | "):  # each one whole: from its file:line to its fact
        assert "stacks.yaml:" in item and item.endswith("]"), item[-120:]


# --- paths written, lint ---------------------------------------------------------------------------

def test_render_says_where_it_wrote_and_lint_says_what_to_commit(tmp_path):
    shutil.copy(ROOT / "stacks.yaml", tmp_path / "stacks.yaml")
    proc = invoke("render", "--stacks", str(tmp_path / "stacks.yaml"))
    assert proc.returncode == 0, proc.stderr
    wrote = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == CPU_TCP_IMAGES and all(Path(p).is_file() for p in wrote)
    assert all(p.startswith(str(tmp_path / "generated" / "cpu-tcp")) for p in wrote), wrote
    assert "images/generated" not in proc.stdout
    assert f"next to {tmp_path / 'stacks.yaml'}" in proc.stdout
    line = one_error_line(invoke("lint", "--stacks", str(tmp_path / "stacks.yaml")))
    assert f"run `invoke render --all --stacks {tmp_path / 'stacks.yaml'}`" in line
    assert f"commit {tmp_path / 'generated'}/" in line and "images/generated" not in line


def test_lint_is_one_line_on_success():
    proc = invoke("lint")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    (line,) = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"\d+ rendered Dockerfiles are fresh and pass hadolint", line), line
    assert proc.stderr == ""


# --- machine-readable output and tables ------------------------------------------------------------

def test_stacks_json_and_names():
    proc = invoke("stacks", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["default_stack"] == "cpu-tcp"
    assert [s["name"] for s in data["stacks"]] == ALL_STACKS
    cpu = data["stacks"][0]
    assert cpu["valid"] and cpu["default"] and cpu["base"]["image"] == "debian:bookworm"
    assert {"component": "openmpi", "version": "4.1.4"} in cpu["layers"]
    names = invoke("stacks", "--names")
    assert names.stdout.split() == ALL_STACKS


def test_stacks_table_names_python_once_on_debian_12():
    from matrix.cli.catalog import component_parts, stacks_data
    from matrix.model.loader import load_matrix

    rows = {row["name"]: row for row in stacks_data(load_matrix(ROOT / "stacks.yaml"))}
    cpu = rows["cpu-tcp"]
    assert "python" in cpu["base"]["provides"]  # the base and the python layer both name it
    parts = component_parts(cpu)
    assert [p.split()[0] for p in parts].count("python") == 1, parts
    layer = next(x for x in cpu["layers"] if x["component"] == "python")
    assert f"python {layer['version']}" in parts
    wide = invoke("stacks", env={"COLUMNS": "400"})
    cpu_block = wide.stdout.split("\ncpu-tcp (default): ", 1)[1].split("\n\n", 1)[0]
    assert cpu_block.count("python ") == 1, cpu_block


def test_stacks_say_the_options_a_stack_gives_its_layer():
    """cpu-tcp-arm64's python layer goes without pip: the listing and its JSON say so, and the
    same layer of cpu-tcp, with its version's own options, says nothing more."""
    data = json.loads(invoke("stacks", "--json").stdout)
    rows = {row["name"]: row for row in data["stacks"]}
    layers = {stack: {x["component"]: x for x in rows[stack]["layers"]}
              for stack in ("cpu-tcp-arm64", "cpu-tcp")}
    assert layers["cpu-tcp-arm64"]["python"] == {"component": "python", "version": "3.11.2",
                                                 "options": {"pip": False}}
    assert layers["cpu-tcp"]["python"] == {"component": "python", "version": "3.11.2"}
    wide = invoke("stacks", env={"COLUMNS": "400"}).stdout
    block = wide.split("\ncpu-tcp-arm64: ", 1)[1].split("\n\n", 1)[0]
    assert "python 3.11.2 (pip: false), entrypoint 0.1.0" in block, block


def test_piped_tables_fit_100_columns():
    proc = invoke("stacks")
    assert proc.returncode == 0
    # only a name longer than the room after its indent may pass 100 (never folded, see below)
    assert all(len(line) <= 100 or len(line.split()) == 1 for line in proc.stdout.splitlines())
    wide = invoke("stacks", env={"COLUMNS": "300"})
    assert max(len(line) for line in wide.stdout.splitlines()) > 100  # COLUMNS is honoured


def _names_in_stacks_file() -> list[str]:
    """Every name `invoke stacks` prints: stacks, base images, components with their versions,
    instance types."""
    from matrix.cli.catalog import component_parts, stacks_data
    from matrix.model.loader import load_matrix

    names = []
    for row in stacks_data(load_matrix(ROOT / "stacks.yaml")):
        names += [row["name"], row["base"]["image"], *component_parts(row), *row["instances"]]
    return names


@pytest.mark.parametrize("columns", ["80", "100", "300"])
def test_stacks_never_splits_a_name(columns):
    """Issue 16 item 15: at 80 columns the table folded "debian:bookwor" / "m"."""
    proc = invoke("stacks", env={"COLUMNS": columns})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name in _names_in_stacks_file():
        assert any(name in line for line in lines), (columns, name)


def test_a_stack_that_cannot_be_built_yet_is_not_called_valid():
    """synapseai1.6-efa passes the rules but two of its layers have no sha256 pin and fail
    closed: `invoke stacks` says so instead of "valid"."""
    proc = invoke("stacks", env={"COLUMNS": "80"})
    block = proc.stdout.split("\nsynapseai1.6-efa: ", 1)[1].split("\n  base:", 1)[0]
    assert " ".join(block.split()) == (
        "valid, NOT BUILDABLE YET: hccl-ofi-wrapper 1.0, deepspeed-habana 1.6.0 have no sha256 "
        "pin (`download`) in the stacks file, so their layers fail closed")
    rows = {row["name"]: row for row in json.loads(invoke("stacks", "--json").stdout)["stacks"]}
    assert rows["synapseai1.6-efa"]["valid"] and not rows["synapseai1.6-efa"]["buildable"]
    assert rows["synapseai1.6-efa"]["unpinned"] == ["hccl-ofi-wrapper 1.0", "deepspeed-habana 1.6.0"]
    assert rows["cuda13.2-efa1.51"]["unpinned"] == ["efa 1.51.0", "nccl-tests 2.18.3"]
    assert all(row["buildable"] for name, row in rows.items()
               if name not in ("synapseai1.6-efa", "cuda13.2-efa1.51"))


def test_matrix_says_which_stacks_it_leaves_out_and_why(tmp_path):
    """Issue 16 item 15: synapseai1.6-efa was left out silently. Stdout stays the JSON alone."""
    proc = invoke("matrix")
    assert proc.returncode == 0, proc.stderr
    included = [entry["stack"] for entry in json.loads(proc.stdout)["include"]]
    assert "synapseai1.6-efa" not in included and "cpu-tcp" in included
    assert proc.stderr == ("left out of the CI matrix: synapseai1.6-efa (not buildable yet: "
                           "hccl-ofi-wrapper 1.0, deepspeed-habana 1.6.0 have no sha256 pin "
                           "(`download`) in the stacks file, so their layers fail closed); "
                           "cuda13.2-efa1.51 (not buildable yet: efa 1.51.0, nccl-tests 2.18.3 "
                           "have no sha256 pin (`download`) in the stacks file, so their layers "
                           "fail closed)\n")
    # the arm64 stacks are in, on GitHub's arm64 runner (publish.yml runs each on its runner)
    runners = {entry["stack"]: (entry["runner"], entry["platform"])
               for entry in json.loads(proc.stdout)["include"]}
    assert runners["cpu-tcp-arm64"] == runners["cuda13.2-tcp-arm64"] == \
        runners["cuda13.2-efa-arm64"] == \
        ("ubuntu-24.04-arm", "linux/arm64")
    assert runners["cpu-tcp"] == ("ubuntu-24.04", "linux/amd64")
    # a runner does not put a stack CI cannot build into the matrix; no runner is a reason too
    data = stacks_yaml()
    data["stacks"]["synapseai1.6-efa"]["ci"] = {"runner": "ubuntu-22.04"}
    del data["stacks"]["cpu-mpi"]["ci"]
    (tmp_path / "stacks.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    proc = invoke("matrix", "--stacks", str(tmp_path / "stacks.yaml"))
    included = [entry["stack"] for entry in json.loads(proc.stdout)["include"]]
    assert "synapseai1.6-efa" not in included and "cpu-mpi" not in included
    assert "cpu-mpi (no ci.runner in the stacks file)" in proc.stderr
    assert "synapseai1.6-efa (not buildable yet:" in proc.stderr


def test_plan_at_100_columns_without_an_engine():
    proc = invoke("plan", "--all", env={**NO_ENGINE, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    data = plan_json("--all")
    for layer in data["layers"]:  # every tag whole on one line: no hash folded mid-way
        assert any(layer["tag"] in line for line in lines), layer["tag"]
    assert "_stack" not in proc.stdout
    assert len(lines) < 2 * len(data["layers"])  # one line a layer, plus a header per base
    shared = sum(len(layer["stacks"]) > 1 for layer in data["layers"])
    assert lines[-1] == (f"{len(data['layers'])} layers for {len(ALL_STACKS)} stack(s), {shared} "
                         "shared; no Docker engine answers: built layers not checked")
    assert data["engine"] is False and data["to_build"] is None


@pytest.mark.docker
def test_plan_marks_layers_already_built(cpu_tcp_image):
    data = plan_json(env={})
    assert data["engine"] is True
    assert all(layer["present"] for layer in data["layers"])  # cpu-tcp is built
    proc = invoke("plan", "--stack", "cpu-tcp", env={"COLUMNS": "100"})
    assert proc.stdout.splitlines()[-1].endswith(f"{CPU_TCP_IMAGES} present locally, 0 to build")


# --- flags ---------------------------------------------------------------------------------------

TASKS = ["stacks", "render", "plan", "lint", "matrix", "build", "ref", "engine", "test", "check",
         "push", "jobdef", "run"]


@pytest.mark.parametrize("task", TASKS)
def test_no_task_has_short_flags(task):
    proc = invoke("--help", task)
    assert proc.returncode == 0, proc.stderr
    assert not re.findall(r"^\s+-[a-zA-Z][ ,=]", proc.stdout, re.M), proc.stdout


def _task_options() -> list[tuple[str, str, object]]:
    """(task, option, default) for every option of every task, from tasks.py's signatures."""
    import inspect

    import invoke as invoke_lib

    found = []
    for name, task in sorted(invoke_lib.Collection.from_module(_tasks_module()).tasks.items()):
        for parameter in list(inspect.signature(task.body).parameters.values())[1:]:
            found.append((name, "--" + parameter.name.replace("_", "-"), parameter.default))
    return found


@functools.cache
def _tasks_module():
    """tasks.py as a module, without its command-line check (it runs only under invoke)."""
    import importlib.util
    from unittest import mock

    spec = importlib.util.spec_from_file_location("project_tasks", ROOT / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    with mock.patch.object(sys, "argv", ["tests"]):
        spec.loader.exec_module(module)
    return module


def _required() -> set[tuple[str, str]]:
    """The required options: the declared ones (the writers' tasks, explain) and push's."""
    from matrix.cli import jobtasks
    from matrix.jobs import writers

    found = {("push", "--registry")}
    for writer in writers.all_writers():
        found |= {(writer.task, o.flag) for o in writer.task_options() if o.required}
    found |= {("explain", o.flag) for o in jobtasks.explain_options() if o.required}
    return found


REQUIRED = _required()


@pytest.mark.parametrize("task", sorted({task for task, _, _ in _task_options()}))
def test_help_shows_each_options_text_marking_required_ones_and_defaults(task):
    """Issue 16 item 18: `invoke --help TASK` printed bare option names; the help texts were
    consumed by the parser contexts built to check the command line."""
    proc = invoke("--help", task)
    assert proc.returncode == 0, proc.stderr
    options = proc.stdout.split("Options:", 1)[1]
    text = {}  # option -> its help text, joined across wrapped lines
    for line in options.splitlines():
        match = re.match(r"^  (--[a-z-]+)(=\S+)?\s*(.*)$", line)
        if match:
            current = match.group(1)
            text[current] = match.group(3)
        elif line.strip() and text:
            text[current] += " " + line.strip()
    for name, option, default in _task_options():
        if name != task:
            continue
        assert text.get(option), (option, proc.stdout)
        if (task, option) in REQUIRED:
            assert "(required)" in text[option], (option, text[option])
        elif not isinstance(default, bool):  # a flag's default is off; a value has a default
            assert "default" in text[option], (option, text[option])


def test_readme_plan_example_counts_layers_as_plan_does():
    """Issue 16 item 18: README said 11 layers where `invoke plan` prints 12."""
    data = plan_json("--stack", "cpu-tcp", "--stack", "cpu-mpi")
    total = len(data["layers"])
    shared = sum(len(layer["stacks"]) > 1 for layer in data["layers"])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("invoke plan --stack cpu-tcp --stack cpu-mpi"))
    assert line.endswith(f"# two stacks: {total} layers, {shared} of them shared"), line


def test_readme_says_which_commands_take_the_stacks_file():
    """README said every command takes --stacks; `engine` and `check` do not."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    import invoke as invoke_lib

    every = set(invoke_lib.Collection.from_module(_tasks_module()).tasks)
    without = sorted(every - {task for task, option, _ in _task_options() if option == "--stacks"})
    assert without == ["check", "engine"]
    assert ("Every command that reads the stacks file (all but `engine` and `check`) takes "
            "`--stacks PATH`") in readme
    assert "a `description`" in readme.split("## Adding a component or a stack", 1)[1]


def test_short_flags_are_refused():
    proc = invoke("build", "-t")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr


# --- run: argv after -- ------------------------------------------------------------------------

def test_the_command_after_dashdash_keeps_its_words():
    argv = ["invoke", "run", "--nodes", "3", "--", "python3", "-c", "import x; print(1)"]
    assert command_after_dashdash(argv, "python3 -c import x; print(1)") == \
        ["python3", "-c", "import x; print(1)"]
    assert command_after_dashdash(["invoke", "run"], "echo 'a b'") == ["echo", "a b"]


# --- jobdef without --image-uri --------------------------------------------------------------------

def test_jobdef_without_an_engine_asks_for_the_image_uri():
    proc = invoke("jobdef", "--nodes", "2", "--instance-type", "c5n.18xlarge", "--", "python3",
                  "train.py", env=NO_ENGINE)
    line = one_error_line(proc)
    assert "no Docker engine answers" in line and "pass --image-uri REPO@sha256:" in line
    assert "installing" not in proc.stdout and "starting dockerd" not in proc.stdout


def test_jobdef_with_an_image_uri_needs_no_engine(tmp_path):
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu-tcp@sha256:" + "a" * 64
    proc = invoke("jobdef", "--nodes", "2", "--instance-type", "c5n.18xlarge", "--image-uri", uri,
                  "--output", str(tmp_path / "jd.json"), "--", "python3", "train.py", env=NO_ENGINE)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "jd.json").read_text())["nodeProperties"]["numNodes"] == 2


# --- build metadata -------------------------------------------------------------------------------

@pytest.mark.docker
def test_build_json_and_metadata_file(cpu_tcp_image, tmp_path):
    target = tmp_path / "meta.json"
    proc = invoke("build", "--json", "--metadata-file", str(target), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)  # stdout is the JSON alone; progress went to stderr
    assert printed == json.loads(target.read_text())
    assert list(printed["stacks"]) == ["cpu-tcp"]
    stack = printed["stacks"]["cpu-tcp"]
    assert stack["image"] == "mnp-stacks:cpu-tcp" and stack["ref"] == cpu_tcp_image
    assert stack["image_id"].startswith("sha256:") and stack["size_bytes"] > 100_000_000
    assert len(printed["layers"]) == CPU_TCP_IMAGES
    assert all(layer["status"] in ("cached", "built") and layer["image_id"] for layer in printed["layers"])
    assert "build summary" in proc.stderr


# --- shell completion -------------------------------------------------------------------------------

def complete(*words: str, cwd: Path = ROOT) -> list[str]:
    script = (f"source {ROOT / 'completion' / 'mnp-stacks.bash'}; COMP_WORDS=({' '.join(words)}); "
              f"COMP_CWORD={len(words) - 1}; _mnp_stacks_complete; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_completion_of_stack_names_tasks_and_options():
    assert complete("invoke", "build", "--stack", "cpu-m") == ["cpu-mpi"]
    assert complete("invoke", "build", "--stack", "cuda12") == ["cuda12.1-efa"]
    assert complete("invoke", "pl") == ["plan"]
    assert "--stack" in complete("./dev", "invoke", "plan", "--st")


def test_a_tab_after_dev_runs_the_venvs_command_never_dev_itself(tmp_path):
    """Where .venv is missing or older than pyproject.toml (a fresh clone, CI), ./dev first
    creates it and pip-installs the project: `./dev invoke plan --st<Tab>` ran past the helper's
    120 s under load. A Tab runs the checkout's .venv/bin command (stand-ins here)."""
    (tmp_path / "dev").write_text("#!/bin/sh\ntouch ran-dev\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    for command, answer in (("invoke", "plan"), ("mnp-stacks", "pin")):
        (tmp_path / ".venv" / "bin" / command).write_text(f"#!/bin/sh\necho {answer}\n")
    for path in (tmp_path / "dev", *(tmp_path / ".venv" / "bin").iterdir()):
        path.chmod(0o755)
    assert complete("./dev", "invoke", "p", cwd=tmp_path) == ["plan"]
    assert complete("./dev", "mnp-stacks", "p", cwd=tmp_path) == ["pin"]
    assert not (tmp_path / "ran-dev").exists()


def test_completion_of_instance_types_and_launchers():
    """Issue 16 item 16: no values were offered after --instance-type and --launcher."""
    from matrix.cli.options import LAUNCHERS
    from matrix.model.instances import INSTANCE_TYPES

    assert complete("invoke", "explain", "--instance-type", "p5") == [
        name for name in INSTANCE_TYPES if name.startswith("p5")]
    assert complete("invoke", "jobdef", "--instance-type", "''") == list(INSTANCE_TYPES)
    assert complete("./dev", "invoke", "jobdef", "--launcher", "''") == list(LAUNCHERS)
    assert complete("invoke", "explain", "--launcher", "=", "torch") == [
        "torchrun", "torch.distributed.launch"]


def test_completion_of_scheduler_kind_and_rdzv_values():
    """Issue 25: nothing was offered after --scheduler, --kind or --rdzv; the values come from
    the options' declarations, which the tasks check them against (issue 42)."""
    from matrix.jobs.explain import SCHEDULERS
    from matrix.jobs.k8s import KINDS, RDZV_BACKENDS
    from matrix.jobs.sbatch import RANKS

    assert complete("invoke", "explain", "--scheduler", "''") == list(SCHEDULERS)
    assert complete("./dev", "invoke", "explain", "--scheduler", "=", "py") == ["pytorchjob"]
    assert complete("invoke", "k8s", "--kind", "''") == list(KINDS)
    assert complete("mnp-stacks", "k8s", "--kind", "m") == ["mpijob"]
    assert complete("invoke", "explain", "--rdzv", "etcd") == [
        b for b in RDZV_BACKENDS if b.startswith("etcd")]
    assert complete("invoke", "sbatch", "--ranks", "''") == list(RANKS)


def test_every_declared_option_with_values_completes_them():
    """Completion reads every writer's declarations: no list of options in the script."""
    from matrix.cli import jobtasks
    from matrix.jobs.runopts import flags

    for flag, option in flags(jobtasks.all_options()).items():
        values = option.values(str(ROOT / "stacks.yaml"))
        if values and flag != "--stack":
            assert complete("invoke", "explain" if flag == "--scheduler" else "jobdef"
                            if flag in ("--launcher", "--instance-type") else "k8s"
                            if flag in ("--kind", "--rdzv") else "sbatch", flag, "''") == values


def test_values_of_an_option_it_does_not_know_is_one_line():
    line = one_error_line(invoke("stacks", "--values", "schedulr"), USAGE)
    assert "--values schedulr: no task declares --schedulr; did you mean --scheduler?" in line


def test_completion_reads_the_stacks_file_given_with_an_equals_sign(tmp_path):
    """`--stacks=FILE --stack <Tab>` completed the project's stacks, not FILE's."""
    mine = tmp_path / "mine.yaml"
    mine.write_text((ROOT / "stacks.yaml").read_text().replace("\n  cpu-mpi:\n", "\n  cpu-mine:\n"))
    for words in (["--stacks", "=", str(mine)], [f"--stacks={mine}"], ["--stacks", str(mine)]):
        assert complete("invoke", "plan", *words, "--stack", "cpu-") == [
            "cpu-tcp", "cpu-mine", "cpu-tcp-arm64"], words
    assert complete("invoke", "plan", f"--stacks={mine}", "--stack", "=", "cpu-m") == [
        "cpu-mine"]


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`invoke stacks --names | head -1`: the pipe is closed before invoke writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "invoke", "stacks", "--names"], cwd=ROOT,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              check=False)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (1, "")


HEAVY = ("docker", "jsonschema", "requests", "boto3", "botocore", "urllib3")


@pytest.mark.parametrize("args", [("stacks", "--names"), ("stacks", "--instance-types"),
                                  ("stacks", "--launchers"), ("stacks", "--values", "kind"),
                                  ("stacks", "--values", "scheduler"),
                                  ("--complete", "--", "invoke", "pl")])
def test_a_tab_imports_no_docker_aws_or_jsonschema(args):
    """Issue 16 item 16: each Tab took 0.5-1.5 s importing docker, jsonschema and requests."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "invoke", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0]
                for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert proc.stdout.strip()


def test_architecture_names_every_module_on_one_page():
    """docs/architecture.md is the map: every entrypoint/ and matrix/ module is named (no line
    cap: issue 36, cohesion over counts)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for path in sorted((ROOT / "entrypoint").rglob("*.py")):
        if not path.name.startswith("__"):
            assert f"`{path.stem}`" in text or f"`{path.stem}.py`" in text, path.name
    for path in sorted((ROOT / "matrix").rglob("*.py")) + [ROOT / "matrix" / "model" / "instances.yaml"]:
        if not path.name.startswith("__"):
            assert path.name in text, path.name
    for room in sorted(p for p in (ROOT / "matrix").iterdir() if (p / "__init__.py").exists()):
        assert f"`matrix/{room.name}/`" in text, room.name
