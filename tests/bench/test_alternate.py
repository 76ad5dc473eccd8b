"""bench/alternate.py times two versions of the code side by side: run against the same
revision, it reports one row per input with equal samples/s, and leaves no worktree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no revision to "
                    "compare with")
def test_the_same_revision_plans_the_same_and_leaves_no_worktree() -> None:
    before = _worktrees()
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "alternate.py"), "--before", "HEAD",
         "--bases", "l40sx16-a40x8-v32x16-t4x8-gpt2.7b", "--size", "48", "--rounds", "2"],
        capture_output=True, text=True, timeout=600, check=True)
    (row,) = [line for line in out.stdout.splitlines() if line.startswith("| l40sx16")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    rates_before, rates_after = cells[4].split(" / ")
    assert rates_before == rates_after  # the same code plans the same
    assert "/" not in rates_before and float(rates_before) > 0  # and every round alike
    assert float(cells[1]) > 0 and float(cells[2]) > 0
    assert _worktrees() == before
