"""What a run tells when its members did not do their part: which never joined the mesh, which did not finish,
and why, in one line per method, so that a run that ran nothing ends non-zero instead of printing an empty
table; and the open-files limit, which a scenario of many nodes in one process meets first.

A method's run.json keeps, under "crashed", every member that crashed, never joined or did not finish, each with
its reason (a resumed run over seeds runs such a method again), and under "members" how many were to finish.
"""

from __future__ import annotations

import json
import re
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2pfed.net.transport import out_of_files

NEVER_JOINED = "never joined the mesh"
NOT_FINISHED = "did not finish"
REASON_CHARS = 300  # a reason quoted from elsewhere (an exception, a child's last words) can be long
LINE_REASON_CHARS = 600  # a reason in a method's line: room for the open-files help around a quoted one


def open_files_help(started: int, nodes: int) -> str:
    """The line for a run that ran out of open files: the limit, and the settings that help."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (f"too many open files: a process may open {soft} (ulimit -n) and {started} of {nodes} nodes had "
            "started, each with a connection to each peer: spread the nodes over more processes "
            "(--set scenario.workers=4 or more) or raise the limit (ulimit -n 65536; the hard limit, ulimit -Hn, "
            "caps it)")


def failure_reason(exc: BaseException, started: int, nodes: int) -> str:
    """One line for an exception that stopped a member from starting."""
    if out_of_files(exc):
        return open_files_help(started, nodes)
    return cut(str(exc) or type(exc).__name__)


def cut(text: str, limit: int = REASON_CHARS) -> str:
    """text on one line, at most limit characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def last_words(log_path: Path | None) -> str | None:
    """What a child process said last before it ended: its 'p2pfed: ...' line (the command line's one-line
    error), else the last line of a traceback; None if it said neither."""
    if log_path is None or not log_path.exists():
        return None
    said = None
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("p2pfed: WARNING"):  # a warning at its start (--insecure), not why it ended
            continue
        if line.startswith("p2pfed: "):
            said = line.removeprefix("p2pfed: ")
        elif re.match(r"^[\w.]*(Error|Exception)\b", line):
            said = line
    return cut(said) if said else None


def progress_of(records_file: Path) -> tuple[bool, int | None]:
    """Whether a member's metrics file has its final record, and its last round (None without a record)."""
    if not records_file.exists():
        return False, None
    final, last = False, None
    for line in records_file.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
        final = final or record.get("event") == "final"
        if isinstance(record.get("round"), int):
            last = record["round"]
    return final, last


def unfinished(out: Path, members: list[str], joined: set[str], why: Callable[[str], str | None]
               ) -> dict[str, str]:
    """The members among those that were to finish that have no final record, each with its reason: it never
    joined the mesh, or joined and did not finish (before its first round, or its last round), and why where
    that is known (why(name), asked of those alone)."""
    found = {}
    for name in members:
        final, last = progress_of(out / f"{name}.jsonl")
        if final:
            continue
        if last is None:
            what = f"{NOT_FINISHED} (stopped before its first round)" if name in joined else NEVER_JOINED
        else:
            what = f"{NOT_FINISHED} (its last record: round {last})"
        known = why(name)
        found[name] = f"{what}: {known}" if known else what
    return found


def failure_lines(folder: Path, label: str = "", methods: list[str] | None = None) -> list[str]:
    """One line per method of a run folder (of those named, by default all) whose members did not all do their
    part: how many never joined, did not finish or crashed, and the first one's reason, with where the logs
    are."""
    lines = []
    for path in sorted(folder.glob("*/run.json")):
        if methods is not None and path.parent.name not in methods:
            continue
        try:
            run: dict[str, Any] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        crashed: dict[str, str] = run.get("crashed") or {}
        if not crashed:
            continue
        never = [n for n, r in crashed.items() if r.startswith(NEVER_JOINED)]
        stopped = [n for n, r in crashed.items() if r.startswith(NOT_FINISHED)]
        other = [n for n in crashed if n not in never and n not in stopped]
        members = int(run.get("members") or len(crashed))
        parts = [f"{len(names)} of {members} {what}" for names, what in
                 [(never, f"nodes {NEVER_JOINED}"), (stopped, f"nodes {NOT_FINISHED}"), (other, "members crashed")]
                 if names]
        first = (other or never or stopped)[0]  # a crash says most; then a failed join
        why = cut(crashed[first], LINE_REASON_CHARS)
        lines.append(f"{path.parent.name}{label}: {', '.join(parts)}; {first}: {why} "
                     f"(logs: {path.parent} and {folder / 'run.log'})")
    return lines
