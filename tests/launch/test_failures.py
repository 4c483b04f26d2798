"""What a run says of members that did not do their part: which never joined, which did not finish, why, in one
line per method."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import zmq

from p2pfed.launch.failures import failure_lines, failure_reason, last_words, unfinished
from p2pfed.report.records import append_record
from p2pfed.report.results import failed_members


def test_members_without_a_final_record_never_joined_or_did_not_finish(tmp_path: Path) -> None:
    append_record(tmp_path / "n00.jsonl", "round", "n00", "m", 0)
    append_record(tmp_path / "n00.jsonl", "final", "n00", "m", 3)
    append_record(tmp_path / "n01.jsonl", "round", "n01", "m", 2)
    with (tmp_path / "n01.jsonl").open("a") as f:
        f.write('{"event": "rou')  # a line cut short by a crash
    asked: list[str] = []

    def why(name: str) -> str | None:
        asked.append(name)
        return "no answer from tcp://10.0.0.1:9" if name == "n02" else None

    found = unfinished(tmp_path, ["n00", "n01", "n02", "n03"], joined={"n00", "n01", "n03"}, why=why)
    assert asked == ["n01", "n02", "n03"]  # a member that finished costs no look at its logs
    assert found == {"n01": "did not finish (its last record: round 2)",
                     "n02": "never joined the mesh: no answer from tcp://10.0.0.1:9",
                     "n03": "did not finish (stopped before its first round)"}


def test_one_line_per_method_counts_each_kind_and_gives_the_first_reason(tmp_path: Path) -> None:
    runs = {"ok": {"crashed": {}, "members": 4},
            "broken": {"members": 250, "crashed": {
                **{f"n{i:03d}": "never joined the mesh: hello not acknowledged" for i in range(3)},
                "n100": "did not finish (its last record: round 7)"}},
            "crashing": {"members": 4, "crashed": {"n01": "did not finish (its last record: round 1)",
                                                   "n02": "RuntimeError('boom')"}}}
    for method, run in runs.items():
        (tmp_path / method).mkdir()
        (tmp_path / method / "run.json").write_text(json.dumps(run))
    lines = failure_lines(tmp_path, " seed 3")
    assert len(lines) == 2
    assert lines[0].startswith("broken seed 3: 3 of 250 nodes never joined the mesh, 1 of 250 nodes did not "
                               "finish; n000: never joined the mesh: hello not acknowledged (logs: ")
    assert lines[1].startswith("crashing seed 3: 1 of 4 nodes did not finish, 1 of 4 members crashed; "
                               "n02: RuntimeError('boom')")  # a crash says most of why


def test_a_reason_is_one_line_of_bounded_length_and_out_of_files_says_what_helps(tmp_path: Path) -> None:
    assert failure_reason(ConnectionError("no\nanswer " + "x" * 1000), 3, 10).startswith("no answer x")
    assert len(failure_reason(ConnectionError("x" * 1000), 3, 10)) == 300
    quoted = ConnectionError("n09 could not join mesh 'm': hello to tcp://127.0.0.1:5 failed: Too many open files")
    for exc in (zmq.ZMQError(errno.EMFILE), OSError(errno.EMFILE, "Too many open files"), quoted):
        reason = failure_reason(exc, 80, 250)
        assert reason.startswith("too many open files") and "80 of 250 nodes" in reason
        assert "scenario.workers" in reason and "ulimit -n" in reason


def test_a_child_process_last_words_are_its_error_line_or_its_traceback_end(tmp_path: Path) -> None:
    log = tmp_path / "n00.log"
    assert last_words(log) is None and last_words(None) is None
    log.write_text("12:00 INFO joined\nTraceback (most recent call last):\n  File x\n"
                   "zmq.error.ZMQError: Too many open files\nTask was destroyed but it is pending!\n")
    assert last_words(log) == "zmq.error.ZMQError: Too many open files"
    log.write_text(log.read_text() + "p2pfed: n00 could not join mesh 'm': no answer\n"
                   "p2pfed: WARNING: --insecure: plain TCP\n")  # a warning is not why it ended
    assert last_words(log) == "n00 could not join mesh 'm': no answer"


def test_the_report_names_a_few_failed_members_not_all_of_them() -> None:
    crashed = {f"n{i:03d}": "never joined the mesh" for i in range(250)}
    line = failed_members(crashed)
    assert line.count("never joined") == 3 and line.endswith("and 247 more (run.json)")
    assert failed_members({"n00": "boom"}) == "members that failed: n00: boom"
