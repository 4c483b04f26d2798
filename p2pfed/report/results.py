"""Read a run folder and write what a person reads: summary.json, results.md and PNG plots.

summary.json is a contract for users' scripts::

    {"methods": {"<method>": {"accuracy": float, "micro_accuracy": float, "bottom5_accuracy": float,
                              "macro_f1": float, "ari": float | null, "own_cluster_peers": float | null,
                              "bytes_sent": int, "seconds": float, "device": str, ...}}}

accuracy is the mean of the nodes' personalised test accuracy (for next-token prediction: of the next character),
each node counting once (the per-node mean Rokvic et al. 2025 report); micro_accuracy weighs each node by its test
samples, i.e. the share of all honest nodes' test samples predicted right (the sample-weighted figure Li et al.
2022, Ma et al. 2023 and Long et al. 2023 report; for next-token prediction a sample is a word or a word sequence,
so it weighs nodes by their test words or sequences); bottom5_accuracy the mean over the worst 5% of nodes (at
least one); worst5_accuracy the mean of the 5 worst nodes (Li et al. 2022's "bottom accuracy");
best5_rounds_micro_accuracy the mean of the 5 best evaluation rounds' micro accuracy (Li et al. 2022 report it, as
accuracy swings from round to round); loss the mean of the nodes' test loss (per token for next-token prediction,
where perplexity is its exp); ari the adjusted Rand index between the true clusters and the discovered ones
(connected groups of mutual choices, each node's last choice), for methods that discover clusters;
first_choice_ari the same over each node's first choice, for methods whose nodes choose their peers (a node that
later falls back to training alone lowers the ARI, not this); own_cluster_peers, beside it for methods
whose nodes choose their peers, the share of chosen peers that are of the choosing node's true cluster (a choice
one way across clusters, which the groups of mutual choices and so the ARI do not show); server_test_accuracy, with
data.server_test and a method that serves one model, is Ye et al. 2023's figure: that model's accuracy on the
server's held-out test set in the evaluation where the nodes' mean validation accuracy of it was highest
(server_best_round; null otherwise).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from tabulate import tabulate

from p2pfed.influence.selection import mutual_clusters
from p2pfed.report.records import read_json, read_records, record_files

# What methods record that the report reads, whatever the method: a node's "choice" of peers ("chosen", and
# the "scores" it chose by, name → number; "dropped", the peers dropped from it, for the dashboard), from which
# clusters are the mutual choices; a node's score row
# ("scores": "peers" and "values") for the heatmaps; the coordinator's "assignment" of nodes to groups.
CHOICE = ("choice", "lia")  # "lia": the name of a choice record in runs made before it had a general one


def summarize_method(method_dir: Path, partition: dict[str, Any]) -> dict[str, Any]:
    """The summary.json entry of one method."""
    everything = read_records(method_dir)
    records = [r for r in everything if r["node"] != "coordinator"]
    coordinator = [r for r in everything if r["node"] == "coordinator"]
    run = read_json(method_dir / "run.json") if (method_dir / "run.json").exists() else {}
    finals = {r["node"]: r for r in records if r["event"] == "final"}
    last_round: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["event"] == "round" and "accuracy" in r:
            last_round[r["node"]] = r  # nodes that never finished still count with their last evaluation
    # By name: a set's order changes with the process's hash seed, and with it the last bit of the mean F1.
    per_node = {n: finals.get(n, last_round.get(n)) for n in sorted(set(finals) | set(last_round))}
    adversaries: dict[str, str] = partition.get("adversaries", {})
    honest = {n: v for n, v in per_node.items() if n not in adversaries}  # an adversary's accuracy is not counted
    accs = sorted(v["accuracy"] for v in honest.values() if v and not math.isnan(v["accuracy"]))
    test_sizes = dict(zip(partition["nodes"], partition.get("test", []), strict=False))
    micro = _micro_accuracy(honest, test_sizes)
    f1s = [v["macro_f1"] for v in honest.values() if v and not math.isnan(v["macro_f1"])]
    losses = [v["loss"] for v in honest.values() if v and not math.isnan(v.get("loss", math.nan))]
    loss = float(np.mean(losses)) if losses else None
    k = max(1, math.ceil(0.05 * len(accs)))
    choices: dict[str, list[str]] = {}  # each node's last choice
    first: dict[str, list[str]] = {}  # and its first
    for r in records:
        if r["event"] in CHOICE:
            choices[r["node"]] = r["chosen"]
            first.setdefault(r["node"], r["chosen"])
    ari = nmi = first_ari = None
    names = partition["nodes"]
    true = dict(zip(names, partition["true_cluster"], strict=True))
    found: dict[str, int] = {}
    if choices:  # a method whose nodes choose their peers: its clusters are the mutual choices
        found = mutual_clusters(choices)
    elif grouped := [r for r in coordinator if "assignment" in r]:  # the coordinator's last grouping
        found = {n: int(g) for n, g in grouped[-1]["assignment"].items()}
    known = any(c >= 0 for c in true.values())

    def against_true(grouped: dict[str, int]) -> tuple[list[int], list[int]]:
        members = sorted(n for n in grouped if n in true)
        return [true[n] for n in members], [grouped[n] for n in members]

    if found and known:
        labels = against_true(found)
        ari = float(adjusted_rand_score(*labels))
        nmi = float(normalized_mutual_info_score(*labels))
    if first and known:
        first_ari = float(adjusted_rand_score(*against_true(mutual_clusters(first))))
    # Only where nodes choose their peers (no choices, no pairs: None for methods whose nodes choose nobody, and the
    # coordinated methods), unlike the ARI: a coordinator's grouping has no one-way choice to hide, every node
    # averages with its whole group and the ARI already sees each one placed wrong. As for the ARI, the true
    # clusters must be known.
    own = _own_cluster_peers(choices, true, set(adversaries)) if known else None
    excluded = {adv: _excluded_by(adv, choices, found, [n for n in honest if true.get(n, -1) == true.get(adv, -2)])
                for adv in adversaries}
    best = _best_served(coordinator)
    bytes_sent = sum(int(v.get("bytes_sent", 0)) for v in per_node.values() if v)
    bytes_sent += sum(int(r.get("bytes_sent", 0)) for r in coordinator if r["event"] == "final")
    return {
        "accuracy": float(np.mean(accs)) if accs else None,
        "micro_accuracy": micro,
        "bottom5_accuracy": float(np.mean(accs[:k])) if accs else None,
        "worst5_accuracy": float(np.mean(accs[:5])) if accs else None,
        "best5_rounds_micro_accuracy": _best_rounds(records, set(honest), test_sizes),
        "macro_f1": float(np.mean(f1s)) if f1s else None,
        "server_test_accuracy": best["accuracy"] if best else None,
        "server_best_round": best["round"] if best else None,
        "loss": loss,
        "perplexity": math.exp(loss) if loss is not None and partition.get("task") == "next-token" else None,
        "ari": ari,
        # the same index over each node's first choice, before any drop, fallback or choice made again: whether the
        # scores found the clusters, where the ARI above says who trained together in the end
        "first_choice_ari": first_ari,
        "nmi": nmi,
        "own_cluster_peers": own,
        "bytes_sent": bytes_sent,
        "seconds": float(run.get("seconds", 0.0)),
        # what the nodes trained on ("cpu", "cuda:0 (NVIDIA H100 80GB HBM3)"); absent from runs made before it was
        # recorded, whose summaries stay as shipped
        **({"device": run["device"]} if run.get("device") else {}),
        "nodes_finished": len(finals),
        "nodes": len(per_node),
        # rounds nodes skipped to catch up with their peers (a finished node may not have run every round)
        "rounds_skipped": sum(int(r["skipped_to"]) - int(r["skipped_from"]) for r in records if r["event"] == "skip"),
        "crashed": run.get("crashed", {}),
        # per adversary: its kind and the share of the honest nodes of its true cluster that keep it out (do not
        # choose it, or are not clustered with it); None where a method has no such choice (one model for all, local)
        "adversaries": {a: {"kind": k, "excluded_by": excluded[a]} for a, k in adversaries.items()},
        # mean accuracy of the honest nodes of each true cluster (what an adversary in that cluster costs them)
        "cluster_accuracy": {str(c): float(np.mean(v)) for c, v in _by_cluster(honest, true).items()},
        "events": run.get("events", []),
    }


def _micro_accuracy(nodes: dict[str, Any], test_sizes: dict[str, int]) -> float | None:
    """The nodes' accuracies weighted by their test samples: a final record says how many it evaluated; a node
    that never finished counts with its last round's accuracy and its test shard's size from the partition.
    None when some node's size is known from neither (runs made before partitions recorded them)."""
    right = total = 0.0
    for name, v in nodes.items():
        if not v or math.isnan(v["accuracy"]):
            continue
        samples = v.get("test_samples", test_sizes.get(name))
        if samples is None:
            return None
        right += v["accuracy"] * samples
        total += samples
    return right / total if total else None


def _best_rounds(records: list[dict[str, Any]], honest: set[str], test_sizes: dict[str, int],
                 best: int = 5) -> float | None:
    """The figure of Li et al. 2022: the mean of the best 5 rounds' micro accuracy, over the rounds in which every
    honest node was evaluated (a round's micro accuracy weighs each node by its test shard). None without the
    sizes."""
    if not honest or not all(n in test_sizes for n in honest):
        return None
    by_round: dict[int, dict[str, float]] = {}
    for r in records:
        if r["event"] in ("round", "final") and r["node"] in honest and not math.isnan(r.get("accuracy", math.nan)):
            by_round.setdefault(int(r["round"]), {})[r["node"]] = r["accuracy"]
    total = sum(test_sizes[n] for n in honest)
    rounds = sorted((sum(acc[n] * test_sizes[n] for n in honest) / total
                     for acc in by_round.values() if len(acc) == len(honest)), reverse=True)
    return float(np.mean(rounds[:best])) if rounds and total else None


def _best_served(coordinator: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The coordinator's server-test record (Ye et al. 2023's protocol) whose nodes' mean validation accuracy is the
    highest, the earliest among equals, among the evaluations the most nodes validated (a mean over a few
    nodes that answered is not comparable with one over all); None without such records, or when no node
    validated."""
    served = [r for r in coordinator if r["event"] == "server" and isinstance(r.get("val_accuracy"), float)]
    most = max((int(r.get("validated", 0)) for r in served), default=0)
    served = [r for r in served if int(r.get("validated", 0)) == most]
    return max(served, key=lambda r: r["val_accuracy"]) if served else None  # max keeps the first of equals


def _by_cluster(nodes: dict[str, Any], true: dict[str, int]) -> dict[int, list[float]]:
    """The accuracies of nodes grouped by true cluster (clusters known only)."""
    out: dict[int, list[float]] = {}
    for n, v in sorted(nodes.items()):
        if v and true.get(n, -1) >= 0 and not math.isnan(v["accuracy"]):
            out.setdefault(true[n], []).append(v["accuracy"])
    return out


def _own_cluster_peers(choices: dict[str, list[str]], true: dict[str, int], adversaries: set[str]) -> float | None:
    """Over all (node, chosen peer) pairs of the nodes' last choices, the share whose peer is of the node's true
    cluster. A node with data of its own (true cluster -1) or unknown to the partition does not count, nor does
    an adversary (its choices are not the method's, as its accuracy is not); a peer unknown to the partition,
    or with data of its own, counts as of another cluster. None when no counted node chose a peer."""
    pairs = [true.get(peer) == true[node] for node, chosen in sorted(choices.items())
             if true.get(node, -1) >= 0 and node not in adversaries for peer in chosen]
    return sum(pairs) / len(pairs) if pairs else None


def _excluded_by(adversary: str, choices: dict[str, list[str]], found: dict[str, int],
                 judges: list[str]) -> float | None:
    """The share of judges (honest nodes) that keep the adversary out: their choice of peers leaves it out
    (methods whose nodes choose), or the coordinator's clusters put it elsewhere (clustered methods)."""
    if choices:
        votes = [adversary not in choices[j] for j in judges if j in choices]
    elif found and adversary in found:
        votes = [found.get(j) != found[adversary] for j in judges if j in found]
    else:
        return None
    return sum(votes) / len(votes) if votes else None


def write_report(run_dir: Path) -> dict[str, Any]:
    """Write summary.json, results.md and the plots of a run folder; return the summary."""
    partition = read_json(run_dir / "partition.json")
    methods = [p for p in sorted(run_dir.iterdir()) if p.is_dir() and record_files(p)]
    summary = {"methods": {m.name: summarize_method(m, partition) for m in methods}}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (run_dir / "results.md").write_text(results_table(summary, fmt="github") + "\n" + devices_line(summary))
    plot_run(run_dir, partition, methods)
    return summary


def results_table(summary: dict[str, Any], fmt: str = "simple") -> str:
    """The results table: one row per method."""
    def pct(v: float | None) -> str:
        return "–" if v is None else f"{100 * v:.2f}"

    text = any(m.get("perplexity") is not None for m in summary["methods"].values())
    served = any(m.get("server_test_accuracy") is not None for m in summary["methods"].values())
    rows = []
    for name, m in sorted(summary["methods"].items(), key=lambda kv: -(kv[1]["accuracy"] or 0)):
        row = [name, pct(m["accuracy"]), pct(m.get("micro_accuracy")), pct(m["bottom5_accuracy"]), pct(m["macro_f1"])]
        if served:  # Ye et al. 2023's figure: the served model's best round, on the server's test set
            row.append(pct(m.get("server_test_accuracy")))
        if text:  # next-token prediction: the loss per token and its perplexity say more than accuracy
            loss, ppl = m.get("loss"), m.get("perplexity")
            row += ["–" if loss is None else f"{loss:.3f}", "–" if ppl is None else f"{ppl:.2f}"]
        own = m.get("own_cluster_peers")  # absent from summaries written before it was reported
        rows.append([*row, "–" if m["ari"] is None else f"{m['ari']:.3f}", "–" if own is None else f"{100 * own:.1f}",
                     f"{m['bytes_sent'] / 1e6:.1f}", f"{m['seconds']:.0f}", f"{m['nodes_finished']}/{m['nodes']}"
                     + (f" ({m['rounds_skipped']} rounds skipped)" if m.get("rounds_skipped") else "")])
    headers = ["method", "accuracy %", "micro acc %", "bottom-5% acc %", "macro-F1 %",
               *(["server test %"] if served else []), *(["test loss", "perplexity"] if text else []), "ARI",
               "own-cluster peers %", "MB sent", "seconds", "finished"]
    return tabulate(rows, headers=headers, tablefmt=fmt)


def devices_line(summary: dict[str, Any]) -> str:
    """'Trained on: cpu.' (one line per run; each method's device where they differ), or nothing where no method
    recorded its device (runs made before it was)."""
    devices = {name: m["device"] for name, m in summary["methods"].items() if m.get("device")}
    if not devices:
        return ""
    if len(set(devices.values())) == 1:
        return f"\nTrained on: {next(iter(devices.values()))}.\n"
    return "\nTrained on: " + "; ".join(f"{name}: {d}" for name, d in devices.items()) + ".\n"


def failed_members(crashed: dict[str, str], shown: int = 3) -> str:
    """'members that failed: n00: why; n01: why; and 248 more' (a run of many nodes that failed at its start
    would otherwise print one line of them all)."""
    items = [f"{k}: {v}" for k, v in list(crashed.items())[:shown]]
    more = f"; and {len(crashed) - shown} more (run.json)" if len(crashed) > shown else ""
    return "members that failed: " + "; ".join(items) + more


def report_run(run_dir: Path) -> str:
    """Redraw a run folder's report and return its table (for `p2pfed report`)."""
    if not (run_dir / "partition.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no partition.json)")
    summary = write_report(run_dir)
    lines = [results_table(summary)]
    if devices := devices_line(summary).strip():
        lines.append(devices)
    for name, m in summary["methods"].items():
        if m["crashed"]:
            lines.append(f"{name}: {failed_members(m['crashed'])}")
    return "\n".join(lines)


def plot_run(run_dir: Path, partition: dict[str, Any], methods: list[Path]) -> None:
    """accuracy.png and loss.png (per round per method), clusters.png (cluster sizes per round of the coordinated
    methods that group nodes), and per method whose nodes score each other the scores and peers heatmaps."""
    import matplotlib

    matplotlib.use("Agg")
    plot_accuracy(run_dir, methods)
    plot_loss(run_dir, methods)
    for m in methods:
        rows = score_rows(read_records(m))
        if rows:
            plot_scores(run_dir, partition, m.name, rows)
    plot_clusters(run_dir, methods)


def plot_accuracy(run_dir: Path, methods: list[Path]) -> None:
    """accuracy.png: the mean personalised test accuracy per round of each method."""
    _plot_per_round(run_dir, methods, "accuracy", 100, "mean personalised test accuracy (%)")


def plot_loss(run_dir: Path, methods: list[Path]) -> None:
    """loss.png: the mean personalised test loss per round of each method (Rokvic et al. 2025's Fig. 1 shows it)."""
    _plot_per_round(run_dir, methods, "loss", 1, "mean personalised test loss")


def _plot_per_round(run_dir: Path, methods: list[Path], key: str, scale: float, label: str) -> None:
    """KEY.png: the nodes' mean of a round record's key per round, one line per method."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, m in enumerate(methods):
        by_round: dict[int, list[float]] = {}
        for r in read_records(m):
            if r["event"] == "round" and key in r and not math.isnan(r[key]):
                by_round.setdefault(r["round"], []).append(r[key])
        if by_round:
            xs = sorted(by_round)
            ax.plot(xs, [scale * np.mean(by_round[x]) for x in xs], label=m.name, marker="o", markersize=2,
                    **line_style(i))
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    ax.set_title(f"{run_dir.name}: {key} per round")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / f"{key}.png", dpi=120)
    plt.close(fig)


def score_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node's scores of its peers and the peers it aggregates with: its choice records, or its score rows
    with the coordinator's clusters standing in for chosen peers (nodes that do not choose)."""
    rows = [r for r in records if r["event"] in CHOICE]
    final = [r for r in records if r["node"] == "coordinator" and r["event"] == "final"]
    groups = final[-1].get("assignment", {}) if final else {}
    rows += [{"node": r["node"], "scores": dict(zip(r["peers"], r["values"], strict=True)),
              "chosen": [p for p in r["peers"] if p != r["node"] and p in groups and
                         groups.get(p) == groups.get(r["node"])]}
             for r in records if r["event"] == "scores"]
    return rows


def line_style(i: int) -> dict[str, Any]:
    """The colour and dash of the i-th method's line: ten colours, then the same colours dashed, so that the
    eleven methods of a Table I run are told apart."""
    return {"color": f"C{i % 10}", "linestyle": ("-", "--", ":")[i // 10 % 3]}


def plot_scores(run_dir: Path, partition: dict[str, Any], method: str, rows: list[dict[str, Any]]) -> None:
    """influence-METHOD.png (row's score of column) and peers-METHOD.png (row aggregates with column), nodes
    ordered by true cluster."""
    import matplotlib.pyplot as plt

    names = partition["nodes"]
    order = sorted(range(len(names)), key=lambda i: (partition["true_cluster"][i], i))
    index = {names[i]: pos for pos, i in enumerate(order)}
    scores = np.full((len(names), len(names)), np.nan)
    chosen = np.zeros((len(names), len(names)))
    for r in rows:
        row = index[r["node"]]
        for peer, value in r["scores"].items():
            scores[row, index[peer]] = value
        for peer in r["chosen"]:
            chosen[row, index[peer]] = 1
    for title, matrix, fname, cmap in [
        ("scores: row scores column", scores, "influence", "RdBu"),
        ("peers chosen: row aggregates with column", chosen, "peers", "Greys"),
    ]:
        fig, ax = plt.subplots(figsize=(6, 5.2))
        if cmap == "RdBu":
            lim = float(np.nanmax(np.abs(scores))) if np.isfinite(scores).any() else 1.0
            im = ax.imshow(matrix, cmap=cmap, vmin=-lim, vmax=lim)
        else:
            im = ax.imshow(matrix, cmap=cmap, vmin=0, vmax=1)
        fig.colorbar(im, ax=ax, fraction=0.046)
        ticks = [names[i] for i in order]
        if len(ticks) <= 40:
            ax.set_xticks(range(len(ticks)), ticks, rotation=90, fontsize=6)
            ax.set_yticks(range(len(ticks)), ticks, fontsize=6)
        bounds = np.flatnonzero(np.diff([partition["true_cluster"][i] for i in order])) + 0.5
        for b in bounds:
            ax.axhline(b, color="orange", lw=0.8)
            ax.axvline(b, color="orange", lw=0.8)
        ax.set_title(f"{method}: {title}\n(ordered by true cluster; orange lines separate clusters)", fontsize=9)
        fig.tight_layout()
        fig.savefig(run_dir / f"{fname}-{method}.png", dpi=120)
        plt.close(fig)


def plot_clusters(run_dir: Path, methods: list[Path]) -> None:
    """clusters.png: for each method whose coordinator groups nodes, how many nodes each cluster holds per
    round, one colour per cluster id (as Ma et al. 2023's Fig. 1; the legend gives each id's final size). A
    collapse into one cluster shows as one band taking everything; nodes not yet placed leave a gap."""
    import matplotlib.pyplot as plt

    series = {}
    for m in methods:
        rounds = [r for r in read_records(m) if r["node"] == "coordinator" and r["event"] == "round"]
        if rounds and any(len(r.get("sizes", [])) > 1 for r in rounds):
            series[m.name] = rounds
    if not series:
        return
    fig, axes = plt.subplots(len(series), 1, figsize=(7.5, 1.9 * len(series) + 0.6), sharex=True, squeeze=False)
    for ax, (name, rounds) in zip(axes[:, 0], series.items(), strict=True):
        xs = [r["round"] for r in rounds]
        ids = sorted({int(g) for r in rounds for g in r.get("assignment", {}).values()})
        if ids:  # per cluster id, from the assignment recorded each round
            bands = np.array([[sum(1 for g in r.get("assignment", {}).values() if int(g) == i) for r in rounds]
                              for i in ids])
            labels = [f"{i} ({bands[k, -1]})" for k, i in enumerate(ids)]
        else:  # older records: sizes only, largest first
            width = max(len(r["sizes"]) for r in rounds)
            bands = np.array([r["sizes"] + [0] * (width - len(r["sizes"])) for r in rounds]).T
            labels = []
        ax.stackplot(xs, bands, step="post", linewidth=0.3, edgecolor="white", labels=labels)
        ax.set_ylabel("nodes")
        ax.set_title(f"{name}: cluster sizes ({len(rounds[-1]['sizes'])} clusters at the end)", fontsize=9)
        if labels and len(labels) <= 12:
            ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, title="id (final)",
                      title_fontsize=7, frameon=False)
    axes[-1, 0].set_xlabel("round")
    fig.tight_layout()
    fig.savefig(run_dir / "clusters.png", dpi=120)
    plt.close(fig)
