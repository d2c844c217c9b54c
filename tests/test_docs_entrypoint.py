"""docs/entrypoint.md says what the entrypoint's code does (issue 16: the doc had drifted).

Each test reads one clearly delimited part of the doc (a table by its header row, a list by the
name of the tuple it copies) and compares it with the code it describes, so a row added to the
code without the doc, or a doc line the code no longer backs, fails here.
"""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from entrypoint.core import errors
from entrypoint.core.errors import StartupError
from entrypoint.launchers import base
from entrypoint.plan import envtable
from entrypoint.plan import make as plan
from entrypoint.probe import fabric, preflight
from entrypoint.probe.facts import NodeFacts
from entrypoint.run import main
from entrypoint.settings import config

DOC = Path(__file__).resolve().parent.parent / "docs" / "entrypoint.md"
TICKED = re.compile(r"`([^`]+)`")


def doc_text():
    return DOC.read_text(encoding="utf-8")


def table(header, text=None):
    """The rows of the Markdown table whose header row is ``header``, as lists of cells."""
    lines = (doc_text() if text is None else text).splitlines()
    assert lines.count(header) == 1, f"docs/entrypoint.md has no single table headed {header!r}"
    start = lines.index(header) + 2  # the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    assert rows, header
    return rows


def ticked(cell):
    return TICKED.findall(cell)


# -- the env table (entrypoint/plan/envtable.py) ------------------------------------------------------

ENV_HEADER = "| setting | value | when | source |"


def doc_env_pairs(text=None):
    """``{(setting, value)}`` of the doc's env table; a row may list several settings with their
    values in the same order (`A`, `B` | `1`, `2`)."""
    pairs = set()
    for row in table(ENV_HEADER, text):
        names, values = ticked(row[0]), ticked(row[1])
        assert names and len(names) == len(values), row
        pairs.update(zip(names, values))
    return pairs


def code_env_pairs():
    return {(row.setting, row.value.replace("{interface}", "<if>")) for row in envtable.ROWS}


def test_the_env_table_lists_every_row_of_the_code_and_no_other():
    assert doc_env_pairs() == code_env_pairs()


def test_the_nccl_net_pin_for_each_plugin_version_is_in_the_doc():
    pairs = doc_env_pairs()
    assert {("NCCL_NET", "Libfabric"), ("NCCL_NET", "AWS Libfabric")} <= pairs


def test_the_env_table_check_fails_when_a_row_is_missing():
    """The comparison can fail: the doc without its NCCL_NET Libfabric row does not match."""
    broken = "\n".join(line for line in doc_text().splitlines()
                       if not line.startswith("| `NCCL_NET` | `Libfabric` |"))
    assert doc_env_pairs(broken) != code_env_pairs()


# -- RDMA read families (entrypoint/probe/fabric.py) ---------------------------------------------------


def listed_after(marker, text=None):
    """The backticked names right after ``marker``, up to the end of the list."""
    text = doc_text() if text is None else text
    found = re.search(re.escape(marker) + r"\s*((?:`[a-z0-9-]+`(?:,\s*)?)+)", text)
    assert found, f"docs/entrypoint.md has no list after {marker!r}"
    return set(ticked(found.group(1)))


RDMA_MARKER = "(`RDMA_FAMILIES`):"
NO_RDMA_MARKER = "without it are of these families:"


def test_rdma_families_in_the_doc_are_the_codes():
    assert listed_after(RDMA_MARKER) == set(fabric.RDMA_FAMILIES)


def test_families_without_rdma_read_are_the_instance_tables():
    without = {name.split(".", 1)[0] for name, rdma in fabric.INSTANCE_RDMA_READ.items()
               if not rdma}
    assert listed_after(NO_RDMA_MARKER) == without
    assert not without & set(fabric.RDMA_FAMILIES)


def test_the_rdma_check_fails_on_an_old_list():
    """The list the doc had before (dl1 out, no c6i/g6/g6e/hpc6a) does not match."""
    old = "families have it (`RDMA_FAMILIES`): `p4d`, `p4de`, `p5`, `p5e`, `p5en`, `trn1`.\n"
    assert listed_after(RDMA_MARKER, old) != set(fabric.RDMA_FAMILIES)


# -- settings (entrypoint/settings/config.py) -------------------------------------------------------------

SETTINGS_HEADER = "| setting | default | meaning |"


README = DOC.parent.parent / "README.md"


def test_the_settings_table_is_the_configs_settings_with_their_defaults():
    """The table of the settings names every setting of ``config.TABLE`` once, with the default
    the code uses (the README links it rather than keeping a copy)."""
    rows = table(SETTINGS_HEADER, DOC.read_text(encoding="utf-8"))
    names = [ticked(row[0])[0] for row in rows]
    assert len(names) == len(set(names)), names
    assert set(names) == set(config.SETTINGS), set(names) ^ set(config.SETTINGS)
    for row, name in zip(rows, names):
        assert row[1].replace("`", "") == config.SETTINGS[name][0], (name, row[1])


def test_the_readmes_entrypoint_section_names_only_settings_the_code_has():
    """The README names the settings most jobs set and links the doc's table: each name it gives
    is a setting, and the default it gives for ``MNP_LAUNCHER`` is the code's."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## The entrypoint\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(MNP_[A-Z_]+)", section))
    assert named and named <= set(config.SETTINGS), named - set(config.SETTINGS)
    assert "(docs/entrypoint.md#settings)" in section
    assert "`MNP_LAUNCHER` (`{}` by default".format(config.SETTINGS["MNP_LAUNCHER"][0]) in section


def test_each_settings_default_is_what_load_gives_an_empty_environment():
    """The default the tables show is the value a node without the variable gets: the table's
    default is the only place it is written (``Config()`` and ``load`` both read it)."""
    loaded = config.load({})
    for setting in config.TABLE:
        if setting.field:
            assert getattr(loaded, setting.field) == config._fresh(setting.default), setting.name
            assert getattr(config.Config(), setting.field) == config._fresh(setting.default)
            if setting.default not in (None, (), False):
                assert setting.shown == config._shown(setting.default), setting.name


def test_every_setting_the_config_accepts_loads_and_is_in_the_table():
    """A name outside the table is refused by the config (issue 16 item 4), and every name in it
    is accepted, so the table is exactly what a user may set."""
    for name in config.SETTINGS:
        if name in ("MNP_SECRET", "MNP_SECRET_FILE"):
            continue  # a value needs a file or a secret; the names are checked above
        config.load({name: ""})
    with pytest.raises(config.ConfigError):
        config.load({"MNP_NOT_A_SETTING": "1"})


# -- names not forwarded to other nodes (entrypoint/launchers/base.py) ---------------------------

FORWARD_HEADER = "| names | why |"


def test_every_node_specific_name_is_in_the_doc():
    patterns = [name for row in table(FORWARD_HEADER) for name in ticked(row[0])]

    def covered(name):
        return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in patterns)

    for name in base.NODE_SPECIFIC:
        assert covered(name), name
    for prefix in base.node_specific_prefixes():
        assert prefix + "*" in patterns, prefix


# -- the EFA preflight (entrypoint/probe/preflight.py) -------------------------------------------------


def flat(text):
    """The text with its line breaks and runs of blanks as single spaces (the doc is wrapped)."""
    return re.sub(r"\s+", " ", text)


def preflight_plan():
    """A single-node EFA plan, as the dry run would print it (no GPU: the provider check only)."""
    facts = NodeFacts(address="10.0.0.5", interface="eth0", address_reason="test",
                      efa_devices=["uverbs0"], fi_info_efa=True, binaries={})
    return plan.make_plan(config.load({"MNP_FABRIC": "efa"}), facts, ["python3", "train.py"],
                          {"PATH": "/bin"})


def test_the_preflight_section_quotes_the_codes_words():
    text = flat(doc_text())
    assert "## EFA preflight" in text
    # the dry run's plan line
    lines = [line for line in preflight_plan().text().splitlines() if line.startswith("preflight")]
    assert len(lines) == 1, lines
    assert f"`{lines[0].split(': ', 1)[0]}: ...`" in text, lines[0]
    # the real run's one error line, and the failure of a node without any plugin
    no_plugin = {"kind": "plugin", "check": "an aws-ofi-nccl plugin is installed", "argv": None}
    stub = SimpleNamespace(plan=SimpleNamespace(preflight=[no_plugin], environment={}))
    with pytest.raises(StartupError) as info:
        main.Runner.check_preflight(stub)
    prefix, missing = str(info.value).split(": ", 1)
    assert f"error: {prefix}: fi_info -p efa -t FI_EP_RDM finds no efa provider (exit 1: " in text
    assert f"`{missing}`" in text, missing
    assert f"within {preflight.TIMEOUT:g} s" in text
    # the failure-class table names the preflight under infrastructure (test_ep_preflight runs
    # it); a node without any plugin is a configuration failure (StartupError)
    assert info.value.exit_code == errors.CONFIGURATION_EXIT
    row = [r for r in table(CLASSES_HEADER) if r[0] == errors.INFRASTRUCTURE]
    assert len(row) == 1 and "the EFA preflight failed" in row[0][2]


# -- the failure classes (entrypoint/core/errors.py) ---------------------------------------------

CLASSES_HEADER = "| class | exit code | when | retried |"


def test_the_failure_class_table_is_the_codes():
    rows = table(CLASSES_HEADER)
    assert [r[0] for r in rows] == [c["class"] for c in errors.CLASSES]
    for row, cls in zip(rows, errors.CLASSES):
        assert row[1] == cls["code"], row
        assert row[2] == cls["when"], row
        assert row[3] == ("yes" if cls["retried"] else "no"), row
    assert str(errors.INFRASTRUCTURE_EXIT) in [r[1] for r in rows]


def test_the_failure_class_check_fails_on_an_old_table():
    old = doc_text().replace("| infrastructure | 200 |", "| infrastructure | 1 |")
    with pytest.raises(AssertionError):
        assert [r[1] for r in table(CLASSES_HEADER, old)] == [c["code"] for c in errors.CLASSES]
