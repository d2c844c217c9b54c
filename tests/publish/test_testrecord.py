"""Test records: which exact image IDs passed."""

from __future__ import annotations

import json

import pytest

from matrix.errors import UserError
from matrix.image.testrecord import has_passed, read_record, record_pass

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
        json.dumps({"image_id": OTHER, "stack": "x", "passed_at": "now"})
    )
    assert not has_passed(IMAGE, tmp_path)


@pytest.mark.parametrize("bad", ["", "abc", "sha256:xyz", "sha256:" + "A" * 64, "../etc/passwd"])
def test_bad_image_ids_are_refused(tmp_path, bad):
    with pytest.raises(UserError, match="image ID"):
        record_pass(bad, "cpu-tcp", tmp_path)
