"""benchmarks/phase_counts.py counts an influence phase from the lines pFedLIA-p2p logs, and --append adds a run's
column to a file whose earlier runs' folders are gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "phase_counts.py"
# The lines as p2pfed/methods/pfedlia/p2p.py logs them (sample_phase, and the wait of fetch_partials).
LOG = """\
2026-11-29 14:00:01 INFO p2pfed.methods: n001: waited 300 s for partial models of peers behind round 5 (2 of 3 came)
2026-11-29 14:00:02 INFO p2pfed.methods: n001: lazy influence of 2 of 3 sampled peers; chose 1: n007
2026-11-29 14:00:03 INFO p2pfed.methods: n002: lazy influence of 0 of 4 sampled peers; chose 0:
2026-11-29 14:00:04 INFO p2pfed.methods: n003: waited 900 s for partial models of peers behind round 5 (0 of 0 came)
2026-11-29 14:00:05 INFO p2pfed.methods: n003: lazy influence of 0 of 0 sampled peers; chose 0:
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "run" / "pfedlia-p2p").mkdir(parents=True)
    (tmp_path / "run" / "pfedlia-p2p" / "0-group.log").write_text(LOG)
    return tmp_path / "run"


def test_counts_the_phase_and_appends_a_column(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "phase.json"
    assert run("--run", f"old={folder}", "--json", str(out)).returncode == 0
    assert run("--run", f"new={folder}", "--json", str(out), "--append").returncode == 0
    figures = json.loads(out.read_text())
    assert [r["code"] for r in figures["rows"]] == ["old", "new"]
    assert figures["rows"][1] == {"code": "new", "nodes": 3, "sample_mean": 7 / 3, "drew_none": 1,
                                  "scored_mean": 2 / 3, "scored_none": 2, "chose_none": 2, "waited": 2,
                                  "waited_median_s": 600, "waited_max_s": 900}
    assert figures["command"] == ("python3 benchmarks/phase_counts.py --run old=DIR; then "
                                  "python3 benchmarks/phase_counts.py --run new=DIR --append")


def test_refuses_what_it_cannot_count(folder: Path, tmp_path: Path) -> None:
    missing = run("--run", f"new={folder}", "--json", str(tmp_path / "none.json"), "--append")
    assert missing.returncode != 0 and "--append needs --json naming a file that exists" in missing.stderr
    assert "want CODE=RUN_FOLDER" in run("--run", str(folder)).stderr
    (tmp_path / "other.json").write_text('{"rows": 3}')
    assert "not a file phase_counts.py wrote" in run("--run", f"x={folder}", "--json", str(tmp_path / "other.json"),
                                                     "--append").stderr
    (tmp_path / "empty" / "pfedlia-p2p").mkdir(parents=True)
    assert "no node's influence phase" in run("--run", f"x={tmp_path / 'empty'}").stderr
