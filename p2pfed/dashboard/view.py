"""What the dashboard page draws, as one JSON-ready dict, from a live mesh's statuses or a run folder's records.

    {"source": "...", "live": bool, "methods": {METHOD: {
        "members": [{"name", "role", "state", "round", "age"}],   # nodes (and a coordinator) of that method
        "chosen": {node: [peers]},                              # each node's chosen peers
        "dropped": {node: [peers]},                             # peers a node dropped from its choice
        "groups": {node: group},                                # discovered groups (mutual choices, or the
                                                                #   coordinator's grouping); -1: none yet
        "curves": {node: {"rounds": [], "accuracy": [], "loss": []}},   # loss null where not known
        "scores": {node: {peer: score}}}}}                      # the influence matrix, row scores column

A live mesh runs one method; a run folder holds one per method folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from p2pfed.influence.selection import mutual_clusters
from p2pfed.net.progress import Progress
from p2pfed.report.records import read_records, record_files
from p2pfed.report.results import CHOICE


def method_view(members: list[dict[str, Any]], chosen: Mapping[str, list[str]],
                curves: Mapping[str, dict[str, list[Any]]], scores: Mapping[str, Mapping[str, float]],
                assignment: Mapping[str, int] | None = None, dropped: Mapping[str, list[str]] | None = None
                ) -> dict[str, Any]:
    """One method's part of the view; groups from the coordinator's assignment, else from mutual choices."""
    groups = {n: int(g) for n, g in assignment.items()} if assignment else (
        mutual_clusters({n: list(c) for n, c in chosen.items()}) if chosen else {})
    return {"members": sorted(members, key=lambda m: (m["role"] != "coordinator", m["name"])),
            "chosen": {n: sorted(c) for n, c in sorted(chosen.items())}, "groups": groups,
            "dropped": {n: sorted(d) for n, d in sorted((dropped or {}).items()) if d},
            "curves": dict(sorted(curves.items())), "scores": {n: dict(s) for n, s in sorted(scores.items())}}


def live_view(source: str, peers: Iterable[Mapping[str, Any]], learning: Mapping[str, Mapping[str, Any]]
              ) -> dict[str, Any]:
    """The view of a live mesh: peers as a status lists them (the answering member included), and the
    LEARNING part of each learning member's own status, by name (checked by the wire schema on arrival)."""
    members = [{"name": p["name"], "role": p["role"], "state": p["state"], "round": p["round"],
                "age": round(float(p["age"]), 1)} for p in peers if p["role"] != "bootstrap"]
    return {"source": source, "live": True, "methods": methods_of(members, learning)}


def methods_of(members: list[dict[str, Any]], learning: Mapping[str, Mapping[str, Any]],
               method: str | None = None, trusted: bool = False) -> dict[str, dict[str, Any]]:
    """Members grouped by the method their LEARNING names (all under method when given), each group's view
    drawn from what they tell. Unless trusted (this machine's own run folder), only members listed are drawn,
    whatever names a member mentions."""
    listed = {m["name"] for m in members}

    def known(name: str) -> bool:
        return trusted or name in listed

    by_method: dict[str, dict[str, Any]] = {}
    for member in members:
        info = learning.get(member["name"], {})
        part = by_method.setdefault(method or info.get("method") or "(not learning yet)",
                                    {"members": [], "chosen": {}, "curves": {}, "scores": {}, "assignment": {},
                                     "dropped": {}})
        part["members"].append(member)
        if not info:
            continue
        if member["role"] == "coordinator":
            part["assignment"].update((n, g) for n, g in zip(info["names"], info["groups"], strict=False)
                                      if known(n))
            continue
        part["chosen"][member["name"]] = [p for p in info["chosen"] if known(p)]
        part["dropped"][member["name"]] = [p for p in info.get("dropped", []) if known(p)]
        part["curves"][member["name"]] = {"rounds": list(info["rounds"]), "accuracy": list(info["accuracy"]),
                                          "loss": [None if x < 0 else x for x in info["loss"]]}
        if info["names"] and not info["groups"]:
            part["scores"][member["name"]] = {n: v for n, v in zip(info["names"], info["values"], strict=False)
                                              if known(n)}
    return {m: method_view(p["members"], p["chosen"], p["curves"], p["scores"], p["assignment"] or None,
                           p["dropped"]) for m, p in sorted(by_method.items())}


def run_view(run_dir: Path) -> dict[str, Any]:
    """The view of a finished (or running) run folder: every method folder's records, read as its members
    would have told them live (net/progress.py), so both views mean the same."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    folders = sorted(p for p in run_dir.iterdir() if p.is_dir() and record_files(p))
    if not folders and record_files(run_dir):
        folders = [run_dir]  # a node's own folder (p2pfed node --out), or one method's
    if not folders:
        raise FileNotFoundError(f"{run_dir} holds no records (*.jsonl, *.jsonl.gz): not a run folder or a node's "
                                "folder")
    finished = {}
    if (run_dir / "summary.json").exists():
        finished = json.loads((run_dir / "summary.json").read_text()).get("methods", {})
    methods: dict[str, dict[str, Any]] = {}
    for folder in folders:
        crashed = finished.get(folder.name, {}).get("crashed", {})
        methods.update(methods_of(*_told(read_records(folder), crashed), method=folder.name, trusted=True))
    return {"source": str(run_dir), "live": False, "methods": methods}


def _told(records: list[dict[str, Any]], crashed: Mapping[str, str]
          ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The members of a method's records and what each would have told in its status at the end."""
    last: dict[str, dict[str, Any]] = {}
    progress: dict[str, Progress] = {}
    assignment: dict[str, int] = {}
    for r in records:
        node = r["node"]
        last[node] = r
        if node == "coordinator":
            if isinstance(r.get("assignment"), dict):
                assignment = {n: int(g) for n, g in r["assignment"].items()}
            continue
        event = "choice" if r["event"] in CHOICE else r["event"]
        progress.setdefault(node, Progress(keep=None)).note(event, r["round"], r, r.get("method"))
    if "coordinator" in last:
        progress["coordinator"] = Progress(groups=lambda: assignment)
    members = [{"name": node, "role": "coordinator" if node == "coordinator" else "node", "round": r["round"],
                "state": "crashed" if node in crashed else "finished" if r["event"] == "final" else "stopped",
                "age": None} for node, r in last.items()]
    return members, {node: p.body() for node, p in progress.items()}
