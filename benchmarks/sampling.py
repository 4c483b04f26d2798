"""pFedLIA-p2p scoring all pairs against scoring a sample: clusters, accuracy, bytes and time against N and s.

For each mesh size N, the quickstart's digits workload (5 true clusters, 16 training samples a node) grown to N
nodes runs pFedLIA-p2p once per scoring form, interleaved (every size runs every form before the next size):
"all" scores every peer (``sample = 0``, the paper's), "s=K" scores a sample of about K peers, then the peers
its chosen peers chose (``sample = K``, sampling whatever the mesh's size). Every run is a ``p2pfed run`` of
its own, one process, every node on real sockets. (A sampled form samples its warm-up too: each round's models
go through 3 aggregators.) Read from each run folder: ARI of the groups of mutual
choices, own-cluster share of the chosen peers, mean and bottom-5 % accuracy, bytes sent, the peers a node
scored (mean), its wall time and the process's peak memory; bytes and time also as ratios to "all" of the
same size, measured in the same sweep.

Run: python benchmarks/sampling.py [--sizes 50,100,150] [--samples 8,16] [--rounds 15] [--all-up-to 150]
         [--json benchmarks/results/sampling.json] [--plot docs/sampling.png]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "quickstart.toml"


def scored(run: Path) -> float:
    """The mean number of peers a node scored: the scores of its last choice record."""
    counts = []
    for path in sorted((run / "pfedlia-p2p").glob("*.jsonl")):
        last = None
        for line in path.read_text().splitlines():
            if '"event": "choice"' in line:
                last = json.loads(line)
        if last is not None:
            counts.append(len(last.get("scores", {})))
    return sum(counts) / len(counts) if counts else float("nan")


def one(n: int, sample: int, rounds: int, timeout: float) -> dict[str, Any]:
    """Run the workload at n nodes with sample (0: all pairs); its figures."""
    with tempfile.TemporaryDirectory(prefix="p2pfed-sampling-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "p2pfed", "run", str(SCENARIO), "--out", str(out),
               "--set", f"scenario.nodes={n}", "--set", f"scenario.rounds={rounds}",
               "--set", "scenario.methods=['pfedlia-p2p']",
               "--set", f"methods.pfedlia-p2p.sample={sample}", "--set", "methods.pfedlia-p2p.all_pairs_up_to=1"]
        start = time.monotonic()
        with open(Path(tmp) / "stderr", "w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            watchdog = threading.Timer(timeout, proc.kill)
            watchdog.start()
            _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak memory, not the sweep's
            watchdog.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.monotonic() - start
            err.seek(0)
            tail = " ".join(err.read().strip().splitlines()[-1:])
        peak = usage.ru_maxrss / 1024  # KiB on Linux
        if wall >= timeout:
            return {"nodes": n, "form": form_name(sample), "failed": f"not done within {timeout:.0f} s"}
        if proc.returncode != 0 or not (out / "summary.json").exists():
            return {"nodes": n, "form": form_name(sample), "failed": f"exit {proc.returncode}: {tail[:200]}"}
        m = json.loads((out / "summary.json").read_text())["methods"]["pfedlia-p2p"]
        return {"nodes": n, "form": form_name(sample), "sample": sample, "ari": m["ari"],
                "own_cluster_peers": m["own_cluster_peers"], "accuracy": m["accuracy"],
                "bottom5_accuracy": m["bottom5_accuracy"], "bytes_per_node": m["bytes_sent"] / n,
                "scored_per_node": scored(out), "seconds": wall, "finished": m["nodes_finished"], "peak_mb": peak}


def form_name(sample: int) -> str:
    return "all" if sample == 0 else f"s={sample}"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """ARI, accuracy and partial models scored per node against N, a line per form."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [("ari", "ARI (groups of mutual choices)"), ("accuracy", "mean accuracy"),
              ("scored_per_node", "peers scored per node"), ("bytes_per_node", "MB sent per node")]
    for form in dict.fromkeys(r["form"] for r in rows):
        mine = [r for r in rows if r["form"] == form and "failed" not in r]
        for ax, (key, title) in zip(axes, panels, strict=True):
            scale = 1e-6 if key == "bytes_per_node" else 1.0
            ax.plot([r["nodes"] for r in mine], [r[key] * scale for r in mine], marker="o", label=form)
            ax.set_title(title)
            ax.set_xlabel("nodes")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,100,150", help="mesh sizes, comma-separated (default 50,100,150)")
    parser.add_argument("--samples", default="8,16", help="sample sizes s beside all pairs (default 8,16)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of each run (default 15: 5 warm-up)")
    parser.add_argument("--all-up-to", type=int, default=150,
                        help="run all pairs only up to this size (its N² work outgrows the machine past it)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take before it fails")
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    parser.add_argument("--plot", type=Path, help="also draw ARI, accuracy, peers scored and bytes against N")
    args = parser.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
        samples = [0] + [int(x) for x in args.samples.split(",") if x]
    except ValueError:
        parser.error(f"--sizes and --samples take whole numbers, comma-separated (got {args.sizes!r}, "
                     f"{args.samples!r})")
    if min(sizes) < 2 or min(samples[1:], default=1) < 1:
        parser.error(f"sizes must be at least 2 and samples at least 1 (all pairs is always run; got {args.sizes!r}, "
                     f"{args.samples!r})")
    rows: list[dict[str, Any]] = []
    for n in sizes:
        for sample in samples:
            if sample == 0 and n > args.all_up_to:
                rows.append({"nodes": n, "form": "all", "failed": f"not run (past --all-up-to {args.all_up_to})"})
                continue
            print(f"{n} nodes, {form_name(sample)} ...", file=sys.stderr, flush=True)
            row = one(n, sample, args.rounds, args.timeout)
            reference = next((r for r in rows if r["nodes"] == n and r["form"] == "all" and "failed" not in r), None)
            if reference is not None and "failed" not in row:
                row["bytes_vs_all"] = row["bytes_per_node"] / reference["bytes_per_node"]
                row["seconds_vs_all"] = row["seconds"] / reference["seconds"]
                row["scored_vs_all"] = row["scored_per_node"] / reference["scored_per_node"]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    table = [[r["nodes"], r["form"], *(["failed: " + r["failed"]] + [""] * 9 if "failed" in r else [
        f"{r['ari']:.3f}" if r["ari"] is not None else "–", f"{100 * (r['own_cluster_peers'] or 0):.1f}",
        f"{100 * r['accuracy']:.2f}", f"{100 * r['bottom5_accuracy']:.2f}", f"{r['scored_per_node']:.1f}",
        f"{r['bytes_per_node'] / 1e6:.2f}", f"{r['seconds']:.0f}", f"{r['peak_mb']:.0f}",
        f"{r.get('bytes_vs_all', 1.0):.2f} / {r.get('seconds_vs_all', 1.0):.2f}"])] for r in rows]
    print(tabulate(table, headers=["nodes", "scoring", "ARI", "own-cluster %", "accuracy %", "bottom-5 %",
                                   "scored/node", "MB/node", "seconds", "peak MB", "bytes / time vs all"]))
    if args.json:
        args.json.write_text(json.dumps({"scenario": "quickstart.toml", "rounds": args.rounds, "rows": rows},
                                        indent=1) + "\n")
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
