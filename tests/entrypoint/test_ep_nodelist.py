"""Slurm host lists and task counts: the entrypoint's expansion against the real ``scontrol``.

``scontrol show hostnames`` (Debian's slurm-client) needs only a two-line slurm.conf to expand a
list offline; the comparisons skip where it is not installed.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.schedulers import nodelist


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    """``expand(list) -> (hosts, invalid)`` through the real ``scontrol show hostnames``."""
    program = shutil.which("scontrol")
    if not program:
        pytest.skip("scontrol is not installed (Debian package slurm-client)")
    conf = Path(tmp_path_factory.mktemp("slurm")) / "slurm.conf"
    conf.write_text("ClusterName=mnp\nSlurmctldHost=localhost\n")

    def expand(text):
        # "--": a list may start with "-", which scontrol would read as an option
        result = subprocess.run([program, "--", "show", "hostnames", text],
                                env={"SLURM_CONF": str(conf)}, capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr
        # scontrol exits 0 even on a bad list: it says so on stderr and names no host
        invalid = "Invalid hostlist" in result.stderr
        return ([] if invalid else result.stdout.split()), invalid

    return expand


# Measured with scontrol 22.05, including Slurm's order for three brackets (not the plain
# cartesian order: the middle bracket varies slowest).
KNOWN = {
    "node[1-3]": "node1 node2 node3",
    "a[1-3,5]": "a1 a2 a3 a5",
    "a[01-10]": "a01 a02 a03 a04 a05 a06 a07 a08 a09 a10",
    "a[8-11]": "a8 a9 a10 a11",
    "a[098-101]": "a098 a099 a100 a101",
    "a[0-0010]": "a0 a1 a2 a3 a4 a5 a6 a7 a8 a9 a10",
    "a1,b[2-3]": "a1 b2 b3",
    "r[1-2]n[01-02]": "r1n01 r1n02 r2n01 r2n02",
    "a[1-2]b[1-2]c[1-2]": "a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 a1b2c2 a2b2c1 a2b2c2",
    "q1-st-p4d-[1-2],q1-dy-p5-1": "q1-st-p4d-1 q1-st-p4d-2 q1-dy-p5-1",
    "ip-10-0-1-[5-6]": "ip-10-0-1-5 ip-10-0-1-6",
    "a[5]": "a5",
    "a,b": "a b",
    "a b\tc": "a b c",
    "x[0-2,07-08]": "x0 x1 x2 x07 x08",
    "a[1,1]": "a1 a1",
    "[1-3]": "1 2 3",
    ",a[1-2],": "a1 a2",
    "": "",
}
INVALID_IN_BOTH = ["a[1-3]-x", "a[1-3]b", "a[3-1]", "a[]", "a[-3]", "a[x]", "a[1-65537]",
                   "a[[1]]", "a[1-2]x[1-2]y"]
# Slurm turns these into odd host names ("a[1-3" becomes "a]"); the entrypoint refuses them.
STRICTER = ["a[1-3", "a1]", "a[1-]", "a[ 1-2]", "a[+1]", "a[1-2-3]"]


@pytest.mark.parametrize("text", sorted(KNOWN))
def test_known_lists(text):
    assert nodelist.expand(text) == KNOWN[text].split()


@pytest.mark.parametrize("text", sorted(KNOWN))
def test_known_lists_match_scontrol(scontrol, text):
    assert scontrol(text) == (KNOWN[text].split(), False)


@pytest.mark.parametrize("text", INVALID_IN_BOTH)
def test_lists_slurm_rejects_are_rejected(scontrol, text):
    assert scontrol(text)[1], text
    with pytest.raises(ValueError):
        nodelist.expand(text)


@pytest.mark.parametrize("text", STRICTER)
def test_malformed_lists_slurm_mangles_are_rejected(text):
    with pytest.raises(ValueError):
        nodelist.expand(text)


def test_a_range_may_name_65536_hosts_like_slurm():
    assert len(nodelist.expand("a[1-65536]")) == 65536


def test_the_product_of_brackets_is_bounded_before_it_is_built():
    with pytest.raises(ValueError, match="more than"):
        nodelist.expand("r[1-60000]n[1-60000]")


def test_a_long_list_is_bounded_in_total():
    with pytest.raises(ValueError, match="more than"):
        nodelist.expand("a[1-40000],b[1-40000]")


def test_plain_names_count_against_the_bound():
    """Mutation testing found plain names uncounted: 70,000 of them were accepted."""
    plain = ",".join(f"h{n}" for n in range(70000))
    with pytest.raises(ValueError, match=r"more than 65536 hosts \(past the limit at 'h65536'\)"):
        nodelist.expand(plain)
    assert len(nodelist.expand(",".join(f"h{n}" for n in range(nodelist.MAX_HOSTS)))) == 65536
    with pytest.raises(ValueError, match=r"past the limit at 'b'"):
        nodelist.expand("a[1-65536],b")


# Random lists in the grammar Slurm accepts: items of text and brackets, nothing after the last
# bracket, ranges with random zero padding.
TEXT = st.text(alphabet="abcxyz-.0123456789", min_size=0, max_size=4)
NAME = st.text(alphabet="abxyz-.0123456789", min_size=1, max_size=6)


@st.composite
def bracket(draw):
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        low = draw(st.integers(0, 120))
        high = low + draw(st.integers(0, 4))
        width = draw(st.integers(0, 4))
        part = str(low).zfill(width)
        if draw(st.booleans()):
            part += "-" + str(high).zfill(draw(st.integers(0, 4)))
        parts.append(part)
    return "[" + ",".join(parts) + "]"


@st.composite
def item(draw):
    if draw(st.booleans()):
        return draw(NAME)
    out = draw(TEXT)
    for index in range(draw(st.integers(1, 3))):
        if index:
            out += draw(TEXT)
        out += draw(bracket())
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(item(), min_size=1, max_size=4), st.sampled_from([",", " ", ", "]))
def test_random_lists_match_scontrol(scontrol, items, separator):
    text = separator.join(items)
    assert nodelist.expand(text) == scontrol(text)[0], text


@pytest.mark.parametrize("text, counts", [
    ("1(x3)", [1, 1, 1]), ("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("8,4(x2)", [8, 4, 4]),
])
def test_task_counts(text, counts):
    assert nodelist.expand_counts(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(3)", "2(x0)", "(x2)", "2(x3", "-1", "2(x70000)"])
def test_bad_task_counts(text):
    with pytest.raises(ValueError):
        nodelist.expand_counts(text)
