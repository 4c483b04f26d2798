"""A run repeated over seeds (``p2pfed run --seeds``): one run folder per seed (``seed-S/``), and over them a
summary.json, a results.md table of mean ± standard deviation per method, and accuracy.png with each
method's mean per round and its spread, as paper 002 reports ("we run each simulation 4 times, and we report
average values and standard deviations").

summary.json of a seeds folder::

    {"seeds": [0, 1, ...], "methods": {"<method>": {"<metric>": {"mean": float, "sd": float | null,
                                                                 "values": [float per seed]}, ...}}}

for each metric of a seed's summary.json that is a number (accuracy, micro_accuracy, bottom5_accuracy,
macro_f1, loss, perplexity, ari, nmi, bytes_sent, seconds). sd is the sample standard deviation (n − 1 in the
denominator: the seeds are a sample of the runs one could make; paper 002 does not say which it used), null
with one seed. A method counts only the seeds that ran it to the end (its run.json is written); the table
says how many.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from p2pfed.report.records import read_records
from p2pfed.report.results import write_report

METRICS = ("accuracy", "micro_accuracy", "bottom5_accuracy", "macro_f1", "loss", "perplexity", "ari", "nmi",
           "bytes_sent", "seconds")


def seed_folder(run_dir: Path, seed: int) -> Path:
    """The run folder of one seed."""
    return run_dir / f"seed-{seed}"


def seed_folders(run_dir: Path) -> dict[int, Path]:
    """The seeds' run folders under run_dir (those with a partition: a seed that started), by seed."""
    found = {}
    for p in run_dir.glob("seed-*"):
        suffix = p.name.removeprefix("seed-")
        if p.is_dir() and suffix.lstrip("-").isdigit() and (p / "partition.json").exists():
            found[int(suffix)] = p
    return dict(sorted(found.items()))


def is_seeds_folder(run_dir: Path) -> bool:
    """True for the folder of a run over seeds (seed-S/ run folders, no partition of its own)."""
    return not (run_dir / "partition.json").exists() and bool(seed_folders(run_dir))


def complete_methods(folder: Path) -> set[str]:
    """The methods a seed's folder ran to the end (the runner writes run.json when a method ends)."""
    return {p.parent.name for p in folder.glob("*/run.json")}


def aggregate(summaries: dict[int, dict[str, Any]], complete: dict[int, set[str]]) -> dict[str, Any]:
    """Mean, standard deviation and per-seed values of every metric of every method, over the seeds that
    completed it."""
    methods: dict[str, dict[str, Any]] = {}
    names = sorted({m for s in summaries.values() for m in s["methods"]})
    for name in names:
        seeds = [s for s in summaries if name in summaries[s]["methods"] and name in complete.get(s, set())]
        entry: dict[str, Any] = {"seeds": seeds}
        for metric in METRICS:
            values = [summaries[s]["methods"][name].get(metric) for s in seeds]
            values = [float(v) for v in values if isinstance(v, int | float) and not math.isnan(v)]
            if values:
                entry[metric] = {"mean": float(np.mean(values)),
                                 "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
                                 "values": values}
        methods[name] = entry
    return {"seeds": sorted(summaries), "methods": methods}


def write_seeds_report(run_dir: Path) -> dict[str, Any]:
    """Write every seed's report, then the seeds folder's summary.json, results.md and accuracy.png."""
    folders = seed_folders(run_dir)
    if not folders:
        raise FileNotFoundError(f"{run_dir} holds no seed-S run folders")
    summaries = {s: write_report(f) for s, f in folders.items()}
    summary = aggregate(summaries, {s: complete_methods(f) for s, f in folders.items()})
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (run_dir / "results.md").write_text(seeds_table(summary, fmt="github") + "\n")
    plot_seeds(run_dir, folders)
    return summary


def seeds_table(summary: dict[str, Any], fmt: str = "simple") -> str:
    """One row per method: mean ± sd over the seeds of the accuracies, F1, loss (text) and ARI."""
    def cell(m: dict[str, Any], key: str, scale: float, digits: int) -> str:
        if key not in m:
            return "–"
        mean, sd = m[key]["mean"], m[key]["sd"]
        return f"{scale * mean:.{digits}f}" + ("" if sd is None else f" ± {scale * sd:.{digits}f}")

    text = any("perplexity" in m for m in summary["methods"].values())
    rows = []
    order = sorted(summary["methods"].items(), key=lambda kv: -kv[1].get("accuracy", {"mean": 0})["mean"])
    for name, m in order:
        row = [name, cell(m, "accuracy", 100, 2), cell(m, "micro_accuracy", 100, 2),
               cell(m, "bottom5_accuracy", 100, 2), cell(m, "macro_f1", 100, 2)]
        if text:
            row += [cell(m, "loss", 1, 3), cell(m, "perplexity", 1, 2)]
        rows.append([*row, cell(m, "ari", 1, 3), len(m["seeds"])])
    headers = ["method", "accuracy %", "micro acc %", "bottom-5% acc %", "macro-F1 %",
               *(["test loss", "perplexity"] if text else []), "ARI", "seeds"]
    seeds = ", ".join(map(str, summary["seeds"]))
    title = f"mean ± standard deviation over seeds {seeds}\n" + ("\n" if fmt == "github" else "")
    return title + tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def plot_seeds(run_dir: Path, folders: dict[int, Path]) -> None:
    """accuracy.png: per method, the mean over seeds of the nodes' mean test accuracy per round, with a band
    of ± one standard deviation across seeds (rounds some seed did not evaluate are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list[dict[int, float]]] = {}
    for folder in folders.values():
        for m in sorted(p for p in folder.iterdir() if p.is_dir() and any(p.glob("*.jsonl"))):
            by_round: dict[int, list[float]] = {}
            for r in read_records(m):
                if r["event"] == "round" and "accuracy" in r and not math.isnan(r["accuracy"]):
                    by_round.setdefault(r["round"], []).append(r["accuracy"])
            if by_round:
                curves.setdefault(m.name, []).append({x: float(np.mean(v)) for x, v in by_round.items()})
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, runs in sorted(curves.items()):
        xs = sorted(set.intersection(*(set(c) for c in runs)))
        if not xs:
            continue
        values = np.array([[c[x] for x in xs] for c in runs]) * 100
        mean = values.mean(axis=0)
        (line,) = ax.plot(xs, mean, label=f"{name} ({len(runs)})", marker="o", markersize=2)
        if len(runs) > 1:
            sd = values.std(axis=0, ddof=1)
            ax.fill_between(xs, mean - sd, mean + sd, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("round")
    ax.set_ylabel("mean personalised test accuracy (%)")
    ax.set_title(f"{run_dir.name}: mean over seeds (band: ± one standard deviation)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, title="method (seeds)", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir / "accuracy.png", dpi=120)
    plt.close(fig)
