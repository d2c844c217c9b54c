"""What every task shares: option parsing, stack picking, loading the stacks file, output.

User errors end as one line on stderr and a non-zero exit (see :func:`user_errors`).

Helpers any task can reuse (tasks.py and later tasks):

- :func:`integer` parses an integer option (``--nodes two`` is one line, not a traceback);
- :func:`require` names a missing option as the user types it (``--stack``);
- :func:`choose` / :func:`did_you_mean` check a name against the known ones, with a suggestion;
- :func:`pick_stacks` / :func:`one_stack` turn ``--stack`` (repeatable) and ``--all`` into stack
  names, falling back to ``default_stack`` from the stacks file;
- :func:`emit_json` prints machine-readable output for ``--json``;
- :func:`command_after_dashdash` recovers the argv typed after ``--`` exactly.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from entrypoint import launchers as launcher_units
from entrypoint.core.limits import MAX_NODES
from matrix.errors import UsageError, UserError, did_you_mean, excerpt
from matrix.model.entities import Matrix
from matrix.model.settings import GENERATED, ROOT

if TYPE_CHECKING:
    from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])
# Tables fit the terminal, or COLUMNS, or 100 columns when piped (CI logs); they never fold a tag.
PIPED_COLUMNS = 100


def make_console(stderr: bool = False) -> Console:
    # rich is imported by the tasks that print tables or progress: the job writers' tasks print
    # plain text, and importing rich.console took 0.04 s of each of them
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    fixed = None if stream.isatty() or os.environ.get("COLUMNS") else PIPED_COLUMNS
    return Console(highlight=False, width=fixed, stderr=stderr)


@functools.cache
def console() -> Console:
    """The console on stdout, made by the first task that prints to it."""
    return make_console()


LAUNCHERS = tuple(launcher_units.NAMES)  # MNP_LAUNCHER values: the entrypoint's launcher units
BUILD_METADATA = ROOT / ".mnp" / "build-metadata.json"

def user_errors(func: F) -> F:
    """Turn a :class:`UserError` into one line on stderr and its exit status (2 for a
    :class:`UsageError`, a mistake in the command line; 1 for what cannot be done); Ctrl-C
    into 130; a closed output pipe into a quiet exit 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = func(*args, **kwargs)
            sys.stdout.flush()  # a reader that left shows here, not at the interpreter's exit
            return result
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        except BrokenPipeError:
            # the reader left (`invoke stacks --names | head -1`): nothing to say; stdout goes to
            # /dev/null so the interpreter's own flush at exit does not fail again (Python docs,
            # "signal" module, "Note on SIGPIPE")
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


# --- option helpers ------------------------------------------------------------------------------

def integer(value: Any, option: str, minimum: int | None = None) -> int:
    """``value`` (a string from the command line) as an int, or one line naming ``option``."""
    if isinstance(value, bool):
        raise UsageError(f"{option} needs a whole number")
    try:
        number = value if isinstance(value, int) else int(str(value).strip(), 10)
    except ValueError:
        raise UsageError(f"{option} {excerpt(value)}: expected a whole number, e.g. {option} 2") from None
    if minimum is not None and number < minimum:
        raise UsageError(f"{option} {number}: must be at least {minimum}")
    return number


def nodes(value: Any, option: str = "--nodes") -> int:
    """``--nodes`` of a task that declares none (``invoke run``): a whole number from 1 to the
    entrypoint's :data:`MAX_NODES` (a :class:`UsageError` otherwise). A scheduler's own limits
    are its writer's notes (``Writer.notes``)."""
    count = integer(value, option)
    if not 1 <= count <= MAX_NODES:
        raise UsageError(f"{option} {count}: expected a whole number from 1 to {MAX_NODES} "
                         "(the entrypoint's limit)")
    return count


def require(value: Any, option: str, example: str = "") -> Any:
    """``value`` unless it is missing; then one line naming ``option`` as typed."""
    if value is None or value == "" or value == []:
        hint = f" (e.g. {option} {example})" if example else ""
        raise UsageError(f"missing option {option}{hint}")
    return value


def choose(name: str, choices: Iterable[str], what: str, option: str, where: str = "") -> str:
    """``name`` if it is one of ``choices``; else one line listing them with a suggestion."""
    known = list(choices)
    if name in known:
        return name
    prefix = f"{where}: " if where else ""
    raise UsageError(f"{prefix}{option} {excerpt(name)}: no {what} of that name"
                    f"{did_you_mean(name, known)} ({what}s: {', '.join(sorted(known))})")


def stack_list(value: Any) -> list[str]:
    """``--stack`` as a list whether the task declared it iterable or not."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def default_stack(matrix: Matrix) -> str | None:
    """The file's ``default_stack`` (checked against its stacks by the loader)."""
    data = matrix.located.data if isinstance(matrix.located.data, dict) else {}
    return data.get("default_stack")


def pick_stacks(matrix: Matrix, stacks: Any, all_stacks: bool) -> list[str]:
    """``--stack S`` (repeatable), ``--all``, or neither: the file's ``default_stack``."""
    names = stack_list(stacks)
    if names and all_stacks:
        raise UsageError("give either --stack or --all, not both")
    if all_stacks:
        return list(matrix.stacks)
    if not names:
        fallback = default_stack(matrix)
        if fallback is None:
            raise UsageError(f"missing option --stack (or --all); {matrix.path} declares no "
                            "default_stack")
        names = [fallback]
    for name in names:
        choose(name, matrix.stacks, "stack", "--stack", str(matrix.path))
    return list(dict.fromkeys(names))


def one_stack(matrix: Matrix, stacks: Any) -> str:
    """Exactly one stack for commands about a single image (default: ``default_stack``)."""
    names = pick_stacks(matrix, stacks, False)
    if len(names) > 1:
        raise UsageError(f"--stack given {len(names)} times; this command takes one stack")
    return names[0]


def emit_json(data: Any) -> None:
    """Machine-readable output on stdout (``--json``): one JSON document, sorted keys."""
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def command_after_dashdash(argv: Sequence[str], remainder: str) -> list[str]:
    """The command typed after ``--``, word for word.

    Invoke hands a task what follows ``--`` as one space-joined string, which loses the
    quoting (``-c "a; b"`` would reach the nodes as ``-c a; b``). The process's own argv still
    has every word as the shell split it, so that is what we use; the joined string only when
    there is no ``--`` in argv (a task called from Python).
    """
    if "--" in argv:
        return list(argv[list(argv).index("--") + 1:])
    import shlex

    return shlex.split(remainder)


# --- loading -------------------------------------------------------------------------------------

def load(stacks_file: str) -> Matrix:
    """The stacks file; ``--stacks cpu-tcp`` (a stack name, not a file) gets a hint."""
    from matrix.model.loader import load_matrix  # not at import: see matrix/model/schema.py

    path = Path(stacks_file)
    if not path.exists() and path.suffix not in (".yaml", ".yml") and "/" not in stacks_file:
        raise UsageError(f"--stacks {excerpt(stacks_file)}: no such file; --stacks names the "
                        f"stacks file, --stack a stack (did you mean --stack {stacks_file}?)")
    return load_matrix(path)


def generated_dir(matrix: Matrix) -> Path:
    """The committed folder for the project's own matrix; a sibling folder for other files."""
    if matrix.path.resolve() == (ROOT / "stacks.yaml").resolve():
        return GENERATED
    return matrix.path.resolve().parent / "generated"


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


