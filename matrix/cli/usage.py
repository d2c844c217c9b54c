"""The command line read before invoke parses it, so that invoke's own parser messages ("No idea
what 'python3' is!", "Flag <Argument: instance_type> needed value") never reach a user.

:func:`check` walks the words the way invoke's parser does, with the tasks' own option
definitions (invoke's parser contexts), and turns each mistake into one line saying what to
type, exit status 2 (:data:`matrix.errors.EXIT_USAGE`):

- a bare word after a task: a stack (``invoke plan cpu-tcp``: use ``--stack``), a job command
  without ``--`` (``invoke run --nodes 2 python3 train.py``), or a word no task takes;
- an option the task does not have (``invoke matrix --json``; short flags: there are none);
- an option that needs a value given none (``--instance-type`` last, ``invoke plan --stack``,
  which invoke would take as an empty list and silently plan the default stack).

Anything it does not recognise is left to invoke, so a gap here can never refuse a good line.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matrix.errors import UsageError, did_you_mean

# Words that make invoke print something instead of running a task: nothing to check then.
INFO_FLAGS = ("--complete", "--list", "-l", "--help", "-h", "--version", "-V",
              "--print-completion-script")
# Short forms of invoke's core options that take a value (``invoke -c tasks plan``).
CORE_SHORT_WITH_VALUE = ("-c", "-f", "-r", "-D", "-F", "-T")
# What a value looks like, per option of the tasks that declare none (tasks.py's own), for
# "needs a value, e.g. ..."; the declared options' come with them (``Option.example``).
EXAMPLES = {
    "--late-node": "1", "--registry": "123456789012.dkr.ecr.us-east-1.amazonaws.com",
    "--ca-bundle": "/etc/ssl/certs/ca-certificates.crt", "--metadata-file": "meta.json",
    "--pytest": '"-k plan -x"', "--env": "MNP_HEALTH=full",
}


def output_example(task: str) -> str:
    """The file a writer's task names for ``--output`` (``Writer.file_name``), else FILE."""
    from matrix.jobs import writers

    return next((w.file_name for w in writers.all_writers() if w.task == task), "FILE")


def value_example(flag: str) -> str:
    """``flag`` with a value, as typed: its declaration's (``Option.typed``), else with
    :data:`EXAMPLES`'s value, else VALUE."""
    from matrix.cli import jobtasks
    from matrix.jobs.runopts import flags

    declared = flags(jobtasks.all_options()).get(flag)
    if declared is not None and declared.example:
        return declared.typed()
    return f"{flag} {EXAMPLES.get(flag, 'VALUE')}"


# The installed command (matrix/cli/program.py), named in messages when it is the one typed, and
# invoke's options for finding a tasks file, which it does not have (invoke's Program.task_args).
PROGRAM = "mnp-stacks"
RUNNER_ONLY = ("-c", "--collection", "--no-dedupe", "-r", "--search-root")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(UsageError.exit_code)


def stack_names(words: Sequence[str]) -> set[str]:
    """The stacks of ``--stacks FILE`` (or ./stacks.yaml), read with PyYAML alone; empty when it
    cannot be read (the task will say why)."""
    path = "stacks.yaml"
    for index, word in enumerate(words):
        if word == "--stacks" and index + 1 < len(words):
            path = words[index + 1]
        elif word.startswith("--stacks="):
            path = word.split("=", 1)[1]
    try:
        import yaml

        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        return set((data or {}).get("stacks") or {})
    except (OSError, ValueError, AttributeError, TypeError, yaml.YAMLError):
        return set()


def parser_contexts(collection: Any) -> list[Any]:
    """invoke's parser contexts of ``collection``'s tasks, for :func:`check`, leaving the tasks
    as they were: building contexts pops each option's help text out of its task (invoke's
    ``Task.arg_opts``), so contexts built before invoke builds its own left ``invoke --help
    TASK`` with no help text at all."""
    tasks = list(collection.tasks.values())
    pending = list(collection.collections.values())
    while pending:
        inner = pending.pop()
        tasks += inner.tasks.values()
        pending += inner.collections.values()
    saved = [(task, dict(task.help)) for task in tasks]
    try:
        return list(collection.to_contexts())
    finally:
        for task, text in saved:
            task.help = text


def check(argv: Sequence[str], contexts: Iterable[Any], with_command: Iterable[str] = (),
          core: Any = None) -> None:
    """Exit 2 with one line for the first mistake in ``argv`` (see the module's docstring).

    ``contexts`` are invoke's parser contexts of the tasks (:func:`parser_contexts`),
    ``with_command`` the tasks that take a command after ``--``, ``core`` invoke's core-option
    context (its options may follow a task).
    """
    dashdash = list(argv).index("--") if "--" in argv else len(argv)
    words = list(argv[1:dashdash])
    # the command to quote back: the installed one (matrix/cli/program.py) or invoke
    program = PROGRAM if argv and Path(argv[0]).name == PROGRAM else "invoke"
    if any(word.split("=", 1)[0] in INFO_FLAGS for word in words):
        return
    tasks = {}
    for context in contexts:
        for name in (context.name, *context.aliases):
            tasks[name] = context
    core_flags = dict(core.flags) if core is not None else {}
    command_tasks = set(with_command)
    no_stack = {name for name, context in tasks.items() if "--stack" not in context.flags}
    task = None
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word.startswith("-") and word != "-":
            flag = word.split("=", 1)[0]
            context = tasks.get(task) if task else None
            known = context.flags if context is not None else {}
            if flag in known or (context is not None and flag in context.inverse_flags):
                argument = known.get(flag)
                if argument is not None and argument.takes_value and "=" not in word:
                    if index >= len(words) or words[index].startswith("--"):
                        example = (f"{flag} {output_example(task or '')}" if flag == "--output"
                                   else value_example(flag))
                        fail(f"{flag} needs a value, e.g. {program} {task} {example}")
                    index += 1
                continue
            if program == PROGRAM and flag in RUNNER_ONLY:
                fail(f"{PROGRAM} has no option {flag}: it runs this project's tasks, wherever it is "
                     f"started (its options: {PROGRAM} --help)")
            if task is None or flag in core_flags:  # invoke's own options
                core_arg = core_flags.get(flag)
                takes = flag in CORE_SHORT_WITH_VALUE or (
                    core_arg is not None and core_arg.takes_value and not core_arg.optional)
                if takes and "=" not in word:
                    index += 1
                continue
            fail(unknown_option(task, flag, tasks, program))
        elif word in tasks:
            task = word
        elif task is None:
            fail(f"no task named {word!r}{did_you_mean(word, tasks)} (the tasks: {program} --list)")
        else:
            fail(bare_word(task, word, words, index - 1, argv[dashdash + 1:], command_tasks,
                           no_stack, program))


def unknown_option(task: str, flag: str, tasks: dict[str, Any], program: str = "invoke") -> str:
    own = sorted(tasks[task].flags)
    if not flag.startswith("--"):
        return (f"{program} {task} has no option {flag}: options have no short forms "
                f"({program} {task} --help lists {', '.join(own)})")
    having = sorted(name for name, context in tasks.items()
                    if flag in context.flags and name == context.name)
    where = f"; {flag} is an option of: {', '.join(having)}" if having else ""
    return (f"{program} {task} has no option {flag}{did_you_mean(flag, own)}{where} (its options: "
            f"{', '.join(own)})")


def bare_word(task: str, word: str, words: list[str], at: int, after: Sequence[str],
              command_tasks: set[str], no_stack: set[str], program: str = "invoke") -> str:
    """What a word that is no option, value or task meant, and what to type instead."""
    if word in stack_names(words):
        if task in no_stack:
            return f"{program} {task} takes no stack"
        return f"stacks are given with --stack: {program} {task} --stack {word}"
    if task in command_tasks:
        typed = " ".join([program, *words[:at], "--", *words[at:], *after])
        return f"the command goes after --: {typed}"
    return f"{program} {task} takes no argument {word!r} ({program} {task} --help lists its options)"
