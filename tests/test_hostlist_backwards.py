"""Slurm's host lists with a backwards range, checked without ``scontrol``.

tests/entrypoint/test_ep_nodelist.py compares the entrypoint's expansion with the real
``scontrol show hostnames``, and skips where Slurm's client is not installed (as in a bare CI
runner). The values here are Slurm's own, read from its source, so the unit job checks them
everywhere: in ``src/common/hostlist.c`` (https://github.com/SchedMD/slurm/blob/slurm-22-05-8-1/
src/common/hostlist.c), ``_parse_single_range`` ends a range whose low end is above its high
end with ``if (range->lo > range->hi) goto error;``, and ``_hostlist_create_bracketed`` then
destroys the whole list (``goto error`` -> ``hostlist_destroy(new)``, returning NULL), so
``scontrol`` names no host at all and says "Invalid hostlist" (measured with scontrol 22.05:
``a[3-1]`` is in test_ep_nodelist.py's INVALID_IN_BOTH). A range of one host (``[3-3]``) is not
backwards: ``lo == hi`` passes the same check.
"""

import pytest

from entrypoint.schedulers import nodelist

BACKWARDS = ["node[3-1]", "node[1-3,5-4]", "a[1-2],node[3-1]", "r[2-1]n[1-2]", "r[1-2]n[02-01]"]


@pytest.mark.parametrize("text", BACKWARDS)
def test_a_backwards_range_rejects_the_whole_list(text):
    with pytest.raises(ValueError, match="backwards"):
        nodelist.expand(text)


@pytest.mark.parametrize("text, hosts", [("node[3-3]", ["node3"]), ("node[1-1,3-3]", ["node1", "node3"]),
                                         ("node[09-10]", ["node09", "node10"])])
def test_a_range_of_one_host_or_upwards_is_not_backwards(text, hosts):
    assert nodelist.expand(text) == hosts
