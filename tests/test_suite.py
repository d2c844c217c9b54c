"""``invoke check``'s shards: together they run every collected test once, and the closing
line sums what each shard's pytest reported."""

from __future__ import annotations

import subprocess
import sys

from matrix.cli import suite
from matrix.model.settings import ROOT


def collected(*args: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    return {line for line in proc.stdout.splitlines() if "::" in line}


def test_the_shards_cover_the_suite_once():
    everything = collected()
    parts = [collected(*shard.args) for shard in suite.shards()]
    assert everything and all(parts)
    assert sum(len(part) for part in parts) == len(everything)
    assert set.union(*parts) == everything


def test_the_closing_line_sums_every_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "LOG_DIR", tmp_path)
    parts = [suite.Shard("a", []), suite.Shard("b", [])]
    parts[0].log.write_text("...\n= 1 failed, 30 passed, 2 skipped in 9.00s =\n")
    parts[1].log.write_text("x\n===== 12 passed, 1 error in 3.1s =====\n")
    assert suite.summed(parts) == "42 passed, 1 failed, 2 skipped, 1 errors"
