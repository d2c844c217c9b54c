"""``invoke explain --scheduler K ARGS`` and ``invoke <K's task> ARGS`` are one request: explain
refuses exactly what the writer refuses, with the same line and status, and otherwise previews the
launcher, tasks and roles of the artefact the writer writes (issue 42).

Both are called as their invoke tasks call them (``matrix.cli.jobtasks``, behind the same
``user_errors`` that turns a refusal into one line and an exit status), over every scheduler a
writer covers x a CPU and an EFA stack x typed commands x with and without ``--launcher``.
"""

from __future__ import annotations

import json

import pytest

from matrix.cli import jobtasks
from matrix.cli.options import user_errors
from matrix.jobs import writers
from matrix.jobs.explain import IMAGE_URI, SCHEDULERS

STACKS = {"cpu-tcp": "c5n.18xlarge", "cuda12.1-efa": "p5.48xlarge"}
COMMANDS = {
    "program": ["python3", "train.py", "--epochs", "1"],
    "mpirun": ["mpirun", "-np", "108", "python3", "train.py"],
    "torchrun": ["torchrun", "--nproc_per_node", "8", "train.py"],
    "deepspeed": ["deepspeed", "--num_gpus", "8", "train.py"],
}
LAUNCHERS = (None, "none")
CASES = [(scheduler, stack, command, launcher) for scheduler in SCHEDULERS
         if writers.for_scheduler(scheduler) for stack in STACKS for command in COMMANDS
         for launcher in LAUNCHERS]


def _run(call, *args):
    """``(status, stdout, stderr)`` of a task body, as its invoke task runs it."""
    status = 0
    try:
        user_errors(call)(*args)
    except SystemExit as stop:
        status = stop.code or 0
    return status


def _typed(stack: str, launcher: str | None) -> dict:
    return {"stack": [stack], "nodes": "3", "instance_type": STACKS[stack],
            "launcher": launcher, "image_uri": IMAGE_URI}


@pytest.mark.parametrize("scheduler,stack,command,launcher", CASES,
                         ids=[f"{s}-{st}-{c}-{la or 'default'}" for s, st, c, la in CASES])
def test_explain_refuses_what_the_writer_refuses_and_shows_what_it_writes(
        scheduler, stack, command, launcher, capsys):
    writer = writers.for_scheduler(scheduler)
    typed = dict(_typed(stack, launcher), **writer.implied(scheduler))
    written = _run(jobtasks.write_job, writer, typed, COMMANDS[command])
    wrote = capsys.readouterr()
    explained = _run(jobtasks.explain, dict(_typed(stack, launcher), scheduler=scheduler,
                                            json=True), COMMANDS[command])
    shown = capsys.readouterr()
    assert explained == written, (wrote.err, shown.err)
    if written:
        # the same line, word for word: the writer's only line, explain's last
        assert shown.err.strip().splitlines()[-1] == wrote.err.strip().splitlines()[-1]
        return
    artefact = writer.roles(_parse(writer, wrote.out))
    data = json.loads(shown.out)
    assert [role["name"] for role in data["roles"]] == [role.name for role in artefact]
    assert [role["argv"] for role in data["roles"]] == [role.argv for role in artefact]
    told = {role.env.get("MNP_LAUNCHER") for role in artefact}
    assert told == {launcher or writer.prepare(writer.task_options().parse(typed)).launcher}
    assert f"launcher {told.pop()}" in data["header"]
    for plan in data["roles"]:
        assert plan["plan"]["problems"] == []
    # the role that starts the job ends its argv with the command's program and arguments (a
    # Python launcher takes the script without its interpreter)
    first = data["roles"][0]["plan"]["argv"]
    assert first[-2:] == COMMANDS[command][-2:]


def _parse(writer, text: str):
    """The artefact as the task printed it, read back as the writer made it."""
    if writer.task == "jobdef":
        return json.loads(text)
    if writer.task == "k8s":
        import yaml

        return yaml.safe_load(text)
    return text


def test_a_refusal_speaks_the_writers_options_not_the_entrypoints_settings(capsys):
    """The plan's advice in MNP_* terms reaches a writer's user as the option that sets it."""
    for writer in writers.all_writers():
        typed = dict(_typed("cpu-tcp", None), stack=["cpu-mpi"], launcher="torchrun",
                     **writer.implied(writer.schedulers[0]))
        assert _run(jobtasks.write_job, writer, typed, COMMANDS["program"]) == 1
        line = capsys.readouterr().err.strip()
        assert "torchrun needs PyTorch" in line and "give --launcher" in line, line
        assert "MNP_LAUNCHER" not in line, line


def test_launcher_args_reach_every_writers_nodes_and_explain(capsys):
    for writer in writers.all_writers():
        typed = dict(_typed("cpu-tcp", None), launcher_args="--master_port 29600",
                     **writer.implied(writer.schedulers[0]))
        assert _run(jobtasks.write_job, writer, typed, COMMANDS["program"]) == 0
        roles = writer.roles(_parse(writer, capsys.readouterr().out))
        assert {role.env.get("MNP_LAUNCHER_ARGS") for role in roles} == {"--master_port 29600"}
