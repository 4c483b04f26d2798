"""A run whose nodes never joined, never finished or ran out of open files fails loudly: a non-zero exit and one
line saying why, after the report of what did run (not an empty table and exit 0, not a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from p2pfed import cli
from p2pfed.launch import runner

SCENARIO = """
[scenario]
name = "test-failure"
seed = 0
nodes = {nodes}
rounds = 3
methods = ["local-p2p"]
workers = {workers}

[data]
dataset = "digits"
partition.kind = "pathological"
partition.clusters = 2

[train]
model = "logreg"
round_timeout = 10

[mesh]
heartbeat = 0.3
join_give_up = 1.0
"""

NOBODY = "tcp://127.0.0.1:9"  # the discard port: nothing answers a hello there


def write(tmp_path: Path, nodes: int, workers: int) -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.format(nodes=nodes, workers=workers))
    return path


# the nodes in this process, or in two worker processes (each starts a Python with torch: slow on 2 cores)
@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_run_whose_nodes_never_joined_exits_non_zero_with_one_line_saying_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], workers: int) -> None:
    monkeypatch.setattr(runner.InProcessMesh, "entry", lambda self, via=-1: NOBODY)
    monkeypatch.setattr(runner.ProcessMesh, "entry", lambda self, via=-1: NOBODY)
    monkeypatch.setattr(runner, "log_to_run_folder", lambda out: None)  # no handler left on this process's log
    out = tmp_path / "run"
    code = cli.main(["run", str(write(tmp_path, nodes=4, workers=workers)), "--out", str(out), "-q"])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.startswith("p2pfed: local-p2p")]
    assert len(lines) == 1 and "never joined the mesh" in lines[0] and "Traceback" not in err, err
    assert str(out) in lines[0]  # where to look
    # the run folder still holds what the runner saw, and a resumed run over seeds would run it again
    run = json.loads((out / "local-p2p" / "run.json").read_text())
    assert set(run["crashed"]) >= {"n00"}


@pytest.mark.slow  # a p2pfed run of its own, in a shell with a low limit
def test_a_run_out_of_open_files_names_the_limit_and_the_setting_that_helps(tmp_path: Path) -> None:
    path = write(tmp_path, nodes=40, workers=1)
    out = tmp_path / "run"
    command = f'ulimit -n 256 && exec "{sys.executable}" -m p2pfed run {path} --out {out} -q'
    res = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=240)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if line.startswith("p2pfed: local-p2p")]
    assert len(lines) == 1, res.stderr[-3000:]
    assert "too many open files" in lines[0] and "may open 256" in lines[0], lines
    assert "scenario.workers" in lines[0] and "ulimit -n" in lines[0], lines
    assert "dropping peer" not in res.stderr, res.stderr[-3000:]  # out of files is not the peers' fault
