"""A run folder shipped with its results: the report redrawn from what was kept is the run's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2pfed.cli import main
from p2pfed.report.records import append_record, read_records
from p2pfed.report.results import write_report
from p2pfed.report.ship import ship_run

NODES = ["n00", "n01", "n02", "n03"]
PARTITION = {"nodes": NODES, "true_cluster": [0, 0, 1, 1], "adversaries": {}}


def a_run(folder: Path) -> Path:
    """A run folder of two methods, four nodes each, with what a run leaves that the report does not read."""
    folder.mkdir(parents=True)
    (folder / "partition.json").write_text(json.dumps(PARTITION))
    (folder / "scenario.toml").write_text('[scenario]\nname = "x"\n')
    (folder / "run.log").write_text("a log\n")
    chosen = {"n00": ["n01"], "n01": ["n00"], "n02": ["n03"], "n03": ["n02"]}
    for m, method in enumerate(["choosing", "plain"]):
        (folder / method).mkdir()
        (folder / method / "run.json").write_text(json.dumps({"seconds": 12.5 + m}))
        for i, n in enumerate(NODES):
            path = folder / method / f"{n}.jsonl"
            for rnd in range(3):
                append_record(path, "round", n, method, rnd, accuracy=0.5 + rnd / 10 + i / 100, bytes_sent=100)
            if method == "choosing":
                append_record(path, "choice", n, method, 2, chosen=chosen[n], scores={chosen[n][0]: 1.0})
                append_record(path, "scores", n, method, 2, peers=NODES, values=[0.1, 0.2, -0.1, 0.0])
            append_record(path, "final", n, method, 3, accuracy=0.8 + i / 100, macro_f1=0.7, bytes_sent=300)
            (folder / method / f"{n}.safetensors").write_bytes(b"\0" * 4096)
    return folder


def test_a_shipped_run_keeps_what_its_report_reads_compressed_and_redraws_the_same_report(tmp_path: Path) -> None:
    run = a_run(tmp_path / "run")
    shipped = ship_run(run, tmp_path / "shipped")
    assert shipped == write_report(run) and shipped["methods"]["choosing"]["ari"] == 1.0
    kept = sorted(str(p.relative_to(tmp_path / "shipped")) for p in (tmp_path / "shipped").rglob("*"))
    assert "choosing/n00.jsonl.gz" in kept and "plain/run.json" in kept and "scenario.toml" in kept
    assert not [p for p in kept if p.endswith((".safetensors", ".log", ".jsonl"))], kept
    assert "influence-choosing.png" in kept and "results.md" in kept  # the report, redrawn there
    assert read_records(tmp_path / "shipped" / "plain") == read_records(run / "plain")
    # the redrawn summary is the run's own, byte for byte; a re-ship of the same run is the same bytes
    assert (tmp_path / "shipped" / "summary.json").read_text() == (run / "summary.json").read_text()
    again = ship_run(run, tmp_path / "again")
    assert again == shipped
    assert ((tmp_path / "again" / "plain" / "n01.jsonl.gz").read_bytes()
            == (tmp_path / "shipped" / "plain" / "n01.jsonl.gz").read_bytes())


def test_ship_refuses_a_folder_that_is_not_a_run_and_a_destination_that_holds_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        ship_run(tmp_path, tmp_path / "out")
    run = a_run(tmp_path / "run")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        ship_run(run, tmp_path / "full")


def test_report_ship_on_the_command_line_and_the_report_of_the_shipped_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = a_run(tmp_path / "run")
    assert main(["report", str(run), "--ship", str(tmp_path / "shipped")]) == 0
    out = capsys.readouterr().out
    assert "choosing" in out and f"shipped to {tmp_path / 'shipped'}" in out
    assert main(["report", str(tmp_path / "shipped")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == out.splitlines()[0]  # the same table
    assert main(["report", str(run), "--ship", str(tmp_path / "shipped")]) == 2  # not empty: refused, one line
    assert "not empty" in capsys.readouterr().err


def test_a_damaged_partition_file_is_named_in_the_one_line_a_user_gets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = a_run(tmp_path / "run")
    (run / "partition.json").write_text('{"nodes":')  # cut short, as a copy interrupted
    assert main(["report", str(run), "--ship", str(tmp_path / "shipped")]) == 2
    assert main(["report", str(run)]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all(f"{run / 'partition.json'}: not JSON" in e for e in errors), errors
