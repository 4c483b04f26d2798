"""benchmarks/beat.py times a member's heartbeat periods against its table's size, this code beside another tree's,
and writes what docs/performance.md's table is drawn from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools.docs_tables import beat_table

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "beat.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_times_the_period_for_each_size_and_tree_and_draws_its_table(tmp_path: Path) -> None:
    out = tmp_path / "beat.json"
    done = run("--sizes", "5,30", "--periods", "3", "--rounds", "1", "--before", str(ROOT), "--json", str(out))
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert [(r["code"], r["peers"]) for r in figures["rows"]] == [("this", 5), ("before", 5), ("this", 30),
                                                                  ("before", 30)]
    assert all(r["beat_us"] > 0 and r["pass_us"] > 0 for r in figures["rows"])
    table = beat_table(figures).splitlines()
    assert len(table) == 2 + 4 and table[2].startswith("| 5 | this |") and table[3].endswith(" |")
    assert "30 peers: this / before = " in done.stdout


def test_refuses_a_table_larger_than_a_member_holds() -> None:
    done = run("--sizes", "2000", "--periods", "1", "--rounds", "1")
    assert done.returncode != 0 and "at most max_peers" in done.stderr
    assert "whole numbers" in run("--sizes", "abc").stderr
    assert "a checkout of p2pfed" in run("--before", "/nonexistent").stderr
