"""The metrics files of a run folder: one JSON object per line, one file per member (``<name>.jsonl``, or
``<name>.jsonl.gz`` in a run folder shipped with its results: ``p2pfed report RUN --ship DEST``).

Writing opens, appends and closes per record: a record is on disk as soon as it is written (a member that
crashes loses nothing recorded), and records come a few per round, so the open costs nothing that shows.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any


def append_record(path: Path, event: str, node: str, method: str | None, rnd: int, **fields: Any) -> None:
    """Append one record (event, node, method, round, time, then the fields) to a member's metrics file."""
    line = {"event": event, "node": node, "method": method, "round": rnd, "time": time.time(), **fields}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def read_json(path: Path) -> Any:
    """A run folder's JSON file (partition.json, run.json); ValueError naming it if it is damaged."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc}): a damaged or cut-short copy of the run folder?") from None


def record_files(method_dir: Path) -> list[Path]:
    """A method folder's metrics files, by member name (written ones and shipped, compressed ones)."""
    return sorted([*method_dir.glob("*.jsonl"), *method_dir.glob("*.jsonl.gz")], key=lambda p: p.name)


def read_records(method_dir: Path, containing: str = "") -> list[dict[str, Any]]:
    """Every JSONL record of a method's nodes (a torn last line of a crashed node is skipped); with containing,
    only the lines that hold that text are parsed (e.g. '"final"': the rest of a large run's lines are skipped)."""
    return [record for path in record_files(method_dir) for record in read_record_file(path, containing)]


def read_record_file(path: Path, containing: str = "") -> list[dict[str, Any]]:
    """The JSONL records of one node's file (gzipped or not), as read_records reads each."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    records = []
    for line in text.splitlines():
        if containing not in line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
