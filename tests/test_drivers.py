"""Issue 33: the driver floors as data (matrix/model/drivers.yaml), what `invoke stacks` says of
them, and the entrypoint's copy held equal to the table."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
import yaml

from entrypoint.probe import driver as ep_driver
from matrix.errors import UserError
from matrix.model import drivers
from matrix.model.loader import load_matrix
from matrix.model.settings import ROOT
from tests.test_cli import invoke

CUDA_STACKS = {"cuda10.1-efa": "418.39", "cuda10.1-tcp": "418.39", "cuda11.7-efa": "450.80.02",
               "cuda12.1-efa": "525.60.13", "cuda13.2-tcp": "580", "cuda13.2-efa": "580",
               "cuda13.2-efa1.51": "580", "cuda13.2-tcp-arm64": "580",
               "cuda13.2-efa-arm64": "580"}


def matrix():
    return load_matrix(ROOT / "stacks.yaml")


def test_every_cuda_stack_has_a_floor_with_its_source_and_others_none():
    for name, stack in matrix().stacks.items():
        floor = drivers.driver_floor(stack)
        if name not in CUDA_STACKS:
            assert floor is None, name
            continue
        assert floor.minimum == CUDA_STACKS[name], name
        line = floor.line()
        assert line.startswith(f"NVIDIA driver >= {floor.minimum} for CUDA ") and "https://" in line
        assert len(floor.short()) <= 256 and floor.short().startswith("NVIDIA driver >= ")


def test_the_job_writers_forms_fit_their_formats():
    """A Batch tag value allows only some characters and 256 of them; a Slurm comment is lines
    starting with #; the Kubernetes annotation carries the whole line."""
    for name in CUDA_STACKS:
        floor = drivers.driver_floor(matrix().stacks[name])
        value = floor.tag_value()
        assert drivers.TAG_VALUE_RE.match(value), value
        assert value.startswith(f"{floor.minimum} for CUDA ") and "https://docs.nvidia.com/" in value
        lines = floor.comment_lines()
        assert all(line.startswith("# ") for line in lines)
        assert " ".join(line[2:] for line in lines) == floor.line()
    assert not drivers.TAG_VALUE_RE.match("NVIDIA driver >= 580 (CUDA 13.2)")


def test_the_floors_say_how_and_forward_compatibility_only_where_it_can_matter():
    stacks = matrix().stacks
    old = drivers.driver_floor(stacks["cuda10.1-tcp"])
    assert not old.minor_compat and "no minor-version compatibility before CUDA 11" in old.line()
    assert old.toolkit == "418.87.00"
    p4d = drivers.driver_floor(stacks["cuda11.7-efa"])
    assert p4d.toolkit == "515.65.01" and "forward compatibility" not in p4d.line()
    new = drivers.driver_floor(stacks["cuda13.2-tcp"])
    today = date.today().isoformat()
    assert "forward-compatibility.html" in new.line()
    assert f"below it no forward compatibility on {today}" in new.line() or \
        f"not past their end of life on {today}" in new.line()  # the branches of this day


def test_explains_note_says_which_branches_qualify_on_the_day():
    """Issue 44: forward compatibility only from an LTSB or Production branch not past its end
    of life; every branch NVIDIA still supports on 2026-11-29 (R580, R595, R620) meets CUDA 13's
    floor, so none is offered then; before R570's end of life R570 and R535 were."""
    data = drivers.load_drivers()
    late = drivers.forward_compat_text(data, "580", date(2026, 11, 29))
    assert late.startswith("; below it no forward compatibility on 2026-11-29: ")
    assert "R570 (Production Branch, end of life February 2026), R535 (Long Term Support " \
           "Branch, end of life June 2026), do not qualify" in late
    assert "every branch that does (R620, R595, R580) meets it" in late
    early = drivers.forward_compat_text(data, "580", date(2026, 1, 15))
    assert "a host driver of branch R570 or R535 (the branches below it not past their end of " \
           "life on 2026-01-15)" in early
    assert drivers.forward_compat_text(data, "525.60.13", date(2026, 1, 15)) == ""


def test_every_branch_of_nvidias_support_matrix_with_its_end_of_life():
    """The 620 edition of NVIDIA's data center support matrix (Table 2): R580 LTSB to June 2028
    (not August, as the R580 edition had it), R595 Production Branch to March 2027, R620 LTSB to
    September 2029; the branches earlier editions listed keep their dates and editions."""
    data = drivers.load_drivers()
    branches = {name: (b["designation"], b["end_of_life"]) for name, b in data["branches"].items()}
    assert {name: branches[name] for name in ("580", "595", "620")} == {
        "580": ("Long Term Support Branch", "2028-06"), "595": ("Production Branch", "2027-03"),
        "620": ("Long Term Support Branch", "2029-09")}
    assert branches["535"] == ("Long Term Support Branch", "2026-06")
    assert branches["570"] == ("Production Branch", "2026-02")
    assert "/drivers/620/supported-drivers-and-cuda-toolkit-versions.html" in \
        data["branches_source"]
    assert all("edition" in b["source"] for b in data["branches"].values())


def test_a_cuda_release_without_an_entry_takes_its_family_or_is_an_error(tmp_path):
    assert drivers.floor_for("12.4.1").minimum == "525.60.13"
    assert drivers.floor_for("9.2.148") is None
    data = yaml.safe_load((ROOT / "matrix/model/drivers.yaml").read_text())
    del data["cuda"]["10.1"]
    table = tmp_path / "drivers.yaml"
    table.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=r'no driver floor for CUDA 10.1.243 \(stack cuda10.1-tcp\)'):
        drivers.driver_floor(matrix().stacks["cuda10.1-tcp"], table)


def test_the_schema_refuses_a_floor_without_a_source(tmp_path):
    data = yaml.safe_load((ROOT / "matrix/model/drivers.yaml").read_text())
    del data["cuda"]["13.2"]["source"]
    table = tmp_path / "drivers.yaml"
    table.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match="source"):
        drivers.load_drivers(table)


def test_the_entrypoints_copy_is_the_tables():
    """The entrypoint runs without ``matrix``: its floors, compat branches and folders are the
    table's (a floor changed on one side only fails here)."""
    data = drivers.load_drivers()
    for cuda, entry in data["cuda"].items():
        assert ep_driver.floor(cuda)[0] == entry["minimum"], cuda
        assert entry["source"].split()[0] in ep_driver.floor(cuda)[1] or \
            data["families"].get(cuda.split(".")[0], {}).get("source", "x").split()[0] in \
            ep_driver.floor(cuda)[1], cuda
    for major, family in data["families"].items():
        assert ep_driver.floor(f"{major}.99")[0] == family["minimum"], major
    fc = data["forward_compatibility"]
    assert {name: (b["designation"], b["end_of_life"]) for name, b in data["branches"].items()} \
        == ep_driver.BRANCHES
    assert tuple(fc["designations"]) == ep_driver.COMPAT_DESIGNATIONS
    assert tuple(fc["dirs"]) == ep_driver.COMPAT_DIRS
    matrix_url = next(w for w in data["branches_source"].split() if w.startswith("https://"))
    assert ep_driver.BRANCHES_SOURCE.startswith(matrix_url)
    for day in (date(2026, 1, 15), date(2026, 11, 29), date(2027, 4, 1), date(2029, 10, 1)):
        assert drivers.qualifying_branches(data, day) == ep_driver.qualifying_branches(day)
    assert fc["gpus_source"].split()[0] in ep_driver.COMPAT_SOURCE


def test_the_equality_check_fails_on_a_changed_floor(monkeypatch):
    monkeypatch.setitem(ep_driver.FLOORS, "13", ("575", ep_driver.FLOORS["13"][1]))
    with pytest.raises(AssertionError):
        test_the_entrypoints_copy_is_the_tables()


def test_invoke_stacks_names_each_cuda_stacks_floor_in_text_and_json():
    proc = invoke("stacks", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {s["name"]: s for s in json.loads(proc.stdout)["stacks"]}
    for name, minimum in CUDA_STACKS.items():
        assert rows[name]["driver"]["minimum"] == minimum, name
        assert "https://docs.nvidia.com/" in rows[name]["driver"]["line"], name
    assert rows["cpu-tcp"]["driver"] is None
    text = invoke("stacks", env={"COLUMNS": "100"}).stdout
    block = text.split("\ncuda13.2-tcp:")[1].split("\n\n")[0]
    assert "driver:     NVIDIA driver >= 580 for CUDA 13.2.86" in block


def test_the_readme_names_the_amis_driver_branches():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## NVIDIA drivers and AMIs")[1].split("\n## ")[0]
    for floor in ("418.39", "450.80.02", "525.60.13", "580"):
        assert floor in section
    assert "github.com/aws/amazon-ecs-ami" in section and "amazon-eks-ami" in section
    assert Path("matrix/model/drivers.yaml").as_posix() in section


def test_a_writer_holding_only_the_name_gets_the_same_floor():
    assert drivers.floor_named("cuda12.1-efa") == drivers.driver_floor(
        matrix().stacks["cuda12.1-efa"])
    assert drivers.floor_named("cpu-tcp") is None
    with pytest.raises(UserError):
        drivers.floor_named("no-such-stack")


def test_invoke_explain_names_every_cuda_stacks_floor_with_its_source():
    """Before submit (issue 33): the plan invoke explain prints for every CUDA stack carries the
    stack's minimum driver and its source; a stack without CUDA carries none."""
    from matrix.jobs import explain

    matrix = load_matrix(ROOT / "stacks.yaml")
    seen = 0
    for name, stack in matrix.stacks.items():
        floor = drivers.driver_floor(stack)
        itype = next((i for i in stack.instances), None)
        if itype is None:
            continue
        try:
            shown = explain.explain(matrix, name, itype, 2).text()
        except UserError:
            continue  # a stack the rules refuse there: invoke explain says so instead
        if floor is None:
            assert "NVIDIA driver >=" not in shown, name
            continue
        seen += 1
        assert f"NVIDIA driver >= {floor.minimum}" in shown and floor.source in shown, name
    assert seen >= 4


def test_the_equality_check_fails_on_a_changed_end_of_life(monkeypatch):
    monkeypatch.setitem(ep_driver.BRANCHES, "580", ("Long Term Support Branch", "2028-08"))
    with pytest.raises(AssertionError):
        test_the_entrypoints_copy_is_the_tables()
