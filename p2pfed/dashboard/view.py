"""What the dashboard page draws, as one JSON-ready dict, from a live mesh's statuses or a run folder's records.

    {"source": "...", "live": bool, "methods": {METHOD: {
        "members": [{"name", "role", "state", "round", "age"}],   # nodes (and a coordinator) of that method
        "chosen": {node: [peers]},                              # each node's chosen peers
        "groups": {node: group},                                # discovered groups (mutual choices, or the
                                                                #   coordinator's grouping); -1: none yet
        "curves": {node: {"rounds": [], "accuracy": [], "loss": []}},   # loss null where not known
        "scores": {node: {peer: score}}}}}                      # the influence matrix, row scores column

A live mesh runs one method; a run folder holds one per method folder.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from p2pfed.influence.selection import mutual_clusters
from p2pfed.report.records import read_records

CHOICE = ("choice", "lia")  # the records of a node's choice of peers ("lia": runs made before "choice")


def method_view(members: list[dict[str, Any]], chosen: Mapping[str, list[str]],
                curves: Mapping[str, dict[str, list[Any]]], scores: Mapping[str, Mapping[str, float]],
                assignment: Mapping[str, int] | None = None) -> dict[str, Any]:
    """One method's part of the view; groups from the coordinator's assignment, else from mutual choices."""
    groups = {n: int(g) for n, g in assignment.items()} if assignment else (
        mutual_clusters({n: list(c) for n, c in chosen.items()}) if chosen else {})
    return {"members": sorted(members, key=lambda m: (m["role"] != "coordinator", m["name"])),
            "chosen": {n: sorted(c) for n, c in sorted(chosen.items())}, "groups": groups,
            "curves": dict(sorted(curves.items())), "scores": {n: dict(s) for n, s in sorted(scores.items())}}


def live_view(source: str, peers: Iterable[Mapping[str, Any]], learning: Mapping[str, Mapping[str, Any]]
              ) -> dict[str, Any]:
    """The view of a live mesh: peers as a status lists them (the answering member included), and the
    LEARNING part of each learning member's own status, by name (checked by the wire schema on arrival)."""
    members = [{"name": p["name"], "role": p["role"], "state": p["state"], "round": p["round"],
                "age": round(float(p["age"]), 1)} for p in peers if p["role"] != "bootstrap"]
    known = {m["name"] for m in members}  # a member may name anyone: only members the mesh knows are drawn
    by_method: dict[str, dict[str, Any]] = {}
    for member in members:
        info = learning.get(member["name"], {})
        method = info.get("method") or "(not learning yet)"
        part = by_method.setdefault(method, {"members": [], "chosen": {}, "curves": {}, "scores": {},
                                             "assignment": {}})
        part["members"].append(member)
        if not info:
            continue
        if member["role"] == "coordinator":
            part["assignment"].update((n, g) for n, g in zip(info["names"], info["groups"], strict=False)
                                      if n in known)
            continue
        part["chosen"][member["name"]] = [p for p in info["chosen"] if p in known]
        part["curves"][member["name"]] = {"rounds": list(info["rounds"]), "accuracy": list(info["accuracy"]),
                                          "loss": [None if x < 0 else x for x in info["loss"]]}
        if info["names"] and not info["groups"]:
            part["scores"][member["name"]] = {n: v for n, v in zip(info["names"], info["values"], strict=False)
                                              if n in known}
    return {"source": source, "live": True, "methods": {
        m: method_view(p["members"], p["chosen"], p["curves"], p["scores"], p["assignment"] or None)
        for m, p in sorted(by_method.items())}}


def run_view(run_dir: Path) -> dict[str, Any]:
    """The view of a finished (or running) run folder: every method folder's records."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    folders = sorted(p for p in run_dir.iterdir() if p.is_dir() and any(p.glob("*.jsonl")))
    if not folders and any(run_dir.glob("*.jsonl")):
        folders = [run_dir]  # a node's own folder (p2pfed node --out), or one method's
    if not folders:
        raise FileNotFoundError(f"{run_dir} holds no records (*.jsonl): not a run folder or a node's folder")
    finished = {}
    if (run_dir / "summary.json").exists():
        finished = json.loads((run_dir / "summary.json").read_text()).get("methods", {})
    methods = {}
    for folder in folders:
        records = read_records(folder)
        methods[folder.name] = _method_from_records(records, crashed=finished.get(folder.name, {}).get("crashed", {}))
    return {"source": str(run_dir), "live": False, "methods": methods}


def _method_from_records(records: list[dict[str, Any]], crashed: Mapping[str, str]) -> dict[str, Any]:
    last: dict[str, dict[str, Any]] = {}
    chosen: dict[str, list[str]] = {}
    curves: dict[str, dict[str, list[Any]]] = {}
    scores: dict[str, dict[str, float]] = {}
    assignment: dict[str, int] = {}
    for r in records:
        node = r["node"]
        last[node] = r
        if r["event"] in CHOICE or (r["event"] == "final" and "chosen" in r):
            chosen[node] = list(r["chosen"])
        if r["event"] in CHOICE and isinstance(r.get("scores"), dict):
            scores[node] = {p: v for p, v in r["scores"].items() if _finite(v)}
        if r["event"] == "scores":
            scores[node] = {p: v for p, v in zip(r["peers"], r["values"], strict=True) if _finite(v)}
        if node == "coordinator" and isinstance(r.get("assignment"), dict):
            assignment = {n: int(g) for n, g in r["assignment"].items()}
        if r["event"] in ("round", "final") and _finite(r.get("accuracy")) and node != "coordinator":
            curve = curves.setdefault(node, {"rounds": [], "accuracy": [], "loss": []})
            if curve["rounds"] and curve["rounds"][-1] == r["round"]:
                for key in curve:
                    curve[key].pop()
            curve["rounds"].append(r["round"])
            curve["accuracy"].append(r["accuracy"])
            curve["loss"].append(r["loss"] if _finite(r.get("loss")) else None)
    members = []
    for node, r in last.items():
        state = "crashed" if node in crashed else "finished" if r["event"] == "final" else "stopped"
        members.append({"name": node, "role": "coordinator" if node == "coordinator" else "node", "state": state,
                        "round": r["round"], "age": None})
    return method_view(members, chosen, curves, scores, assignment or None)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
