"""Options declared by their owner (TorchX's ``runopts``): each job writer declares the options
its artefact takes beside it (``Writer.run_options``), the job spec declares what every writer
takes (:data:`matrix.jobs.spec.JOB_OPTIONS`), ``invoke explain`` and ``invoke run`` their own.

From these declarations, and from nothing else, come:

- the invoke tasks of the writers and their ``--help`` (:func:`matrix.cli.jobtasks.make_task`);
- what a command line means: :func:`parse` turns the typed values into typed ones with every
  default applied, and says a mistake in one line naming the option (exit 2);
- shell completion's values (``invoke stacks --values OPTION``) and the usage checker's
  examples ("--nodes needs a value, e.g. ...");
- the README's command table (``python -m matrix.cli.manual``).

An option's name is the Python name (``instance_type``); its flag is ``--instance-type``. A flag
means one thing in every task: two declarations of one name may differ in help and default,
never in type or values (:func:`flags` checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from matrix.errors import UsageError, did_you_mean, excerpt

# What an option's values are read from when they depend on the stacks file (``--stack``).
Values = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class Option:
    """One option of a task.

    ``kind``: ``str``, ``int`` or ``bool`` (a flag); ``default``: the value when it is not given
    (None: none), said in ``--help`` as ``default_text`` when that is set (a default that is a
    rule, not a value); ``choices``: the values it takes, or a function of the stacks file's path
    returning them (``--stack``), for checking and completion; ``repeatable``: given several
    times, a list; ``example``: a value, for "needs a value, e.g."; ``minimum``/``maximum``: an
    int's bounds; ``action``: what the task does with the artefact (``--output``,
    ``--register``), not part of the job, so ``invoke explain`` does not take it;
    ``bound_reason``: why an int has its bounds, said with a value outside them; ``what``: one
    of its values in words ("instance type"), for "no instance type of that name";
    ``checked``: False where the values are checked later against more than the option knows
    (a stack against the stacks file given with ``--stacks``), so they only serve completion;
    ``variable``: the ``MNP_*`` setting of the entrypoint it sets, so that a plan's advice in
    the entrypoint's terms ("MNP_LAUNCHER=none") reaches the user as this option."""

    name: str
    help: str
    kind: type = str
    default: Any = None
    default_text: str = ""
    choices: tuple[str, ...] | Values = ()
    required: bool = False
    repeatable: bool = False
    example: str = ""
    minimum: int | None = None
    maximum: int | None = None
    action: bool = False
    bound_reason: str = ""
    what: str = ""
    checked: bool = True
    variable: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def typed(self, value: str = "") -> str:
        """``--flag VALUE`` as a user types it: ``--flag=VALUE`` for a value that starts with
        ``-`` (a launcher's own options), which invoke would otherwise read as an option."""
        value = value or self.example or "VALUE"
        return f"{self.flag}={value}" if value.lstrip("'\"").startswith("-") else f"{self.flag} {value}"

    def values(self, stacks_file: str = "stacks.yaml") -> list[str]:
        """The values it takes ([] when any value goes)."""
        if callable(self.choices):
            return list(self.choices(stacks_file))
        return list(self.choices)

    def help_line(self) -> str:
        """The ``--help`` text: what it is, then required or its default."""
        if self.required:
            return f"{self.help} (required)"
        if self.kind is bool:
            return self.help
        if self.default_text:
            return f"{self.help} (default: {self.default_text})"
        if self.default is None:
            return f"{self.help} (default: none)"
        return f"{self.help} (default: {self.default})"

    def invoke_default(self) -> Any:
        """The default invoke's parser is given: False for a flag, [] for a repeatable option,
        else None, so that :func:`parse` knows what was typed and applies the declared default."""
        if self.kind is bool:
            return False
        return None

    def read(self, raw: Any) -> Any:
        """The typed value of ``raw`` (as invoke hands it over), or a :class:`UsageError`."""
        if self.repeatable:
            return [self._one(item) for item in (raw or [])]
        if raw is None:
            if self.required:
                hint = f" (e.g. {self.typed()})" if self.example else ""
                raise UsageError(f"missing option {self.flag}{hint}")
            return self.default
        return self._one(raw)

    def _one(self, raw: Any) -> Any:
        if self.kind is bool:
            return bool(raw)
        if self.kind is int:
            return self._number(raw)
        text = str(raw)
        if text == "":
            raise UsageError(f"{self.flag} needs a value" +
                             (f", e.g. {self.typed()}" if self.example else ""))
        known = self.values() if self.choices and self.checked else []
        if known and text not in known:
            what = self.what or self.flag[2:].replace("-", " ")
            raise UsageError(f"{self.flag} {excerpt(text)}: no {what} of that name"
                             f"{did_you_mean(text, known)} ({what}s: {', '.join(sorted(known))})")
        self._as_the_entrypoint_reads_it(text)
        return text

    def _as_the_entrypoint_reads_it(self, text: str) -> None:
        """The value of an option that sets an ``MNP_*`` variable, read by that setting's own
        reader in the entrypoint's table (entrypoint/settings/config.py): what every node would
        refuse at start (``--launcher-args="'"``: no closing quotation) is refused here, in one
        line naming the option."""
        if not self.variable:
            return
        from entrypoint.core.errors import ConfigError
        from entrypoint.settings.config import TABLE

        setting = next((s for s in TABLE if s.name == self.variable), None)
        if setting is None:
            return
        try:
            setting.load({self.variable: text})
        except ConfigError as exc:
            said = str(exc).split(": ", 1)[-1]
            raise UsageError(f"{self.flag} {excerpt(text)}: {said} (as the entrypoint reads "
                             f"{self.variable})") from None

    def _number(self, raw: Any) -> int:
        if isinstance(raw, bool):
            raise UsageError(f"{self.flag} needs a whole number")
        try:
            number = raw if isinstance(raw, int) else int(str(raw).strip(), 10)
        except ValueError:
            raise UsageError(f"{self.flag} {excerpt(raw)}: expected a whole number, e.g. "
                             f"{self.flag} {self.example or 2}") from None
        low, high = self.minimum, self.maximum
        if (low is not None and number < low) or (high is not None and number > high):
            if low is not None and high is not None:
                raise UsageError(f"{self.flag} {number}: expected a whole number from {low} to "
                                 f"{high}{self._bound_reason()}")
            if low is not None:
                raise UsageError(f"{self.flag} {number}: must be at least {low}")
            raise UsageError(f"{self.flag} {number}: at most {high}")
        return number

    def _bound_reason(self) -> str:
        return f" ({self.bound_reason})" if self.bound_reason else ""


@dataclass(frozen=True)
class RunOpts:
    """The options of one task, in the order ``--help`` lists them."""

    options: tuple[Option, ...] = field(default_factory=tuple)

    def __iter__(self) -> Any:
        return iter(self.options)

    def names(self) -> list[str]:
        return [option.name for option in self.options]

    def get(self, name: str) -> Option | None:
        return next((option for option in self.options if option.name == name), None)

    def merged(self, *others: Iterable[Option]) -> RunOpts:
        """These options, then ``others``; a later option of a name already here replaces it in
        place (a writer's own help or default for a shared option)."""
        found = {option.name: option for option in self.options}
        order = list(found)
        for group in others:
            for option in group:
                if option.name not in found:
                    order.append(option.name)
                found[option.name] = option
        return RunOpts(tuple(found[name] for name in order))

    def with_default(self, name: str, default: Any, text: str = "") -> RunOpts:
        return RunOpts(tuple(replace(option, default=default, default_text=text)
                             if option.name == name else option for option in self.options))

    def parse(self, typed: Mapping[str, Any]) -> dict[str, Any]:
        """Every option's value: typed ones read (:meth:`Option.read`), the rest defaulted.
        A name ``typed`` holds that is not declared is a programming error."""
        unknown = set(typed) - set(self.names())
        if unknown:
            raise TypeError(f"not declared: {', '.join(sorted(unknown))}")
        return {option.name: option.read(typed.get(option.name)) for option in self.options}

    def help(self) -> dict[str, str]:
        """invoke's ``help=`` for the task."""
        return {option.name: option.help_line() for option in self.options}

    def iterable(self) -> list[str]:
        """invoke's ``iterable=`` for the task."""
        return [option.name for option in self.options if option.repeatable]


def in_option_terms(line: str, options: RunOpts) -> str:
    """``line`` (a plan's problem, in the entrypoint's ``MNP_*`` terms) with each setting an
    option of ``options`` sets named as that option: ``MNP_LAUNCHER=none`` as ``--launcher
    none``, ``MNP_LAUNCHER_ARGS`` as ``--launcher-args``. Longer names first, so that
    MNP_LAUNCHER_ARGS is not read as MNP_LAUNCHER."""
    import re

    for option in sorted((o for o in options if o.variable), key=lambda o: -len(o.variable)):
        line = re.sub(rf"\bset {option.variable}\b", f"give {option.flag}", line)
        line = re.sub(rf"\b{option.variable}=", f"{option.flag} ", line)
        line = re.sub(rf"\b{option.variable}\b", option.flag, line)
    return line


def flags(groups: Iterable[RunOpts]) -> dict[str, Option]:
    """Every declared flag across ``groups`` (one task's options each), by flag. A name declared
    twice with another type or other values is a programming error: a flag means one thing."""
    found: dict[str, Option] = {}
    for group in groups:
        for option in group:
            seen = found.get(option.flag)
            if seen is not None and (seen.kind, seen.repeatable) != (option.kind,
                                                                      option.repeatable):
                raise TypeError(f"{option.flag} is declared twice with different types")
            if seen is None or (not seen.choices and option.choices):
                found[option.flag] = option
    return found
