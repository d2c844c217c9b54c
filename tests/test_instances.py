"""The one instance table: schema, sources, and the figures stacks and jobdef rely on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from matrix.errors import UserError
from matrix.model.instances import (
    INSTANCE_TYPES,
    TABLE,
    InstanceType,
    get_instance_type,
    load_instance_types,
)
from matrix.model.loader import load_matrix

ROOT = Path(__file__).resolve().parent.parent

# Types the GPU stack family built on CUDA 12.8+ targets, besides those stacks.yaml names today.
NEW_GPU_TYPES = ("p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "g5.12xlarge", "g5.48xlarge",
                 "g6.12xlarge", "g6.48xlarge", "g6e.12xlarge", "g6e.48xlarge")


def test_every_stack_instance_is_in_the_table():
    matrix = load_matrix(ROOT / "stacks.yaml")
    named = {i for stack in matrix.stacks.values() for i in stack.instances}
    assert named <= set(INSTANCE_TYPES), named - set(INSTANCE_TYPES)
    assert set(NEW_GPU_TYPES) <= set(INSTANCE_TYPES)


@pytest.mark.parametrize("name", sorted(INSTANCE_TYPES))
def test_row_is_consistent_and_cites_urls(name):
    row = INSTANCE_TYPES[name]
    assert (row.gpus > 0) == (row.gpu_model is not None)
    assert (row.hpus > 0) == (row.hpu_model is not None)
    assert not (row.gpus and row.hpus)
    assert row.efa_interfaces == 0 or row.network_gbps >= 25
    assert not row.efa_rdma_read or row.has_efa
    assert "https://" in row.source  # every row carries URLs, not only [keys]


@pytest.mark.parametrize(("name", "gpus", "model", "efa"), [
    ("p3.16xlarge", 8, "V100", 0), ("p3dn.24xlarge", 8, "V100", 1), ("p4d.24xlarge", 8, "A100", 4),
    ("p4de.24xlarge", 8, "A100", 4), ("p5.48xlarge", 8, "H100", 32), ("p5e.48xlarge", 8, "H200", 32),
    ("p5en.48xlarge", 8, "H200", 16), ("p6-b200.48xlarge", 8, "B200", 8),
    ("p6-b300.48xlarge", 8, "B300", 16),
    ("g5.12xlarge", 4, "A10G", 1), ("g6.48xlarge", 8, "L4", 1), ("g6e.48xlarge", 8, "L40S", 4),
    ("c5n.18xlarge", 0, None, 1), ("m5.24xlarge", 0, None, 0),
])
def test_gpu_models_and_efa_counts(name, gpus, model, efa):
    row = get_instance_type(name)
    assert (row.gpus, row.gpu_model, row.efa_interfaces) == (gpus, model, efa)


def test_dl1_has_four_efa_interfaces_and_gaudi():
    """AWS's EFA limitations: p4d.24xlarge and dl1.24xlarge support up to four EFAs (and
    DescribeInstanceTypes' MaximumEfaInterfaces, DESCRIBE below)."""
    row = get_instance_type("dl1.24xlarge")
    assert (row.efa_interfaces, row.hpus, row.hpu_model, row.gpus) == (4, 8, "Gaudi", 0)


def test_hpc6a_has_one_thread_per_core():
    row = get_instance_type("hpc6a.48xlarge")
    assert row.slots_per_node() == 96 == row.vcpus


def _table_error(tmp_path: Path, edit) -> str:
    data = yaml.safe_load(TABLE.read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "instances.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_instance_types(path)
    return str(info.value)


def test_gpu_without_model_is_a_schema_error(tmp_path):
    message = _table_error(tmp_path, lambda d: d["instances"]["p4d.24xlarge"].pop("gpu_model"))
    assert "instances.yaml:" in message and "p4d.24xlarge" in message and "gpu_model" in message


def test_unknown_source_key_is_named(tmp_path):
    def edit(data):
        data["instances"]["p4d.24xlarge"]["source"] = "[nowhere] figures from a blog post"
    message = _table_error(tmp_path, edit)
    assert "instances.yaml:" in message and "[nowhere]" in message


def test_the_entrypoint_reads_the_tables_rdma_facts():
    """The in-image entrypoint reads the table from its generated copy (fresh: see below); its
    family list (for types the instance metadata reports) must agree with every row."""
    from entrypoint.probe import fabric

    assert set(fabric.INSTANCE_TYPES) == set(INSTANCE_TYPES)
    for name, row in INSTANCE_TYPES.items():
        assert fabric.rdma_capable(name)[0] is row.efa_rdma_read, name
        if row.has_efa:
            family = name.split(".", 1)[0]
            assert (family in fabric.RDMA_FAMILIES) is row.efa_rdma_read, name


def test_the_entrypoint_table_is_fresh():
    """CI's freshness gate for entrypoint/probe/instances.py: what the table renders now."""
    from matrix.image import generated

    assert generated.stale_entrypoint_table() is None, "run `invoke render --all` and commit"


def _changed_table(tmp_path, edit):
    data = yaml.safe_load(TABLE.read_text())
    edit(data)
    path = tmp_path / "instances.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_freshness_check_fails_when_the_table_changes(tmp_path):
    """A row changed in the table and not re-rendered: the committed file is stale, and the
    render writes the new figure."""
    from matrix.image import generated

    def shrink(data):
        data["instances"]["p4d.24xlarge"]["shm_mib"] = 4096
    table = _changed_table(tmp_path, shrink)
    problem = generated.stale_entrypoint_table(table=table)
    assert problem == "entrypoint/probe/instances.py (differs from what instances.yaml renders)"
    target = tmp_path / "instances.py"
    assert generated.write_entrypoint_table(target, table) is True
    assert '"p4d.24xlarge": Row(efa_rdma_read=True, gpus=8, hpus=0, efa_interfaces=4,\n' \
           '        shm_mib=4096, imex_channel=False)' in target.read_text()
    assert generated.stale_entrypoint_table(target, table) is None
    assert generated.write_entrypoint_table(target, table) is False  # fresh: left alone
    assert generated.stale_entrypoint_table(tmp_path / "none.py") == f"{tmp_path}/none.py (missing)"


def test_the_generated_table_says_what_it_is_generated_from():
    from matrix.image.render import ENTRYPOINT_TABLE

    head = ENTRYPOINT_TABLE.read_text().splitlines()[:3]
    assert head[0].startswith("# GENERATED by `invoke render` from matrix/model/instances.yaml")
    assert "matrix/image/entrypoint_instances.py.j2" in " ".join(head)


def test_lint_names_a_stale_entrypoint_table(tmp_path, monkeypatch):
    """`invoke lint`: one line naming the stale file and what to run."""
    from matrix.cli import catalog
    from matrix.errors import UserError
    from matrix.image import generated

    stale = tmp_path / "instances.py"
    stale.write_text(generated.ENTRYPOINT_TABLE.read_text().replace("shm_mib=8192", "shm_mib=1"))
    monkeypatch.setattr(generated, "ENTRYPOINT_TABLE", stale)
    with pytest.raises(UserError, match=r"instance table is stale \(.*instances.py \(differs "
                                        r"from what instances.yaml renders\)\); run `invoke "
                                        r"render --all` and commit"):
        catalog.lint(str(ROOT / "stacks.yaml"))


@pytest.mark.parametrize("name", ["g6.12xlarge", "g6.48xlarge", "g6e.12xlarge", "g6e.48xlarge",
                                  "c6i.32xlarge", "hpc6a.48xlarge", "dl1.24xlarge"])
def test_rdma_read_as_the_efa_page_lists_it(name):
    """efa.html "Supported instance types": the Nitro v4 table lists g6, g6e, c6i.32xlarge and
    hpc6a.48xlarge with RDMA read Yes; the Nitro v3 table dl1.24xlarge (issue 16 item 13)."""
    row = get_instance_type(name)
    assert row.efa_rdma_read is True and "RDMA read Yes" in row.source, row.source
    assert "RDMA read" not in (row.unverified or "") or name == "dl1.24xlarge"


@pytest.mark.parametrize(("name", "nitro"), [("p3dn.24xlarge", "Nitro v3"), ("p4d.24xlarge", "Nitro v3"),
                                             ("p5en.48xlarge", "Nitro v5"),
                                             ("p6-b200.48xlarge", "Nitro v6")])
def test_nitro_versions_as_the_efa_page_groups_them(name, nitro):
    assert f"[rdma] {nitro} table" in get_instance_type(name).source


def test_what_is_confirmed_and_what_is_not():
    """Issue 25: the EFA counts of g5.12xlarge, p4de and dl1 now rest on DescribeInstanceTypes
    or AWS's topology files. Issue 32: p5en's 16 and p6-b200's 8 rest on Karpenter's instance
    table at a named commit; p6-b300's figures on Karpenter's v1.14 table, where dl1 is gone."""
    p5en = get_instance_type("p5en.48xlarge")
    assert not p5en.unverified
    assert "2aea8194afeb77240e1948472c3fe23fc75e1778" in p5en.source
    assert "p5en.48xlarge: instance-cpu 192, instance-memory 2097152" in p5en.source
    assert "vpc.amazonaws.com/efa 16" in p5en.source and p5en.efa_interfaces == 16
    assert p5en.memory_mib == 2097152
    assert "vpc.amazonaws.com/efa 8" in get_instance_type("p6-b200.48xlarge").source
    p6_b300 = get_instance_type("p6-b300.48xlarge")
    assert "c88abbbad455186e69e30296c595e474123e9bc1" in p6_b300.source
    assert "GPU, vCPU, memory" not in p6_b300.unverified and "EFA count" not in p6_b300.unverified
    dl1 = get_instance_type("dl1.24xlarge").unverified
    assert dl1.startswith("whether dl1.24xlarge is still offered at all")
    assert "whether EFA is still offered" in dl1 and "EFA count" not in dl1
    assert not get_instance_type("g5.12xlarge").unverified
    assert not get_instance_type("p4de.24xlarge").unverified
    # p6-b200: 8 EFA devices is settled (issue 16 item 13); which uverbsN nodes they get is not
    p6 = get_instance_type("p6-b200.48xlarge")
    assert p6.efa_interfaces == 8
    assert "usable EFA devices" not in p6.unverified and "eksctl" not in p6.unverified
    assert p6.unverified.startswith("which /dev/infiniband/uverbsN nodes the 8 EFA devices get")


def test_p6_b200_efa_on_all_eight_cards_as_aws_configures_it():
    """Issue 16 item 13: the ENA-only primary card is P6-B300's (17 cards, EFA on 1 to 16), not
    P6-B200's. AWS's Batch template for p6-b200 attaches an efa interface to each of network
    cards 0 to 7 and passes uverbs0 to uverbs7; invoke jobdef passes the same eight."""
    from tests.helpers import written

    row = get_instance_type("p6-b200.48xlarge")
    assert "aws-batch-distributed-training-p6.yaml" in row.source
    assert "InterfaceType efa at device 0 of network cards 0 to 7" in row.source
    assert "8 rdmap EFA devices" in row.source  # the EFA device plugin's count
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/x@sha256:" + "a" * 64
    definition = written("jobdef", "--stack", "cuda13.2-efa", "--nodes", "2", "--instance-type",
                         "p6-b200.48xlarge", "--image-uri", image, command=["python3", "train.py"])
    (node_range,) = definition["nodeProperties"]["nodeRangeProperties"]
    devices = node_range["container"]["linuxParameters"]["devices"]
    assert [d["hostPath"] for d in devices] == [f"/dev/infiniband/uverbs{i}" for i in range(8)]


# --- issue 25: new rows and recounted EFA interfaces, each against its source's own figures ---

def _raw(name: str) -> dict:
    return yaml.safe_load(TABLE.read_text(encoding="utf-8"))["instances"][name]


# Karpenter's generated reference (EC2 DescribeInstanceTypes; [describe] in instances.yaml):
# instance-cpu, instance-memory (MiB), instance-gpu-count, instance-gpu-name,
# instance-network-bandwidth (Mbps, None where the page gives none), vpc.amazonaws.com/efa.
DESCRIBE = {
    "p3dn.24xlarge": (96, 786432, 8, "v100", 100000, 1),
    "p4d.24xlarge": (96, 1179648, 8, "a100", 400000, 4),
    "p5.48xlarge": (192, 2097152, 8, "h100", 3200000, 32),
    "g5.12xlarge": (48, 196608, 4, "a10g", 40000, 1),
    "g5.48xlarge": (192, 786432, 8, "a10g", 100000, 1),
    "g6.12xlarge": (48, 196608, 4, "l4", 40000, 1),
    "g6.48xlarge": (192, 786432, 8, "l4", 100000, 1),
    "g6e.12xlarge": (48, 393216, 4, "l40s", None, 1),
    "g6e.48xlarge": (192, 1572864, 8, "l40s", None, 4),
    "dl1.24xlarge": (96, 786432, 8, "gaudi-hl-205", 400000, 4),
}


def row_with_figures(name: str, figures: tuple) -> InstanceType:
    """The table's row ``name``, checked against a Karpenter table's figures (as DESCRIBE)."""
    cpu, memory_mib, accelerators, model, mbps, efa = figures
    row = get_instance_type(name)
    assert (row.vcpus, row.memory_mib, row.accelerators, row.efa_interfaces) == (
        cpu, memory_mib, accelerators, efa)
    assert (row.gpu_model or row.hpu_model).lower() == model.split("-")[0]
    assert mbps is None or row.network_gbps * 1000 == mbps
    return row


@pytest.mark.parametrize("name", sorted(DESCRIBE))
def test_rows_match_describe_instance_types(name):
    cpu, memory_mib, accelerators, model, mbps, efa = DESCRIBE[name]
    row = row_with_figures(name, DESCRIBE[name])
    quoted = (f"[describe] {name}: instance-cpu {cpu}, instance-memory {memory_mib}, "
              f"instance-gpu-count {accelerators}, {model}")
    assert quoted in row.source and f"vpc.amazonaws.com/efa {efa}" in row.source, row.source


# Karpenter's reference as released for v1.14 ([karpenter-v1-14]: website/content/en/v1.14/
# reference/instance-types.md at c88abbba, section "p6-b300 Family"), same fields as DESCRIBE.
KARPENTER_V1_14 = {"p6-b300.48xlarge": (192, 4194304, 8, "b300", 6400000, 16)}


@pytest.mark.parametrize("name", sorted(KARPENTER_V1_14))
def test_rows_match_karpenters_v1_14_table(name):
    cpu, memory_mib, accelerators, model, mbps, efa = KARPENTER_V1_14[name]
    row = row_with_figures(name, KARPENTER_V1_14[name])
    quoted = (f"[karpenter-v1-14] {name}: instance-cpu {cpu}, instance-memory {memory_mib}, "
              f"instance-gpu-count {accelerators}, {model}, instance-network-bandwidth {mbps}, "
              f"vpc.amazonaws.com/efa {efa}")
    assert quoted in row.source, row.source
    assert "blob/c88abbbad455186e69e30296c595e474123e9bc1/website/content/en/v1.14/" in row.source


def test_dl1_says_it_left_karpenters_table_where_users_pick_it():
    """Issue 32: Karpenter's reference lists dl1.24xlarge up to v1.13 and not in v1.14. The row
    says so in its source and its notice; `invoke stacks` (text and --json) shows the notice
    under the stack that lists dl1, and every artefact written for dl1 carries it."""
    from matrix.jobs import spec
    from matrix.jobs.request import notices_for
    from tests.test_cli import invoke

    row = get_instance_type("dl1.24xlarge")
    assert "[karpenter-v1-14] no dl1 Family" in row.source
    assert "website/content/en/v1.13/reference/instance-types.md" in row.source
    assert "since v1.14" in row.notice and "listed up to v1.13" in row.notice
    assert sorted(name for name, r in INSTANCE_TYPES.items() if r.notice) == [
        "dl1.24xlarge", "p3.16xlarge", "p6e-gb200.36xlarge"]
    # a Batch tag holds it whole (spec.BATCH_TAG_MAX)
    assert spec.batch_tags([row.notice])["mnp:notice-1"].endswith("dl1.24xlarge")

    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stacks["synapseai1.6-efa"]
    assert notices_for(stack, "dl1.24xlarge") == [row.notice]
    assert notices_for(matrix.stacks["cuda12.1-efa"], "p4d.24xlarge") == notices_for(
        matrix.stacks["cuda12.1-efa"])

    proc = invoke("stacks", "--json")
    rows = {s["name"]: s for s in json.loads(proc.stdout)["stacks"]}
    assert rows["synapseai1.6-efa"]["notices"] == [row.notice]
    assert all(not r["notices"] for name, r in rows.items()
               if not {"dl1.24xlarge", "p3.16xlarge", "p6e-gb200.36xlarge"} & set(r["instances"]))
    text = invoke("stacks", env={"COLUMNS": "100"}).stdout
    block = text.split("\nsynapseai1.6-efa:")[1].split("\n\n")[0]
    assert "notice:     dl1.24xlarge is gone from Karpenter's" in block

    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/x@sha256:" + "a" * 64
    script = invoke("sbatch", "--stack", "synapseai1.6-efa", "--nodes", "2", "--instance-type",
                    "dl1.24xlarge", "--image-uri", image, "--", "python3", "train.py")
    assert script.returncode == 0, script.stderr
    assert f"# Notice: {row.notice}\n" in script.stdout.split("\nsrun ")[0]
    told = invoke("explain", "--stack", "synapseai1.6-efa", "--nodes", "2", "--instance-type",
                  "dl1.24xlarge", "--json")
    assert row.notice in json.loads(told.stdout)["notes"], told.stdout[-2000:]


def test_p3_says_it_left_karpenters_table_where_users_pick_it():
    """Issue 44: Karpenter's reference lists p3.16xlarge up to v1.12 and not from v1.13.0 on,
    one release before dl1.24xlarge left it; cuda10.1-tcp targets it. Its row carries a notice
    like dl1's, which `invoke stacks` shows under the stacks that list it and a job carries."""
    from matrix.jobs import spec
    from matrix.jobs.request import notices_for
    from tests.test_cli import invoke

    row = get_instance_type("p3.16xlarge")
    assert "[karpenter-v1-13] no p3 Family" in row.source
    assert "instance-memory 499712" in row.source and row.memory_mib == 499712
    sources = yaml.safe_load((ROOT / "matrix/model/instances.yaml").read_text())["sources"]
    assert "blob/fe623d537f85b0e6a69fc3eebc3692f80efda891/website/content/en/v1.13/" in \
        sources["karpenter-v1-13"]
    assert "since v1.13" in row.notice and "listed up to v1.12" in row.notice
    assert spec.batch_tags([row.notice])["mnp:notice-1"].endswith("p3.16xlarge")
    matrix = load_matrix(ROOT / "stacks.yaml")
    users = [name for name, stack in matrix.stacks.items() if "p3.16xlarge" in stack.instances]
    assert "cuda10.1-tcp" in users
    for name in users:
        assert row.notice in notices_for(matrix.stacks[name], "p3.16xlarge")
        assert row.notice not in notices_for(matrix.stacks[name])
    rows = {s["name"]: s for s in json.loads(invoke("stacks", "--json").stdout)["stacks"]}
    assert row.notice in rows["cuda10.1-tcp"]["notices"]


# aws-ofi-nccl topology/p4de-24xl-topo.xml: GPU 0..7 and NIC 0..3 (vendor 0x1d0f, device 0xefa0).
P4DE_TOPOLOGY = {"gpus": 8, "efa_nics": 4}


def test_p4de_efa_count_is_aws_ofi_nccls_topology():
    row = get_instance_type("p4de.24xlarge")
    assert (row.gpus, row.efa_interfaces) == (P4DE_TOPOLOGY["gpus"], P4DE_TOPOLOGY["efa_nics"])
    assert "p4de-24xl-topo.xml" in row.source and "4 EFA NICs" in row.source


# aws/aws-parallelcluster issue 7143 (AWS's words) and queues_stack.py: 17 network cards, card 0
# ENA only, cards 1-16 EFA and ENA.
P6_B300_CARDS = {"network_cards": 17, "ena_only": (0,), "efa": tuple(range(1, 17))}


def test_p6_b300_has_16_efa_interfaces_on_17_cards():
    row = get_instance_type("p6-b300.48xlarge")
    assert (row.gpus, row.gpu_model) == (8, "B300")
    assert row.efa_interfaces == len(P6_B300_CARDS["efa"]) == 16
    assert _raw("p6-b300.48xlarge")["network_cards"] == P6_B300_CARDS["network_cards"]
    assert row.efa_rdma_read and row.slots_per_node() == 8
    assert "17 network cards; card 0 ENA only, cards 1 to 16 EFA" in row.source
    assert "aws-parallelcluster/issues/7143" in row.source and "NCI-0 does NOT support" in row.source
    assert row.unverified.startswith("the Nitro generation, on which RDMA read rests")


def test_network_cards_bound_the_efa_interfaces():
    """One EFA per network card: a row with more EFAs than cards is wrong; P6-B300 is the one
    row whose card 0 carries ENA only; P6e-GB200 (17 cards) is given 4 EFA-only interfaces, one
    per GPU's NCI group (efa-acc-inst-types.html "EFA configuration for P6e-GB200 instances")."""
    carded = {name: _raw(name)["network_cards"] for name in INSTANCE_TYPES
              if "network_cards" in _raw(name)}
    assert {"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
            "p6-b200.48xlarge", "p6-b300.48xlarge", "g6e.48xlarge", "dl1.24xlarge"} <= set(carded)
    short = {name for name, cards in carded.items()
             if INSTANCE_TYPES[name].efa_interfaces < cards}
    assert all(INSTANCE_TYPES[name].efa_interfaces <= cards for name, cards in carded.items())
    assert short == {"p6-b300.48xlarge", "p6e-gb200.36xlarge"}


def test_a_zero_card_count_is_a_table_error(tmp_path):
    def edit(data):
        data["instances"]["p6-b300.48xlarge"]["network_cards"] = 0
    message = _table_error(tmp_path, edit)
    assert "instances.yaml:" in message and "network_cards" in message
