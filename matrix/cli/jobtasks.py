"""The writers' tasks and ``invoke explain``, made from the options each writer declares
(:meth:`matrix.jobs.writer.Writer.task_options`): a writer module is a task, with its options,
``--help``, completion values and README row, without an edit here or in tasks.py.

Every task and explain take one step from a command line to a job (:func:`request`): the options
parsed with their defaults (exit 2 for a mistake), the writer's reading of them and its own
refusals (exit 2), the stack on the instance type (exit 1), then the plan every role would start
with (exit 1, :func:`matrix.jobs.request.refusal`). Explain shows the artefact the task would
write for the same options, and refuses with the same line.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from matrix.cli import options as cli_options
from matrix.cli.output import output_path, write_whole
from matrix.errors import EXIT_CANNOT, UsageError, UserError
from matrix.jobs.runopts import Option, RunOpts

if TYPE_CHECKING:
    from matrix.jobs.request import JobRequest
    from matrix.jobs.writer import Writer
    from matrix.model.entities import Matrix

JOB_COMMAND_EXAMPLE = "-- python3 train.py"


def _schedulers() -> tuple[str, ...]:
    from matrix.jobs.explain import SCHEDULERS

    return SCHEDULERS


# ``invoke explain``'s own options; the job's are every writer's (:func:`explain_options`).
EXPLAIN_OPTIONS = RunOpts((
    Option("scheduler", "whose job to explain: batch (invoke jobdef), slurm (invoke sbatch), "
           "pytorchjob, trainjob or mpijob (invoke k8s --kind K)", default="batch",
           choices=lambda _stacks: _schedulers(), example="slurm",
           what="scheduler"),
    Option("json", "print the plan as JSON: {header, notes, roles: [{name, argv, plan}]}",
           kind=bool),
))


def explain_options() -> RunOpts:
    """Explain's options: its own, then every writer's that describe the job (not what a task
    does with its artefact, ``--output`` or ``--register``, nor what ``--scheduler`` implies,
    a Kubeflow ``--kind``). An option only some writers take says whose it is."""
    from matrix.jobs import writers

    found = EXPLAIN_OPTIONS
    owners: dict[str, list[str]] = {}
    first: dict[str, Option] = {}
    for writer in writers.all_writers():
        implied = set(writer.implied(writer.schedulers[0]))
        for option in writer.task_options():
            if option.action or option.name in implied:
                continue
            owners.setdefault(option.name, []).append(writer.task)
            first.setdefault(option.name, option)
    every = len(writers.all_writers())
    merged = []
    for name, option in first.items():
        tasks = owners[name]
        if len(tasks) == every:
            # each writer's own default or meaning (a launcher, the attempts) is its --help's
            note = f" (as invoke {' / '.join(tasks)} take it: see its --help)"
            merged.append(Option(option.name, option.help + note, option.kind, None,
                                 option.default_text or "the writer's",
                                 option.choices, option.required, option.repeatable,
                                 option.example, option.minimum, option.maximum, False,
                                 option.bound_reason))
        else:
            merged.append(Option(option.name, f"{option.help} (invoke {', '.join(tasks)} only)",
                                 option.kind, option.default, option.default_text,
                                 option.choices, False, option.repeatable, option.example,
                                 option.minimum, option.maximum, False, option.bound_reason))
    return found.merged(merged)


# --- the step every writer's task and explain take -----------------------------------------------

def request(writer: Writer, typed: Mapping[str, Any], command: Sequence[str], *,
            options: RunOpts | None = None, scheduler: str | None = None,
            placeholder: Sequence[str] = (),
            matrix: Matrix | None = None) -> tuple[JobRequest, dict[str, Any]]:
    """The job ``writer``'s task writes for the typed options and ``command``, and the parsed
    values. ``placeholder`` stands in for a missing command (explain); without one a missing
    command is a usage error. ``matrix``: the stacks file ``--stacks`` names, already loaded
    (a caller writing many jobs from one file loads it once)."""
    from matrix.jobs.request import job_request

    values = (options or writer.task_options()).parse(dict(typed))
    if not command and not placeholder:
        raise UsageError(f"give the training command after --, e.g. invoke {writer.task} "
                         f"--nodes {values['nodes']} --instance-type {values['instance_type']} "
                         f"{JOB_COMMAND_EXAMPLE} (it becomes {writer.what}, word for word)")
    matrix = matrix or cli_options.load(values["stacks"])
    stack = cli_options.one_stack(matrix, values["stack"])
    job = job_request(writer, values, list(command or placeholder), matrix, stack, scheduler)
    return job, values


def refuse_stops(job: JobRequest) -> None:
    """The task's refusal of a job whose plan stops a role at start (what explain shows)."""
    from matrix.jobs import explain as ex
    from matrix.jobs.request import refusal

    stops = ex.explain_request(job).stops()
    if stops:
        raise UserError(refusal(job, stops))


def write_job(writer: Writer, typed: Mapping[str, Any], command: Sequence[str]) -> Any:
    """A writer's task: check, then write the artefact to ``--output`` or stdout (whole or not
    at all), then its action (``--register``)."""
    from matrix.cli import deploy

    values = writer.task_options().parse(dict(typed))
    target = output_path(values["output"], writer.file_name) if values.get("output") else None
    job, values = request(writer, typed, command)
    refuse_stops(job)
    for note in writer.notes(job.nodes):
        print(f"note: {note}", file=sys.stderr)
    uri = deploy.image_uri(job.matrix, job.stack.name, values.get("image_uri"))
    artefact = job.render(uri)
    after = writer.action(values)  # before writing: a missing AWS region is said first
    text = writer.text(artefact)
    text = text if text.endswith("\n") else text + "\n"
    if target:
        write_whole(target, text, values["output"])
        print(f"wrote {cli_options.shown(target)}")
    else:
        print(text, end="")
    if after is not None:
        print(after(artefact))
    return artefact


def explain(typed: Mapping[str, Any], command: Sequence[str]) -> None:
    """``invoke explain``: each role of what ``--scheduler``'s writer writes for these options,
    with its dry run; refused as that writer's task refuses (same line, same status)."""
    from matrix.jobs import explain as ex
    from matrix.jobs import writers
    from matrix.jobs.request import refusal

    scheduler = EXPLAIN_OPTIONS.get("scheduler").read(typed.get("scheduler"))
    writer = writers.for_scheduler(scheduler)
    if writer is None:  # an adapter no task writes a job for: its own example
        return _explain_adapter(scheduler, typed, command)
    own = writer.task_options()
    for option in explain_options():
        if option.name in own.names() or option.name in EXPLAIN_OPTIONS.names():
            continue
        if typed.get(option.name) not in (None, False, []):
            owners = [f"invoke {other.task} (--scheduler {'|'.join(other.schedulers)})"
                      for other in writers.all_writers()
                      if option.name in other.task_options().names()]
            raise UsageError(f"{option.flag} is an option of {', '.join(owners)}, not of "
                             f"{writer.command_line(scheduler)}, what --scheduler {scheduler} "
                             "explains")
    chosen = {name: typed.get(name) for name in own.names() if name in typed}
    for name, value in writer.implied(scheduler).items():
        flag = "--" + name.replace("_", "-")
        if chosen.get(name) not in (None, value):
            raise UsageError(f"{flag} {chosen[name]}: --scheduler {scheduler} explains "
                             f"{writer.command_line(scheduler)}")
        chosen[name] = value
    job, _ = request(writer, chosen, command, scheduler=scheduler,
                     placeholder=ex.PLACEHOLDER_COMMAND)
    result = ex.explain_request(job, placeholder=not command)
    print(result.json() if typed.get("json") else result.text())
    if result.stops():
        # a real run stops at these: a script or CI calling explain must see it fail, with the
        # line the writer's task refuses the job with
        sys.stdout.flush()
        print(f"error: {refusal(job, result.stops())}", file=sys.stderr)
        sys.exit(EXIT_CANNOT)


def _explain_adapter(scheduler: str, typed: Mapping[str, Any], command: Sequence[str]) -> None:
    from matrix.jobs import explain as ex
    from matrix.jobs.spec import JOB_OPTIONS

    values = JOB_OPTIONS.with_default("launcher", None).parse(
        {name: typed.get(name) for name in JOB_OPTIONS.names()})
    matrix = cli_options.load(values["stacks"])
    stack = cli_options.one_stack(matrix, values["stack"])
    result = ex.explain(matrix, stack, values["instance_type"], values["nodes"],
                        values["launcher"], list(command), scheduler=scheduler)
    print(result.json() if typed.get("json") else result.text())
    if result.stops():
        sys.exit(EXIT_CANNOT)


# --- invoke tasks from declarations --------------------------------------------------------------

def make_task(name: str, summary: str, usage: str, options: RunOpts,
              run: Callable[[dict[str, Any], list[str]], Any]) -> Any:
    """An invoke task ``name`` whose options are ``options`` (its ``--help`` from their help
    lines) and whose body hands the typed values and the command after ``--`` to ``run``."""
    import invoke

    def body(c: Any, **typed: Any) -> Any:
        return run(typed, cli_options.command_after_dashdash(sys.argv, c.remainder))

    wrapped = cli_options.user_errors(body)
    parameters = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(option.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                     default=option.invoke_default()) for option in options]
    wrapped.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    wrapped.__doc__ = f"{summary}.\n\n    {usage}"
    wrapped.__name__ = name.replace("-", "_")
    return invoke.task(wrapped, name=name, help=options.help(), iterable=options.iterable(),
                       auto_shortflags=False)


def usage_line(task: str, options: RunOpts, command: bool = True) -> str:
    """``invoke TASK --required VALUE [--other]... -- CMD...`` from the declarations."""
    words = [f"invoke {task}"]
    for option in options:
        value = "" if option.kind is bool else f" {option.example or 'VALUE'}"
        words.append(f"{option.flag}{value}" if option.required else f"[{option.flag}{value}]")
    return " ".join(words) + (" -- CMD..." if command else "")


def writer_task(writer: Writer) -> Any:
    """``invoke <writer.task>``, from the writer's declarations."""
    options = writer.task_options()
    required = RunOpts(tuple(option for option in options if option.required))
    return make_task(writer.task, writer.summary, usage_line(writer.task, required) +
                     f" (invoke --help {writer.task} lists every option)", options,
                     functools.partial(write_job, writer))


def explain_task() -> Any:
    """``invoke explain``, from its own options and the writers'."""
    options = explain_options()
    required = RunOpts(tuple(option for option in options if option.required))
    return make_task("explain", "Each role of the job a writer's task writes, with what its own "
                     "dry run prints, without hardware or a build", usage_line(
                         "explain [--scheduler K]", required), options, explain)


def tasks() -> list[Any]:
    """Every writer's task and explain (tasks.py adds them to the collection)."""
    from matrix.jobs import writers

    return [writer_task(writer) for writer in writers.all_writers()] + [explain_task()]


def command_tasks() -> list[str]:
    """The tasks that take a command after ``--`` (the usage checker's ``with_command``)."""
    from matrix.jobs import writers

    return [writer.task for writer in writers.all_writers()] + ["explain", "run"]


def all_options() -> list[RunOpts]:
    """Every declared task's options, for completion's values and usage examples."""
    from matrix.jobs import writers

    return [writer.task_options() for writer in writers.all_writers()] + [explain_options()]


def option_values(flag_name: str, stacks_file: str = "stacks.yaml") -> list[str]:
    """The values ``--OPTION`` takes (completion: ``invoke stacks --values OPTION``); a flag
    that takes any value has none; one no task declares is one line."""
    from matrix.errors import did_you_mean
    from matrix.jobs import runopts

    declared = runopts.flags(all_options())
    flag = "--" + flag_name.lstrip("-")
    if flag not in declared:
        raise UsageError(f"--values {flag_name}: no task declares {flag}"
                         f"{did_you_mean(flag, declared)} (declared: "
                         f"{', '.join(sorted(f[2:] for f in declared))})")
    return declared[flag].values(stacks_file)
