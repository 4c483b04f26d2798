"""A run repeated over seeds (``p2pfed run --seeds``): one run folder per seed (``seed-S/``), and over them a
summary.json, a results.md table of mean ± standard deviation per method, and accuracy.png with each method's
mean per round and its spread, as Rokvic et al. 2025 report ("we run each simulation 4 times, and we report
average values and standard deviations").

summary.json of a seeds folder::

    {"seeds": [0, 1, ...],
     "methods": {"<method>": {"seeds": [seeds that ran it to its end], "nodes_finished": int, "nodes": int,
                              "crashed": {"<seed>": {"<node>": "<error>"}},
                              "<metric>": {"mean": float, "sd": float | null, "values": [float | null]}, ...}}}

for each metric of a seed's summary.json that is a number (accuracy, micro_accuracy, bottom5_accuracy,
server_test_accuracy, macro_f1, loss, perplexity, ari, first_choice_ari, nmi, own_cluster_peers, bytes_sent,
seconds); values are in
the order of the method's seeds (null where a seed has no value, e.g. no ARI), mean and sd over the known ones. sd
is the sample standard deviation (n − 1 in the denominator: the seeds are a sample of the runs one could make;
Rokvic et al. 2025 do not say which they used), null with one value. A method counts only the seeds that ran it to
its end (its run.json is written; a method cut short by Ctrl-C has none), and nodes_finished / nodes shows whether
every node of those runs finished. The report covers every seed-S folder of the run folder, and refuses folders
that hold runs of different settings (the seed aside).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from p2pfed.methods.former import FORMER
from p2pfed.report.records import read_json, read_records
from p2pfed.report.results import failed_members, line_style, write_report
from p2pfed.scenario.config import Scenario, load_scenario

METRICS = ("accuracy", "micro_accuracy", "bottom5_accuracy", "worst5_accuracy", "best5_rounds_micro_accuracy",
           "server_test_accuracy", "macro_f1", "loss", "perplexity", "ari", "first_choice_ari", "nmi",
           "own_cluster_peers", "bytes_sent", "seconds")


def seed_folder(run_dir: Path, seed: int) -> Path:
    """The run folder of one seed."""
    return run_dir / f"seed-{seed}"


def seed_dirs(run_dir: Path) -> dict[int, Path]:
    """Every seed-S folder under run_dir, started or not, by seed."""
    found = {}
    for p in run_dir.glob("seed-*"):
        suffix = p.name.removeprefix("seed-")
        if p.is_dir() and suffix.isdigit():
            found[int(suffix)] = p
    return dict(sorted(found.items()))


def seed_folders(run_dir: Path) -> dict[int, Path]:
    """The seeds' run folders under run_dir that started (they hold a partition), by seed."""
    return {s: p for s, p in seed_dirs(run_dir).items() if (p / "partition.json").exists()}


def is_seeds_folder(run_dir: Path) -> bool:
    """True for the folder of a run over seeds (seed-S/ run folders, no partition of its own)."""
    return not (run_dir / "partition.json").exists() and bool(seed_dirs(run_dir))


def ended_methods(folder: Path) -> dict[str, dict[str, Any]]:
    """The methods a seed's folder ran to their end, with what the runner saw (run.json: seconds, crashed
    nodes, events); the runner writes run.json when a method ends, and removes it when the method starts."""
    return {p.parent.name: read_json(p) for p in sorted(folder.glob("*/run.json"))}


def complete_methods(folder: Path) -> set[str]:
    """The methods a seed's folder holds to their end with no node crashed: a resumed run skips these."""
    return {name for name, run in ended_methods(folder).items() if not run.get("crashed")}


def aggregate(summaries: dict[int, dict[str, Any]], ended: dict[int, set[str]]) -> dict[str, Any]:
    """Per method: the seeds that ran it to its end, and for every metric the mean and sample standard
    deviation over them and the value of each (null where a seed has none), in the order of seeds."""
    methods: dict[str, dict[str, Any]] = {}
    names = sorted({m for s in summaries.values() for m in s["methods"]})
    for name in names:
        seeds = [s for s in summaries if name in summaries[s]["methods"] and name in ended.get(s, set())]
        runs = [summaries[s]["methods"][name] for s in seeds]
        entry: dict[str, Any] = {"seeds": seeds, "nodes_finished": sum(int(r.get("nodes_finished", 0)) for r in runs),
                                 "nodes": sum(int(r.get("nodes", 0)) for r in runs),
                                 "crashed": {str(s): r["crashed"] for s, r in zip(seeds, runs, strict=True)
                                             if r.get("crashed")}}
        for metric in METRICS:
            values = [_number(r.get(metric)) for r in runs]
            known = [v for v in values if v is not None]
            if known:
                entry[metric] = {"mean": float(np.mean(known)),
                                 "sd": float(np.std(known, ddof=1)) if len(known) > 1 else None,
                                 "values": values}
        methods[name] = entry
    return {"seeds": sorted(summaries), "methods": methods}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def other_settings(run_dir: Path, scenario: Scenario | None = None) -> tuple[Path, list[str]] | None:
    """The first seed folder whose run has other settings (the seed aside) than scenario, or than the first
    seed folder's run, with the settings that differ; None when they all hold one experiment."""
    folders = [p for p in seed_dirs(run_dir).values() if (p / "scenario.toml").exists()]
    for folder in folders:
        theirs = load_scenario(folder / "scenario.toml", former=FORMER)
        if scenario is None:
            scenario = theirs
        elif differ := scenario.differs_from(theirs, "seed"):
            return folder, differ
    return None


def check_same_settings(run_dir: Path) -> None:
    """Raise ValueError if the seeds' folders hold runs of different settings (the seed aside): their mean
    would mix two experiments."""
    if found := other_settings(run_dir):
        folder, differ = found
        raise ValueError(f"{folder} holds a run of other settings than the seeds before it ({', '.join(differ)} "
                         "differ): a report over them would mix two experiments")


def write_seeds_report(run_dir: Path) -> dict[str, Any]:
    """Write every seed's report, then the seeds folder's summary.json, results.md and accuracy.png."""
    folders = seed_folders(run_dir)
    if not folders:
        raise FileNotFoundError(f"{run_dir} holds no seed-S run folders")
    check_same_settings(run_dir)
    summaries = {s: write_report(f) for s, f in folders.items()}
    ended = {s: set(ended_methods(f)) for s, f in folders.items()}
    summary = aggregate(summaries, ended)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (run_dir / "results.md").write_text(seeds_table(summary, fmt="github") + "\n")
    plot_seeds(run_dir, folders, ended)
    return summary


def mean_sd(value: dict[str, Any], scale: float = 1.0, digits: int = 2) -> str:
    """A metric over seeds ({"mean", "sd"}) as "mean ± sd", scaled (100: in %); the mean alone with one seed."""
    mean, sd = value["mean"], value["sd"]
    return f"{scale * mean:.{digits}f}" + ("" if sd is None else f" ± {scale * sd:.{digits}f}")


def seeds_table(summary: dict[str, Any], fmt: str = "simple") -> str:
    """One row per method: mean ± sd over the seeds of the accuracies, F1, loss (text), ARI and the share of
    chosen peers in the node's own cluster."""
    def cell(m: dict[str, Any], key: str, scale: float, digits: int) -> str:
        return mean_sd(m[key], scale, digits) if key in m else "–"

    text = any("perplexity" in m for m in summary["methods"].values())
    served = any("server_test_accuracy" in m for m in summary["methods"].values())
    rows = []
    order = sorted(summary["methods"].items(), key=lambda kv: -kv[1].get("accuracy", {"mean": 0})["mean"])
    for name, m in order:
        row = [name, cell(m, "accuracy", 100, 2), cell(m, "micro_accuracy", 100, 2),
               cell(m, "bottom5_accuracy", 100, 2), cell(m, "macro_f1", 100, 2)]
        if served:
            row.append(cell(m, "server_test_accuracy", 100, 2))
        if text:
            row += [cell(m, "loss", 1, 3), cell(m, "perplexity", 1, 2)]
        rows.append([*row, cell(m, "ari", 1, 3), cell(m, "own_cluster_peers", 100, 1),
                     len(m["seeds"]), f"{m['nodes_finished']}/{m['nodes']}"])
    headers = ["method", "accuracy %", "micro acc %", "bottom-5% acc %", "macro-F1 %",
               *(["server test %"] if served else []), *(["test loss", "perplexity"] if text else []), "ARI",
               "own-cluster peers %", "seeds", "finished"]
    seeds = ", ".join(map(str, summary["seeds"]))
    title = f"mean ± standard deviation over seeds {seeds}\n" + ("\n" if fmt == "github" else "")
    return title + tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def crash_lines(summary: dict[str, Any]) -> list[str]:
    """One line per method and seed in which members crashed, never joined or did not finish."""
    return [f"{name} seed {seed}: {failed_members(crashed)}"
            for name, m in summary["methods"].items() for seed, crashed in m["crashed"].items()]


def plot_seeds(run_dir: Path, folders: dict[int, Path], ended: dict[int, set[str]]) -> None:
    """accuracy.png: per method, the mean over the seeds that ran it to its end of the nodes' mean test
    accuracy per round, with a band of ± one standard deviation across them (rounds some seed did not
    evaluate are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list[dict[int, float]]] = {}
    for seed, folder in folders.items():
        for m in sorted(p for p in folder.iterdir() if p.is_dir() and p.name in ended.get(seed, set())):
            by_round: dict[int, list[float]] = {}
            for r in read_records(m):
                if r["event"] == "round" and "accuracy" in r and not math.isnan(r["accuracy"]):
                    by_round.setdefault(r["round"], []).append(r["accuracy"])
            if by_round:
                curves.setdefault(m.name, []).append({x: float(np.mean(v)) for x, v in by_round.items()})
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (name, runs) in enumerate(sorted(curves.items())):
        xs = sorted(set.intersection(*(set(c) for c in runs)))
        if not xs:
            continue
        values = np.array([[c[x] for x in xs] for c in runs]) * 100
        mean = values.mean(axis=0)
        (line,) = ax.plot(xs, mean, label=f"{name} ({len(runs)})", marker="o", markersize=2, **line_style(i))
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
