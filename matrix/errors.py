"""Errors the CLI reports as one clear line instead of a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

# An error line is read by a person: a value longer than this is quoted as an excerpt.
EXCERPT_CHARS = 40
# A whole error line never grows past this, whatever it quotes (a safety net behind excerpt()).
MAX_MESSAGE_CHARS = 1000


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)``, shortened to about ``limit`` characters with the full length said."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(value)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """'; did you mean X?' for the closest of ``choices`` (difflib), or ''."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


# Several problems in one error line (rule violations) are joined with this separator.
SEPARATOR = " | "
# Exit statuses: a mistake in the command line (unknown or malformed option, a value out of
# range, a name that is not in the stacks file or the instance table) is 2, as for a shell
# builtin misused; what is understood but cannot be done (a rule violation, a plan with PROBLEM
# lines, no engine, a failed build) is 1.
EXIT_CANNOT = 1
EXIT_USAGE = 2


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` within about ``limit`` characters: whole items (split on :data:`SEPARATOR`)
    while they fit, then "... and N more"; one huge item is cut with its length said."""
    if len(text) <= limit:
        return text
    items = text.split(SEPARATOR)
    kept: list[str] = []
    for item in items:
        if len(SEPARATOR.join([*kept, item])) > limit:
            break
        kept.append(item)
    if not kept:
        return f"{text[:limit]}... ({len(text) - limit} more characters)"
    return SEPARATOR.join(kept) + f"{SEPARATOR}... and {len(items) - len(kept)} more"


class UserError(Exception):
    """A problem with the user's input or environment, printed as one line; exit status 1.

    The message is kept to one line whatever it quotes (a YAML key may hold a newline), and to
    about :data:`MAX_MESSAGE_CHARS` (a huge bad value must not flood the terminal; many rule
    violations show the first whole and say how many more, see :func:`shorten`).
    """

    exit_code = EXIT_CANNOT

    def __init__(self, message: str) -> None:
        text = str(message).replace("\r", "\\r").replace("\n", "\\n")
        super().__init__(shorten(text))


class UsageError(UserError):
    """A mistake in the command line itself (see :data:`EXIT_USAGE`): exit status 2."""

    exit_code = EXIT_USAGE
