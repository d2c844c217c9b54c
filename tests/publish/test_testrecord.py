"""Test records: which exact image IDs passed."""

from __future__ import annotations

import json

import pytest

from matrix.errors import UserError
from matrix.image.testrecord import (
    has_passed,
    read_record,
    record_failure,
    record_pass,
    record_start,
)

IMAGE = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def test_record_then_query(tmp_path):
    assert not has_passed(IMAGE, tmp_path)
    record_pass(IMAGE, "cpu-tcp", tmp_path / "nested")
    assert has_passed(IMAGE, tmp_path / "nested")
    assert not has_passed(OTHER, tmp_path / "nested")
    record = read_record(IMAGE, tmp_path / "nested")
    assert record.stack == "cpu-tcp" and record.image_id == IMAGE
    assert [path.name for path in (tmp_path / "nested").iterdir()] == [f"{'ab' * 32}.json"]


def test_unreadable_or_mismatched_records_do_not_count(tmp_path):
    (tmp_path / f"{'ab' * 32}.json").write_text("{not json")
    assert not has_passed(IMAGE, tmp_path)
    (tmp_path / f"{'ab' * 32}.json").write_text(
        json.dumps({"image_id": OTHER, "stack": "x", "result": "passed", "at": "now"})
    )
    assert not has_passed(IMAGE, tmp_path)
    (tmp_path / f"{'ab' * 32}.json").write_text(
        json.dumps({"image_id": IMAGE, "stack": "x", "result": "maybe", "at": "now"})
    )
    assert not has_passed(IMAGE, tmp_path)


def test_the_latest_run_decides(tmp_path):
    """A pass counts only until the next run of the same image starts or fails."""
    record_pass(IMAGE, "cpu-tcp", tmp_path)
    record_start(IMAGE, "cpu-tcp", tmp_path)
    assert not has_passed(IMAGE, tmp_path)  # an interrupted run withdraws the pass
    record_pass(IMAGE, "cpu-tcp", tmp_path)
    assert has_passed(IMAGE, tmp_path)
    record_failure(IMAGE, "cpu-tcp", tmp_path)
    assert not has_passed(IMAGE, tmp_path)
    assert read_record(IMAGE, tmp_path).result == "failed"


def test_a_record_from_before_runs_were_kept_reads_as_a_pass(tmp_path):
    (tmp_path / f"{'ab' * 32}.json").write_text(
        json.dumps({"image_id": IMAGE, "stack": "x", "passed_at": "2026-01-01T00:00:00+00:00"})
    )
    assert has_passed(IMAGE, tmp_path)


def test_a_file_where_the_record_folder_goes_is_one_line(tmp_path):
    (tmp_path / "test-results").write_text("x")
    with pytest.raises(UserError, match=r"cannot write test records to .*test-results"):
        record_start(IMAGE, "cpu-tcp", tmp_path / "test-results")


@pytest.mark.parametrize("bad", ["", "abc", "sha256:xyz", "sha256:" + "A" * 64, "../etc/passwd"])
def test_bad_image_ids_are_refused(tmp_path, bad):
    with pytest.raises(UserError, match="image ID"):
        record_pass(bad, "cpu-tcp", tmp_path)
