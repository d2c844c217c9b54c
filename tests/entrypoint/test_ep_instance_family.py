"""``MNP_INSTANCE_TYPE`` outside the instance table (issue 25): a type of a family the table (or
``RDMA_FAMILIES``) knows goes by that family, and the plan's note names the family and its rows;
only an unknown family, or a size EC2 does not have, is refused with one line."""

import pytest

from entrypoint.plan import make as plan
from entrypoint.probe import fabric
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config


def planned(itype):
    cfg = config.load({"MNP_INSTANCE_TYPE": itype})
    # an EFA GPU node with an aws-ofi-nccl that needs FI_EFA_USE_DEVICE_RDMA=1 where RDMA reads
    # work (envtable's rows), so the family's answer shows in the environment
    facts = NodeFacts(instance_type=cfg.instance_type, instance_source="MNP_INSTANCE_TYPE",
                      address="10.0.0.5", interface="eth0", is_root=True, gpus=1, slots=1,
                      efa_devices=["uverbs0"], fi_info_efa=True,
                      versions={"aws-ofi-nccl": "1.6.0", "libfabric": "1.15.0", "nccl": "2.18.3"},
                      plugin_path="/opt/aws-ofi-nccl/lib/libnccl-net.so")
    return plan.make_plan(cfg, facts, ["python3", "train.py"], {})


@pytest.mark.parametrize("itype, rdma, basis", [
    ("g6.2xlarge", True, "the table's rows g6.12xlarge, g6.48xlarge"),
    ("p5.4xlarge", True, "the table's rows p5.48xlarge"),
    ("g5.8xlarge", False, "the table's rows g5.12xlarge, g5.48xlarge"),
    ("trn2.48xlarge", True, "RDMA_FAMILIES"),
])
def test_a_type_the_table_lacks_goes_by_its_family_and_the_plan_says_so(itype, rdma, basis):
    assert itype not in fabric.INSTANCE_TYPES  # the point: the table has no row for it
    p = planned(itype)
    family = itype.split(".")[0]
    answer = "yes" if rdma else "no"
    note = (f"instance type {itype} is not in the instance table: it goes by its family "
            f"{family} ({basis}): EFA RDMA read {answer} (from MNP_INSTANCE_TYPE)")
    assert note in p.notes and "note: " + note in p.text()
    assert p.fabric["rdma"] is rdma
    assert (p.value("FI_EFA_USE_DEVICE_RDMA") == "1") is rdma


def test_a_table_type_gets_no_family_note():
    assert not [n for n in planned("p4d.24xlarge").notes if "goes by its family" in n]


def test_the_dry_run_of_the_entrypoint_names_the_family(local_node):
    result = local_node.run(["true"], MNP_DRY_RUN="1", MNP_INSTANCE_TYPE="g6.2xlarge")
    assert result.returncode == 0, result.stderr
    assert ("note: instance type g6.2xlarge is not in the instance table: it goes by its family "
            "g6 (the table's rows g6.12xlarge, g6.48xlarge)") in result.stdout


@pytest.mark.parametrize("itype, expected", [
    ("g4dn.12xlarge", "'g4dn.12xlarge' is not in the instance table and its family g4dn is not "
                      "one the table or RDMA_FAMILIES knows"),
    ("p5n.48xlarge", "(did you mean family p5en?)"),
    ("p5.48xlarg", "'p5.48xlarg': 48xlarg is not an EC2 instance size (large, xlarge, 24xlarge, "
                   "metal, ...) (did you mean p5.48xlarge?)"),
    ("big", "'big' is not an EC2 instance type like p4d.24xlarge"),
])
def test_an_unknown_family_or_size_is_one_line_naming_the_variable(local_node, itype, expected):
    result = local_node.run(["true"], MNP_INSTANCE_TYPE=itype)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "MNP_INSTANCE_TYPE: " in lines[0] and expected in lines[0], lines


def test_an_unknown_family_metadata_reports_is_planned_without_rdma_read():
    """IMDS may report any type (it is not a setting): an unknown family gets no RDMA read."""
    rdma, why = fabric.rdma_capable("g4dn.12xlarge")
    assert rdma is False and "family g4dn is neither in the instance table" in why
