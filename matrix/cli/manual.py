"""The README's command table, made from the tasks themselves: one row a task, its name and the
first line of its docstring (the writers' from ``Writer.summary``); the options are each task's
``--help``, made from their declarations. ``python -m matrix.cli.manual`` prints the table;
tests/test_readme.py checks the README holds it as printed (and never rewrites the README).
"""

from __future__ import annotations

import sys
from pathlib import Path

BEGIN = "<!-- commands: python -m matrix.cli.manual -->"
END = "<!-- end of commands -->"


def rows() -> list[tuple[str, str]]:
    """``(task, summary)`` for every task of tasks.py, in ``invoke --list``'s order."""
    import invoke

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    try:
        import tasks
    finally:
        sys.path.remove(str(root))
    collection = invoke.Collection.from_module(tasks)
    found = []
    for name in sorted(collection.task_names):
        doc = (collection[name].__doc__ or "").strip()
        found.append((name, " ".join(doc.split("\n\n")[0].split())))
    return found


def table() -> str:
    """The Markdown table between :data:`BEGIN` and :data:`END`."""
    lines = [BEGIN, "| command | what it does (`invoke --help COMMAND`: its options) |", "|---|---|"]
    lines += [f"| `invoke {name}` | {summary} |" for name, summary in rows()]
    return "\n".join([*lines, END])


if __name__ == "__main__":
    print(table())
