"""Draw every results table in README.md and docs/ from the files committed beside them.

A table in Markdown sits between two markers, and this script writes what is between them:

    <!-- table: scenarios/results/quickstart/summary.json -->   a run's (or a run over seeds') table, as
    <!-- end table -->                                          `p2pfed report` draws it (methods=a,b: only those)
    <!-- table: benchmarks/results/wire.json -->                a benchmark's figures
    <!-- table: benchmarks/results/wire.json part=split -->     one part of a benchmark's figures (BENCHMARKS'
                                                                "wire.json#split"): where a model message's time goes
    <!-- table: scenarios/results/A/summary.json clean=scenarios/results/B -->   adversaries: run A against the
                                                                same run B without them
    <!-- table: scenarios/results/DIR before=METHOD -->        METHOD in each run under DIR (before a change)
                                                                against the shipped run of the same name
    <!-- table: scenarios/results/DIR before=METHOD after=scenarios/results/DIR2 -->   ... against the run of
                                                                that name under DIR2 (the change's own runs, once a
                                                                later one shipped); the baselines still shipped
    <!-- headline -->                                           README's one-line-per-experiment table
    <!-- end headline -->

Run: python3 tools/docs_tables.py [--check]   (--check: exit 1, naming each stale table, instead of writing)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[0] != str(ROOT):
    sys.path.insert(0, str(ROOT))  # this checkout's p2pfed, not one pip installed from another folder

from p2pfed.report.results import results_table  # noqa: E402
from p2pfed.report.seeds import mean_sd, seed_folders, seeds_table  # noqa: E402

HEADER = r"<!-- table: (?P<path>\S+)(?P<opts>(?: \w+=\S+)*) -->"  # a table's marker: its file, then NAME=VALUE options
TABLE = re.compile(rf"({HEADER}\n)(?P<body>.*?)(<!-- end table -->)", re.S)
MARKER = re.compile(r"<!-- table:.*?-->")  # every table marker, well formed (HEADER) or not
WELL_FORMED = re.compile(HEADER)
HEADLINE = re.compile(r"(<!-- headline -->\n)(?P<body>.*?)(<!-- end headline -->)", re.S)
# README's headline: per shipped experiment its results page, and the methods whose accuracy it shows
HEADLINE_RUNS = [
    ("quickstart", "digits, 20 nodes, 5 clusters", "docs/results/quickstart.md"),
    ("compare-digits", "digits, 20 nodes, every method", "docs/results/compare-digits.md"),
    ("feature-digits", "digits, 12 nodes, 4 rotations", "docs/results/pfedlia.md#digits"),
    ("feature-fmnist", "Fashion-MNIST, 40 nodes, 4 rotations", "docs/results/pfedlia.md#fashion-mnist"),
    ("feature-digits-mixed", "digits, 12 nodes, rotations and label skew",
     "docs/results/pfedlia.md#digits-with-label-skew-the-mixed-form"),
    ("feature-fmnist-mixed", "Fashion-MNIST, 40 nodes, rotations and label skew, the p2p methods",
     "docs/results/pfedlia.md#fashion-mnist-with-label-skew-the-mixed-form"),
    ("scandinavian", "next character, 12 nodes, 4 languages",
     "docs/results/pfedlia.md#next-character-prediction-on-scandinavian-languages"),
    ("fmnist-pathological", "Fashion-MNIST, 100 nodes, 5 clusters",
     "docs/results/pfedlia.md#fashion-mnist-pathological"),
    ("fmnist-noisy", "Fashion-MNIST, 100 nodes, noisy clusters", "docs/results/pfedlia.md#fashion-mnist-noisy"),
]
HEADLINE_METHODS = ("pfedlia-p2p", "oracle-p2p", "fedavg-p2p", "local-p2p")


def docs() -> list[Path]:
    """The Markdown files whose tables this script draws."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def summary_table(path: Path, opts: dict[str, str]) -> str:
    """A run's table as `p2pfed report` draws it (of a run over seeds: mean ± sd)."""
    summary = json.loads(path.read_text())
    if "methods" in opts:
        wanted = opts["methods"].split(",")
        missing = [m for m in wanted if m not in summary["methods"]]
        if missing:
            raise ValueError(f"{path.relative_to(ROOT)} has no method {', '.join(missing)}")
        summary = {**summary, "methods": {m: summary["methods"][m] for m in wanted}}
    return seeds_table(summary, fmt="github") if "seeds" in summary else results_table(summary, fmt="github")


Run = tuple[dict[str, Any], dict[str, int]]  # a run's methods' summaries, and node → true cluster


def runs_of(folder: Path) -> list[Run]:
    """A run folder's (or each seed's of a run over seeds) methods' summaries and node → true cluster."""
    found = []
    for run in list(seed_folders(folder).values()) or [folder]:
        partition = json.loads((run / "partition.json").read_text())
        found.append((json.loads((run / "summary.json").read_text())["methods"],
                      dict(zip(partition["nodes"], partition["true_cluster"], strict=True))))
    return found


def adversaries_table(path: Path, clean_dir: Path) -> str:
    """Per method and per adversary: the share of its honest cluster mates that keep it out, and their accuracy
    with the adversary (and in the same run without any: clean_dir); of a run over seeds, the means over them."""
    runs, cleans = runs_of(path.parent), runs_of(clean_dir)
    first, cluster = runs[0]
    any_method = next(iter(first.values()))
    adversaries = sorted(any_method["adversaries"], key=lambda a: cluster[a])
    attacked = {cluster[a] for a in adversaries}
    others = sorted(set(cluster.values()) - attacked)

    def acc(found: list[Run], name: str, adversary: str | None) -> float:
        """The honest nodes' accuracy in the adversary's cluster (None: in the clusters with none), each run's."""
        def clusters(of: dict[str, int]) -> set[int]:
            return {of[adversary]} if adversary else set(of.values()) - {of[a] for a in adversaries}
        return 100 * statistics.mean(statistics.mean(m[name]["cluster_accuracy"][str(c)] for c in clusters(of))
                                     for m, of in found)

    def overall(found: list[Run], name: str) -> float:
        return 100 * statistics.mean(m[name]["accuracy"] for m, _ in found)

    first_run = next(iter(seed_folders(path.parent).values()), path.parent)
    order = tomllib.loads((first_run / "scenario.toml").read_text())["scenario"]["methods"]  # as the file runs them
    rows = ["| method | " + " | ".join(f"{any_method['adversaries'][a]['kind']} {a} (cluster {cluster[a]})"
                                       for a in adversaries)
            + f" | clusters {', '.join(map(str, others))} (none) | all honest nodes |",
            "|---|" + "---:|" * (len(adversaries) + 2)]
    for name in sorted(first, key=order.index):
        cells = []
        for a in adversaries:
            shares = [m[name]["adversaries"][a]["excluded_by"] for m, _ in runs]
            out = None if None in shares else statistics.mean(shares)
            cells.append(("–" if out is None else f"{100 * out:.0f} % out")
                         + f" · {acc(runs, name, a):.1f} ({acc(cleans, name, a):.1f})")
        cells += [f"{acc(runs, name, None):.1f} ({acc(cleans, name, None):.1f})",
                  f"{overall(runs, name):.1f} ({overall(cleans, name):.1f})"]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def wire_table(figures: dict[str, Any]) -> str:
    rows = ["| path | MB/s | × raw TCP |", "|---|---:|---:|"]
    rows += [f"| {p['path']} | {p['mb_per_s']:.0f} | {p['x_raw_tcp']:.2f} |" for p in figures["paths"]]
    return "\n".join(rows)


def wire_split_table(figures: dict[str, Any]) -> str:
    """benchmarks/wire.py: a p2pfed transfer beside its ceiling, split where its time goes, measured in the same run."""
    rows = ["| security | tuned pyzmq, whole ms | p2pfed ms | to the receiver | decoding and validating "
            "| handler and ack | tuned ÷ p2pfed, medians | pair by pair: median (quartiles) |", "|---|" + "---:|" * 7]
    for kind, part in figures["where_it_goes"].items():
        pairs = figures["of_tuned_pyzmq_pairs"][kind]
        low, high = pairs["quartiles"]
        rows.append(f"| {'CURVE (the default)' if kind == 'curve' else 'none (--insecure)'} | "
                    f"{1e3 * part['tuned_s']:.1f} | {1e3 * part['p2pfed_s']:.1f} | {1e3 * part['to_receipt_s']:.1f} | "
                    f"{1e3 * part['decode_s']:.1f} | {1e3 * part['handler_and_ack_s']:.1f} | "
                    f"{part['tuned_s'] / part['p2pfed_s']:.2f} | {pairs['median']:.2f} ({low:.2f} to {high:.2f}) |")
    return "\n".join(rows)


def start_table(figures: dict[str, Any]) -> str:
    rows = ["| what | seconds | × torch's import | resident MiB | × torch's import |", "|---|---:|---:|---:|---:|"]
    rows += [f"| {r['what']} | {r['s']:.2f} | {r['x_s']:.2f} | "
             + (f"{r['mib']:.0f} | {r['x_mib']:.2f} |" if r["mib"] is not None else " | |") for r in figures["rows"]]
    return "\n".join(rows)


def beat_table(figures: dict[str, Any]) -> str:
    """benchmarks/beat.py: a heartbeat period's work on a member's own table, this code against the code before."""
    rows = ["| peers in the table | code | µs a period | × one pass over the table | this / before | share of a core, "
            "N/4 members in a process |", "|---:|---|---:|---:|---:|---:|"]
    before = {r["peers"]: r for r in figures["rows"] if r["code"] == "before"}
    for r in figures["rows"]:
        ratio = f"{r['beat_us'] / before[r['peers']]['beat_us']:.2f}" if r["code"] == "this" and before else ""
        rows.append(f"| {r['peers']} | {r['code']} | {r['beat_us']:.0f} | {r['x_pass']:.1f} | {ratio} | "
                    f"{r['process_core_share']:.3f} |")
    return "\n".join(rows)


def phase_table(figures: dict[str, Any]) -> str:
    """benchmarks/phase_counts.py: the influence phase of runs, a column a run."""
    runs = figures["rows"]
    rows = ["| at the scoring round | " + " | ".join(r["code"] for r in runs) + " |", "|---|" + "---:|" * len(runs)]
    for label, cell in [("nodes that scored", lambda r: f"{r['nodes']}"),
                        ("peers in the sample, mean", lambda r: f"{r['sample_mean']:.2f}"),
                        ("nodes that drew no peer", lambda r: f"{r['drew_none']}"),
                        ("partial models scored, mean", lambda r: f"{r['scored_mean']:.2f}"),
                        ("nodes with none of their sample's partial models", lambda r: f"{r['scored_none']}"),
                        ("nodes that chose nobody", lambda r: f"{r['chose_none']}"),
                        ("nodes that waited for peers behind; median, longest wait",
                         lambda r: f"{r['waited']}; {r['waited_median_s']:.0f} s, {r['waited_max_s']:.0f} s")]:
        rows.append(f"| {label} | " + " | ".join(cell(r) for r in runs) + " |")
    return "\n".join(rows)


def keys_table(figures: dict[str, Any]) -> str:
    rows = ["| pair | keys (s) | --insecure (s) | ratio |", "|---:|---:|---:|---:|"]
    rows += [f"| {i} | {p['keyed_s']:.1f} | {p['insecure_s']:.1f} | {p['ratio']:.3f} |"
             for i, p in enumerate(figures["pairs"], 1)]
    rows.append(f"| median | | | {statistics.median(p['ratio'] for p in figures['pairs']):.3f} |")
    return "\n".join(rows)


def lia_table(figures: dict[str, Any]) -> str:
    rows = ["| what | time | ratio |", "|---|---:|---:|"]
    if "scoring" in figures:
        s = figures["scoring"]
        rows += [f"| (a) score {s['peers']} partial models on {s['validation_samples']} {s['dataset']} samples, "
                 f"one at a time | {1e3 * s['one_at_a_time_s']:.1f} ms | 1 |",
                 f"| (a) the same, batched over stacked parameters (`torch.func.vmap`) | "
                 f"{1e3 * s['batched_s']:.1f} ms | {s['speed_up']:.2f}x |"]
        if "one_at_a_time_max_pool2d_s" in s:  # measured since MaxPool2 (older files have no such row)
            rows += [f"| (a) one at a time, with torch's `max_pool2d` in place of `MaxPool2` | "
                     f"{1e3 * s['one_at_a_time_max_pool2d_s']:.1f} ms | {1 / s['pool_speed_up']:.2f}x |"]
    if "lazy_vs_exact" in figures:
        b = figures["lazy_vs_exact"]
        rows += [f"| (b) exact influence of a 100-point batch (retrain on {b['initial_points']} + 100 points to "
                 f"loss < {b['threshold']}) | {b['exact_s']:.2f} s | 1 |",
                 f"| (b) lazy influence of the same batch ({b['lazy_epochs']} epochs on the batch) | "
                 f"{b['lazy_s']:.3f} s | {b['speed_up']:.0f}x cheaper |"]
    return "\n".join(rows)


def lia_gpu_table(figures: dict[str, Any]) -> str:
    """lia.py on one machine's GPU and on its CPU, in the same call: each figure beside its CPU reference."""
    gpu, cpu = figures["cuda"]["scoring"]["device"], f"its CPU ({figures['cpu']['scoring']['threads']} threads)"
    rows = [f"| what | {cpu} | {gpu} | GPU against CPU |", "|---|---:|---:|---:|"]

    def row(what: str, on_cpu: float, on_gpu: float, unit: str) -> str:
        scale, fmt = (1e3, ".1f") if unit == "ms" else (1.0, ".3f")
        ratio = on_cpu / on_gpu
        faster = f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"
        return f"| {what} | {scale * on_cpu:{fmt}} {unit} | {scale * on_gpu:{fmt}} {unit} | {faster} |"

    for c, g in ((figures["cpu"], figures["cuda"]), (figures["digits_cpu"], figures["digits_cuda"])):
        a, b = c["scoring"], g["scoring"]
        what = f"(a) score {a['peers']} partial models on {a['validation_samples']} {a['dataset']} samples"
        rows += [row(f"{what}, one at a time", a["one_at_a_time_s"], b["one_at_a_time_s"], "ms"),
                 row(f"{what}, batched (`torch.func.vmap`)", a["batched_s"], b["batched_s"], "ms"),
                 f"| batched against one at a time | {a['speed_up']:.2f}x | {b['speed_up']:.2f}x | |"]
    c, g = figures["cpu"]["lazy_vs_exact"], figures["cuda"]["lazy_vs_exact"]
    rows += [row(f"(b) exact influence of a 100-point batch (retrain on {c['initial_points']} + 100 points to loss "
                 f"< {c['threshold']})", c["exact_s"], g["exact_s"], "s"),
             row(f"(b) lazy influence of the same batch ({c['lazy_epochs']} epochs on the batch)", c["lazy_s"],
                 g["lazy_s"], "s"),
             f"| (b) lazy against exact | {c['speed_up']:.0f}x cheaper | {g['speed_up']:.0f}x cheaper | |"]
    return "\n".join(rows)


def flower_table(figures: dict[str, Any]) -> str:
    """benchmarks/flower.py: the median of each side's interleaved runs, p2pfed's as a ratio to Flower's."""
    p, f = figures["median"]["p2pfed"], figures["median"]["flower"]
    rows = [f"| what | p2pfed | Flower {figures['flwr']} (Ray {figures['ray']}) | p2pfed / Flower |",
            "|---|---:|---:|---:|"]
    for key, what, unit, fmt in (("round_s", "steady round time (rounds 2..R)", "s", ".2f"),
                                 ("startup_s", "start-up (launch to round 1)", "s", ".1f"),
                                 ("wall_s", "wall time, launch to exit", "s", ".1f"),
                                 ("cpu_s", "CPU time of the process tree", "s", ".0f"),
                                 ("peak_mb", "peak memory of the process tree (PSS)", "MB", ".0f")):
        rows.append(f"| {what} | {p[key]:{fmt}} {unit} | {f[key]:{fmt}} {unit} | {p[key] / f[key]:.2f} |")
    rows.append(f"| mean accuracy of the clients | {100 * p['accuracy']:.2f} % | {100 * f['accuracy']:.2f} % | "
                f"{p['accuracy'] / f['accuracy']:.2f} |")
    return "\n".join(rows)


def ray_engine_table(figures: dict[str, Any]) -> str:
    """benchmarks/ray_engine.py: each engine's median over interleaved runs, Ray's as a ratio to the local one's,
    and each run's accuracy (which varies from run to run at that size, on either engine)."""
    r, loc = figures["median"]["ray"], figures["median"]["local"]
    rows = [f"| what | local processes | Ray {figures['ray']} actors | Ray / local |", "|---|---:|---:|---:|"]
    for key, what, unit, fmt in (("wall_s", "wall time, launch to exit", "s", ".0f"),
                                 ("method_s", "the method's own time (run.json)", "s", ".0f"),
                                 ("cpu_s", "CPU time of the process tree", "s", ".0f"),
                                 ("peak_mb", "peak memory of the process tree (PSS)", "MB", ".0f")):
        rows.append(f"| {what} | {loc[key]:{fmt}} {unit} | {r[key]:{fmt}} {unit} | {r[key] / loc[key]:.2f} |")
    each = {e: ", ".join(f"{100 * run['accuracy']:.2f}" for run in figures["runs"] if run["engine"] == e)
            for e in ("local", "ray")}
    rows.append(f"| mean accuracy %, each run | {each['local']} | {each['ray']} | |")
    for key, what in (("ari", "ARI, each run"), ("finished", "nodes finished, each run")):
        each = {e: ", ".join(f"{run[key]:.3f}" if isinstance(run[key], float) else str(run[key])
                             for run in figures["runs"] if run["engine"] == e) for e in ("local", "ray")}
        rows.append(f"| {what} | {each['local']} | {each['ray']} | |")
    return "\n".join(rows)


FLOWER_STEPS = (("flower-before.json", "before (4 node processes)"),
                ("flower-changes.json", "after (4 node processes)"),
                ("flower-cores.json", "after (2 node processes, a core each)"),
                ("flower.json", "today (4 node processes)"))


def flower_history_table(_: dict[str, Any]) -> str:
    """p2pfed / Flower before and after the changes (each step's ratio against the Flower runs interleaved with
    it), then what each side's memory went to (its first run's processes, each at its own peak)."""
    steps = [(json.loads((ROOT / "benchmarks" / "results" / name).read_text()), what) for name, what in FLOWER_STEPS]
    rows = ["| p2pfed / Flower | " + " | ".join(what for _, what in steps) + " |",
            "|---|" + "---:|" * len(steps)]
    for key, what in (("round_s", "steady round time"), ("startup_s", "start-up"), ("wall_s", "wall time"),
                      ("cpu_s", "CPU time"), ("peak_mb", "peak memory"), ("accuracy", "accuracy")):
        rows.append(f"| {what} | " + " | ".join(f"{f['median']['p2pfed'][key] / f['median']['flower'][key]:.2f}"
                                                for f, _ in steps) + " |")
    memory = ["| process (count) | " + " | ".join(what for _, what in steps) + " | Flower (beside today's) |",
              "|---|" + "---:|" * (len(steps) + 1)]
    kinds = list(dict.fromkeys(k for f, _ in steps for k in f["runs"][0]["processes"]))
    for kind in kinds:
        cells = []
        for f, _ in steps:
            p = f["runs"][0]["processes"].get(kind)
            cells.append(f"{p['peak_mb']:.0f} MB ({p['count']})" if p else "–")
        memory.append(f"| {kind} | " + " | ".join(cells) + " | |")
    flower = next(r for r in steps[-1][0]["runs"] if r["side"] == "flower")
    for kind, p in flower["processes"].items():
        memory.append(f"| {kind} |" + " |" * len(steps) + f" {p['peak_mb']:.0f} MB ({p['count']}) |")
    said = "What the memory went to (each process at its own peak, proportional set size):"
    return "\n".join(rows) + f"\n\n{said}\n\n" + "\n".join(memory)


def membership_table(figures: dict[str, Any]) -> str:
    rows = ["| N | membership | messages / member / s | × smallest N | bytes / member / s | × smallest N | "
            "connections / member | formed in (s) | CPU (cores) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    first: dict[str, dict[str, Any]] = {}
    for r in figures["sizes"]:
        if "failed" in r:  # what this form could not do at this size (e.g. out of open files), said as such
            rows.append(f"| {r['members']} | {r['membership']} | failed: {r['failed']} | | | | | | |")
            continue
        base = first.setdefault(r["membership"], r)
        formed = f"{r['formed_s']:.1f}" if r["formed_s"] is not None else "never"
        rows.append(f"| {r['members']} | {r['membership']} | {r['messages_per_member_s']:.1f} | "
                    f"{r['messages_per_member_s'] / base['messages_per_member_s']:.2f} | "
                    f"{r['bytes_per_member_s']:.0f} | {r['bytes_per_member_s'] / base['bytes_per_member_s']:.2f} | "
                    f"{r['connections_per_member']:.0f} | {formed} | {r['cpu_share']:.2f} |")
    return "\n".join(rows)


def sampling_table(figures: dict[str, Any]) -> str:
    """benchmarks/sampling.py: pFedLIA-p2p scoring all pairs against a sample, per mesh size."""
    rows = ["| N | scoring | ARI | own-cluster % | accuracy % | bottom-5 % | peers scored / node | MB sent / node | "
            "seconds | peak MB | bytes × all | seconds × all |", "|---:|---|" + "---:|" * 10]
    for r in figures["rows"]:
        if "failed" in r:
            rows.append(f"| {r['nodes']} | {r['form']} | {r['failed']} | | | | | | | | | |")
            continue
        ari = f"{r['ari']:.3f}" if r["ari"] is not None else "–"
        versus = [f"{r[k]:.2f}" if k in r else "–" for k in ("bytes_vs_all", "seconds_vs_all")]
        rows.append(f"| {r['nodes']} | {r['form']} | {ari} | {100 * (r['own_cluster_peers'] or 0):.1f} | "
                    f"{100 * r['accuracy']:.2f} | {100 * r['bottom5_accuracy']:.2f} | {r['scored_per_node']:.1f} | "
                    f"{r['bytes_per_node'] / 1e6:.2f} | {r['seconds']:.0f} | {r['peak_mb']:.0f} | "
                    + " | ".join(versus) + " |")
    return "\n".join(rows)


def scale_table(figures: dict[str, Any]) -> str:
    """benchmarks/scale.py: one scenario grown from the smallest N to 1,000 nodes, a row a size."""
    rows = ["| N | finished | ARI | accuracy % | wall s | × smallest | CPU s | peak MiB | × smallest | "
            "MB sent / node | × smallest | membership msgs / node / s | × smallest | sockets, busiest process | "
            "× smallest | suspect / node | refuted / node |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(figures["rows"], key=lambda r: r["nodes"]):
        if "failed" in r:
            rows.append(f"| {r['nodes']} | failed: {r['failed']} |" + " |" * 15)
            continue
        # a member taking a peer for silent, and how many of those the peer disproved (false alarms): counted over
        # the run's logs by sweeps since the told period (docs/design.md); "–" in rows of sweeps before
        alarms = [f"{r[key]:.2f}" if key in r else "–" for key in ("suspect_per_node", "refuted_per_node")]
        ari = f"{r['ari']:.3f}" if r["ari"] is not None else "–"
        x = r["vs_smallest"]
        rows.append(f"| {r['nodes']} | {r['finished']}/{r['nodes']} | {ari} | {100 * r['accuracy']:.2f} | "
                    f"{r['wall_s']:.0f} | {x['wall_s']:.2f} | {r['cpu_s']:.0f} | {r['peak_mb']:.0f} | "
                    f"{x['peak_mb']:.2f} | {r['mb_per_node']:.2f} | {x['mb_per_node']:.2f} | "
                    f"{r['membership_per_node_s']:.2f} | {x['membership_per_node_s']:.2f} | "
                    f"{r['sockets_per_process']} | {x['sockets_per_process']:.2f} | " + " | ".join(alarms) + " |")
    return "\n".join(rows)


def scale_wait_table(figures: dict[str, Any]) -> str:
    """benchmarks/scale.py at 1,000 nodes once more, below the 1,000-node rows of the runs before it (its "before"
    file, that file's "before", and so on; "row": which of that file's rows, else its first of 1,000 nodes): other
    code, other runs, so the figures side by side and no ratio."""
    pairs = [(figures["code"].split()[0], figures["rows"][0])]
    while "before" in figures:
        before = figures["before"]
        code, figures = before["code"], json.loads((ROOT / before["file"]).read_text())
        rows = [r for r in figures["rows"] if r["nodes"] == 1000]
        pairs.insert(0, (code, rows[before.get("row", 0)]))
    rows = ["| code | finished | ARI | accuracy % | bottom-5 % | wall s | CPU s | peak MiB | MB sent / node | "
            "rounds skipped | sockets, busiest process | suspect / node | dead / node | refuted / node |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for code, r in pairs:
        rows.append(f"| {code} | {r['finished']}/{r['nodes']} | {r['ari']:.3f} | {100 * r['accuracy']:.2f} | "
                    f"{100 * r['bottom5_accuracy']:.2f} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['peak_mb']:.0f} | "
                    f"{r['mb_per_node']:.2f} | {r['rounds_skipped']} | {r['sockets_per_process']} | "
                    f"{r['suspect_per_node']:.2f} | {r['dead_per_node']:.2f} | {r['refuted_per_node']:.2f} |")
    return "\n".join(rows)


def against_pairs(runs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """benchmarks/scale.py --against's rows as (the other checkout's, this one's) pairs, in the order they ran."""
    return [(a, b) for a, b in zip(runs[::2], runs[1::2], strict=False) if a["code"] != "this" == b["code"]]


def scale_against_table(figures: dict[str, Any]) -> str:
    """benchmarks/scale.py --against: each pair of runs (another checkout's, then this one's), a row a pair."""
    rows = ["| N | run | wall s | CPU s | peak MiB | suspect / node | dead / node | refuted / node | nodes finished | "
            "ARI | accuracy % |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k, (a, b) in enumerate(against_pairs(figures["rows"]), 1):
        for r, what in ((a, f"pair {k}, before"), (b, f"pair {k}, after")):
            ari = f"{r['ari']:.3f}" if r.get("ari") is not None else "–"
            accuracy = f"{100 * r['accuracy']:.2f}" if "accuracy" in r else "–"
            rows.append(f"| {r['nodes']} | {what} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['peak_mb']:.0f} | "
                        f"{r['suspect_per_node']:.2f} | {r['dead_per_node']:.2f} | {r['refuted_per_node']:.2f} | "
                        f"{r.get('finished', 0)}/{r['nodes']} | {ari} | {accuracy} |")
        ratio = [f"{b[key] / a[key]:.2f}" if a[key] else "–"
                 for key in ("wall_s", "cpu_s", "peak_mb", "suspect_per_node", "dead_per_node", "refuted_per_node")]
        rows.append(f"| {a['nodes']} | pair {k}, after ÷ before | " + " | ".join(ratio) + " | | | |")
    return "\n".join(rows)


def scale_option_table(figures: dict[str, Any]) -> str:
    """benchmarks/scale.py --against a worktree of the same commit, --set on this side: each pair of runs (without
    the settings, then with them), a row a run and a row of ratios (with ÷ without)."""
    keys = [("wall_s", "wall s", ".0f"), ("cpu_s", "CPU s", ".0f"), ("peak_mb", "peak MiB", ".0f"),
            ("membership_per_node_s", "membership msg / node / s", ".2f"), ("mb_per_node", "MB sent / node", ".2f"),
            ("dead_per_node", "dead / node", ".2f"), ("rounds_skipped", "rounds skipped", "d")]
    rows = ["| N | run | " + " | ".join(title for _, title, _ in keys) + " | nodes finished | ARI | accuracy % | "
            "bottom-5 % |", "|---:|---|" + "---:|" * (len(keys) + 4)]
    for k, (a, b) in enumerate(against_pairs(figures["rows"]), 1):
        for r, what in ((a, f"pair {k}, default"), (b, f"pair {k}, {' '.join(b['set'])}")):
            cells = [format(r[key], form) if key in r else "–" for key, _, form in keys]
            ari = f"{r['ari']:.3f}" if r.get("ari") is not None else "–"
            accuracy, bottom = (f"{100 * r[key]:.2f}" if key in r else "–" for key in ("accuracy", "bottom5_accuracy"))
            rows.append(f"| {r['nodes']} | {what} | " + " | ".join(cells)
                        + f" | {r.get('finished', 0)}/{r['nodes']} | {ari} | {accuracy} | {bottom} |")
        ratio = [f"{b[key] / a[key]:.2f}" if a.get(key) and key in b else "–" for key, _, _ in keys]
        rows.append(f"| {a['nodes']} | pair {k}, set ÷ default | " + " | ".join(ratio) + " | | | | |")
    return "\n".join(rows)


BENCHMARKS: dict[str, Callable[[dict[str, Any]], str]] = {
    "wire.json": wire_table, "wire.json#split": wire_split_table, "quickstart-keys.json": keys_table,
    "lia.json": lia_table, "lia-digits.json": lia_table,
    "lia-1-thread.json": lia_table,
    "lia-gpu.json": lia_gpu_table, "flower.json": flower_table, "ray-engine.json": ray_engine_table,
    "ray-engine-1000.json": ray_engine_table,
    "flower-before.json": flower_history_table,
    "membership.json": membership_table, "beat.json": beat_table, "sampling.json": sampling_table,
    "scale.json": scale_table, "scale-7bdf03e0.json": scale_table, "scale-kept-period.json": scale_against_table,
    "scale-250-beat.json": scale_against_table, "scale-1000-wait.json": scale_wait_table,
    "scale-1000-sample.json": scale_wait_table, "scale-1000-beat.json": scale_wait_table,
    "start.json": start_table, "scale-1000-phase.json": phase_table, "scale-lazy.json": scale_option_table,
    "scale-lazy-random.json": scale_option_table, "scale-1000-lazy.json": scale_option_table,
    "scale-1000-default.json": scale_wait_table,
    "scale-1000-final.json": scale_wait_table}


def accuracy_mean(value: float | dict[str, Any] | None) -> float:
    """A summary's accuracy: a run's, or the mean of a run over seeds."""
    return (value["mean"] if isinstance(value, dict) else value) or 0.0


def accuracy_cell(value: float | dict[str, Any] | None) -> str:
    """A summary's accuracy in %: a run's, or a run over seeds' mean ± sd."""
    return mean_sd(value, 100) if isinstance(value, dict) else f"{100 * (value or 0.0):.2f}"


def headline() -> str:
    """One row per shipped experiment: the mean accuracy of pFedLIA p2p and the baselines that bound it."""
    rows = ["| experiment | " + " | ".join(f"{m} %" for m in HEADLINE_METHODS) + " | best method |",
            "|---|" + "---:|" * len(HEADLINE_METHODS) + "---|"]
    for name, what, page in HEADLINE_RUNS:
        path = ROOT / "scenarios" / "results" / name / "summary.json"
        if not path.exists():
            continue  # not shipped yet: no row rather than a row of numbers nobody can check
        summary = json.loads(path.read_text())
        methods = {m: v["accuracy"] for m, v in summary["methods"].items()}
        cells = [accuracy_cell(methods[m]) if m in methods else "–" for m in HEADLINE_METHODS]
        best = max(methods, key=lambda m: accuracy_mean(methods[m]))
        ran = summary.get("seeds", [0])  # a run over seeds names them; a single run is seed 0's
        seeds = f", {len(ran)} seeds" if len(ran) > 1 else f", seed {ran[0]}"
        rows.append(f"| [{name}]({page}): {what}{seeds} | " + " | ".join(cells)
                    + f" | {best} ({accuracy_cell(methods[best])}) |")
    return "\n".join(rows)


def before_after_table(before_dir: Path, method: str, where: Path, after_dir: Path | None = None) -> str:
    """One row per run folder under before_dir (a method's runs before a change, named as the shipped runs):
    that method's accuracy and bottom-5 % there, and after: in the run of the same name under after_dir (the
    change's own runs, kept when a later change ran the method again) or else in the shipped run, beside the
    shipped run's baselines (links relative to where, the page): each in its -p2p form, or where the scenario
    runs only the coordinated one (the table1 files), that."""
    baselines = ("pfedlia-p2p-paper", "local-p2p", "fedavg-p2p", "oracle-p2p")
    rows = [f"| scenario | {method} before | {method} after | " + " | ".join(baselines) + " |",
            "|---|" + "---:|" * (2 + len(baselines))]
    marked = False  # whether a cell is of the coordinated form (said under the table)

    def cell(m: dict[str, Any] | None) -> str:
        if m is None:
            return "–"
        return f"{accuracy_cell(m['accuracy'])} ({accuracy_cell(m['bottom5_accuracy']).split(' ±')[0]})"

    for folder in sorted(p for p in before_dir.iterdir() if (p / "summary.json").exists()):
        before = json.loads((folder / "summary.json").read_text())["methods"]
        shipped = ROOT / "scenarios" / "results" / folder.name / "summary.json"
        if not shipped.exists():
            raise FileNotFoundError(f"{folder.relative_to(ROOT)} has no shipped run to compare with: "
                                    f"{shipped.relative_to(ROOT)} is missing")
        after = json.loads(shipped.read_text())["methods"]
        own = after
        if after_dir is not None:
            changed = after_dir / folder.name / "summary.json"
            if not changed.exists():
                raise FileNotFoundError(f"{os.path.relpath(folder, ROOT)} has no run after the change to compare "
                                        f"with: {os.path.relpath(changed, ROOT)} is missing")
            own = json.loads(changed.read_text())["methods"]
        cells = [cell(before.get(method)), cell(own.get(method))]
        for b in baselines:
            central = b.removesuffix("-p2p")
            if b not in after and central != b and central in after:
                cells.append(cell(after[central]) + "*")
                marked = True
            else:
                cells.append(cell(after.get(b)))
        link = os.path.relpath(ROOT / "scenarios" / "results" / folder.name, where.parent)
        rows.append(f"| [{folder.name}]({link}/) | " + " | ".join(cells) + " |")
    if marked:
        rows.append("\n\\* the coordinated form (`local`, `fedavg`, `oracle`): the scenario runs no -p2p form of it")
    return "\n".join(rows)


def draw(text: str, where: Path) -> str:
    """text with every marked table drawn anew."""
    def table(m: re.Match[str]) -> str:
        path = ROOT / m["path"]
        opts = dict(o.split("=", 1) for o in m["opts"].split())
        for named in [m["path"], *(opts[k] for k in ("clean", "after") if k in opts)]:
            if not (ROOT / named).exists():
                raise FileNotFoundError(f"{where.relative_to(ROOT)}: a table is drawn from {named}, which is missing")
        if path.name == "summary.json" and "clean" in opts:
            body = adversaries_table(path, ROOT / opts["clean"])
        elif path.name == "summary.json":
            body = summary_table(path, opts)
        elif path.is_dir() and "before" in opts:
            body = before_after_table(path, opts["before"], where, ROOT / opts["after"] if "after" in opts else None)
        elif (name := path.name + (f"#{opts['part']}" if "part" in opts else "")) in BENCHMARKS:
            body = BENCHMARKS[name](json.loads(path.read_text()))
        else:
            raise ValueError(f"{where.relative_to(ROOT)}: no table is drawn from {m['path']}{m['opts']}")
        return m.group(1) + body + "\n" + m.group(5)

    for marker in MARKER.findall(text):
        if not WELL_FORMED.fullmatch(marker):  # TABLE would pass it by, and its table would go stale unseen
            raise ValueError(f"{where.relative_to(ROOT)}: {marker[:120]!r} is not a table marker (<!-- table: PATH "
                             "NAME=VALUE ... -->, followed by <!-- end table -->)")
    text = TABLE.sub(table, text)
    return HEADLINE.sub(lambda m: m.group(1) + headline() + "\n" + m.group(3), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table differs from its files")
    args = parser.parse_args()
    stale = []
    for path in docs():
        text = path.read_text()
        drawn = draw(text, path)
        if drawn != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(drawn)
    if args.check and stale:
        print("tables not drawn from their files: " + ", ".join(stale) + " (run python3 tools/docs_tables.py)",
              file=sys.stderr)
        return 1
    print(("redrawn: " + ", ".join(stale)) if stale and not args.check else "every table matches its files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
