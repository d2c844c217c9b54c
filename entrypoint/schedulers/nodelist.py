"""Slurm's compressed host lists and task counts, expanded in pure Python (no ``scontrol`` needed).

Images run under pyxis rarely hold Slurm's client tools, so the entrypoint expands
``SLURM_JOB_NODELIST``/``SLURM_STEP_NODELIST`` itself. The grammar follows Slurm's own parser
(``src/common/hostlist.c``: ``_hostlist_create_bracketed``, ``_push_range_list`` and
``_parse_single_range``, https://github.com/SchedMD/slurm/blob/slurm-22-05-8-1/src/common/hostlist.c)
and is tested against ``scontrol show hostnames``:

- items are separated by commas, spaces or tabs outside brackets: ``a1,b[2-3]``;
- a bracket holds a comma list of ``N`` or ``LO-HI`` (``a[1-3,5]``); every number is printed
  zero-padded to the width of its low bound as written (``a[01-10]``: ``a01`` ... ``a10``;
  ``a[8-11]``: ``a8`` ... ``a11``);
- several brackets make a cartesian product (``r[1-2]n[01-02]``); nothing may follow the last
  bracket (``a[1-3]-x`` is invalid in Slurm too). Slurm varies the last bracket fastest and the
  others from the second-to-last (slowest) down to the first: ``a[1-2]b[1-2]c[1-2]`` gives
  ``a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ...``.

Deliberately stricter than Slurm, which turns these into odd host names instead of an error: an
unbalanced ``[`` or ``]``, an empty or open range (``a[]``, ``a[1-]``), white space or signs
inside brackets, and a range of more than 65536 hosts (Slurm's ``MAX_RANGE``). Duplicates are
kept, as Slurm keeps them.

``SLURM_TASKS_PER_NODE`` (and ``SLURM_JOB_CPUS_PER_NODE``) use another form: ``2(x3),1`` is
``[2, 2, 2, 1]`` (``expand_counts``; srun(1) and sbatch(1), OUTPUT ENVIRONMENT VARIABLES,
https://slurm.schedmd.com/sbatch.html#OPT_SLURM_TASKS_PER_NODE).
"""

import itertools
import re
from typing import List

MAX_RANGE = 65536  # Slurm's MAX_RANGE: the most hosts one LO-HI range may name
MAX_HOSTS = 65536  # the most hosts a whole list may expand to (a job has far fewer nodes)
SEPARATORS = ",\t "
_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_COUNT_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _items(nodelist: str) -> List[str]:
    """Split at separators outside brackets; brackets must balance and not nest."""
    items, depth, current = [], 0, []
    for ch in nodelist:
        if ch in SEPARATORS and depth == 0:
            items.append("".join(current))
            current = []
            continue
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested '[' in %r" % nodelist)
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '[' in %r" % nodelist)
        current.append(ch)
    if depth:
        raise ValueError("'[' without ']' in %r" % nodelist)
    items.append("".join(current))
    return [item for item in items if item]


def _numbers(body: str, item: str) -> List[str]:
    """The numbers one bracket names, as strings padded to their low bound's width."""
    out = []  # type: List[str]
    for part in body.split(","):
        match = _RANGE_RE.match(part)
        if not match:
            raise ValueError("%r is not a number or LO-HI range in %r" % (part, item))
        low, high = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(low), int(high)
        if hi < lo:
            raise ValueError("range %s is backwards in %r" % (part, item))
        if hi - lo + 1 > MAX_RANGE:
            raise ValueError("range %s names more than %d hosts" % (part, MAX_RANGE))
        out.extend(str(n).zfill(len(low)) for n in range(lo, hi + 1))
    return out


def _expand_item(item: str, budget: int) -> List[str]:
    """The hosts of one item; ``budget``: how many more the list may name (a plain name counts
    as one host like any other, so a long plain list is bounded too)."""
    parts = re.split(r"\[([^\]]*)\]", item)  # text, bracket, text, bracket, ..., text
    texts, brackets = parts[0::2], parts[1::2]
    if brackets and texts[-1]:
        raise ValueError("%r: nothing may follow the last ']' (Slurm rejects it too)" % item)
    choices = [_numbers(body, item) for body in brackets]
    total = 1
    for values in choices:
        total *= len(values)
    if total > budget:
        raise ValueError("the list names more than %d hosts (past the limit at %r)"
                         % (MAX_HOSTS, item if len(item) <= 80 else item[:77] + "..."))
    if not brackets:
        return [item]
    # Slurm's order: the last bracket fastest; the others from the second-to-last (slowest)
    # down to the first (see the module docstring).
    order = list(range(len(choices) - 2, -1, -1)) + [len(choices) - 1]
    hosts = []
    for combo in itertools.product(*[choices[i] for i in order]):
        picked = dict(zip(order, combo))
        hosts.append("".join(texts[i] + picked[i] for i in range(len(choices))))
    return hosts


def expand(nodelist: str) -> List[str]:
    """The host names of a Slurm host list, in Slurm's order. Raises ``ValueError`` with the
    reason when the list is malformed."""
    hosts = []  # type: List[str]
    for item in _items(nodelist):
        hosts.extend(_expand_item(item, MAX_HOSTS - len(hosts)))
    return hosts


def expand_counts(text: str) -> List[int]:
    """``2(x3),1`` -> ``[2, 2, 2, 1]`` (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE). Raises
    ``ValueError`` when malformed."""
    counts = []  # type: List[int]
    for part in text.split(","):
        match = _COUNT_RE.match(part.strip())
        if not match:
            raise ValueError("%r is not N or N(xM)" % part)
        value, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat < 1 or len(counts) + repeat > MAX_HOSTS:
            raise ValueError("%r repeats %d times" % (part, repeat))
        counts.extend([value] * repeat)
    return counts
