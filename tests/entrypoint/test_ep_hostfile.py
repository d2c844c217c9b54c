"""Hostfile formats, sorted by node index."""

from entrypoint.plan import hostfile
from entrypoint.rendezvous.server import NodeInfo

NODES = [NodeInfo(2, "10.0.0.12", 8, ""), NodeInfo(0, "10.0.0.10", 8, ""),
         NodeInfo(1, "10.0.0.11", 4, "")]


def test_openmpi_format_sorted_by_index():
    assert hostfile.render_openmpi(NODES) == (
        "10.0.0.10 slots=8\n10.0.0.11 slots=4\n10.0.0.12 slots=8\n")


def test_plain_and_intel_formats():
    assert hostfile.render_plain(NODES) == "10.0.0.10\n10.0.0.11\n10.0.0.12\n"
    assert hostfile.render_intel(NODES) == "10.0.0.10:8\n10.0.0.11:4\n10.0.0.12:8\n"


def test_total_slots():
    assert hostfile.total_slots(NODES) == 20


def test_write_all(tmp_path):
    paths = hostfile.write_all(str(tmp_path), NODES)
    for kind, render in (("openmpi", hostfile.render_openmpi), ("plain", hostfile.render_plain),
                         ("intel", hostfile.render_intel)):
        with open(paths[kind]) as handle:
            assert handle.read() == render(NODES)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hostfile", "hostfile.intel", "hostfile.plain"]
