"""How a p2pfed mesh grows on one machine: wall time, peak memory, bytes per node, membership messages per node
per second and open sockets per process, against the number of nodes N.

For each N of --sizes (in the order given), scenarios/mesh-1000.toml resized to N nodes runs once as `p2pfed run`:
the bundled digits, 5 true clusters, 20 samples drawn per node, pFedLIA-p2p scoring a sample of s = 16 peers at
every size (``all_pairs_up_to = 1``: one algorithm along the whole sweep, where the scenario would score all
pairs up to 100), its nodes in the scenario's 4 worker processes. Each run is a process tree watched from
outside as benchmarks/flower.py watches it (peak proportional set size summed over the tree, in MiB; CPU
seconds; the most sockets each process held open, /proc/PID/fd). From the run folder: ARI, mean accuracy, the
nodes that finished, the bytes they sent; from each node's final record, the membership messages it sent until
then (joins, heartbeats, probes, gossip: not models or notes, and not the bootstrap's), per second of the
method's run, forming included. Each figure is also given as a ratio to the smallest finished N's, measured in
the same sweep.

With --against DIR (another checkout of p2pfed, e.g. `git worktree add DIR COMMIT`), each size runs twice, A B
A B over --repeat pairs: first with DIR's p2pfed (PYTHONPATH), then with this checkout's; each row says which
("code"), and the table gives this checkout's figures as ratios to DIR's of the same pair. --set KEY=VALUE (as
`p2pfed run --set` takes it, repeatable) goes to this checkout's runs alone (DIR's code may not know the key),
e.g. `--against DIR --set mesh.introduce_up_to=1024`, DIR a worktree of this commit: one code, the option's two
sides (pFedLIA-p2p's lazy default past all_pairs_up_to members against the eager form); each row lists what it
was given ("set"). Either way each row also counts, over the run's logs, how often a member took a peer for silent
(suspect) and for dead, per node, and how many of those the peer refuted, heard again later: the false alarms (a
peer that finished and left is rightly dead).

The sweep writes its JSON after every run (a sweep cut short keeps what it measured). A run that fails, times
out or leaves nodes unfinished is a row saying so, with what it measured; its log is kept under --work.

Needs psutil (the `bench` extra: pip install -e ".[bench]").

Run: python benchmarks/scale.py [--sizes 50,100,250,500,1000] [--rounds 12] [--timeout 7200] [--work DIR]
         [--json benchmarks/results/scale.json] [--plot docs/scale.png] [--against DIR [--repeat 2]]
         [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
from tabulate import tabulate

from p2pfed.report.records import read_records

# benchmarks/ is no package: the same watch as the Flower benchmark's, imported from beside this file
sys.path.insert(0, str(Path(__file__).resolve().parent))
from flower import watch_run

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "mesh-1000.toml"
METHOD = "pfedlia-p2p"
PANELS = [("wall_s", "wall time (s)"), ("peak_mb", "peak memory, whole tree (MiB)"),
          ("mb_per_node", "MB sent per node"), ("membership_per_node_s", "membership messages / node / s"),
          ("sockets_per_process", "open sockets, busiest process")]


VERDICT = re.compile(r": (\S+): peer (\S+) (is silent \(suspect\)|is dead|is alive)")


def verdicts(out: Path) -> dict[str, int]:
    """How often members took a peer for silent (suspect) and for dead over the run's logs, and how many of those
    the peer refuted by being heard again later (false alarms: a peer that finished and left is rightly dead)."""
    counts = {"suspect": 0, "dead": 0, "refuted": 0}
    for path in sorted(out.rglob("*.log")):
        doubted: set[tuple[str, str]] = set()
        with open(path, errors="replace") as lines:
            for line in lines:
                m = VERDICT.search(line)
                if m is None:
                    continue
                pair = (m[1], m[2])
                if m[3] == "is alive":
                    if pair in doubted:
                        counts["refuted"] += 1
                        doubted.discard(pair)
                    continue
                counts["suspect" if "suspect" in m[3] else "dead"] += 1
                doubted.add(pair)
    return counts


def one(n: int, rounds: int | None, work: Path, timeout: float, code: Path | None = None, tag: str = "",
        given: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the scenario at n nodes, watched (with code's p2pfed where given); its figures, and why it failed if it
    did."""
    out = work / f"n{n}{tag}"
    if out.exists():  # p2pfed run keeps what a folder holds: the run would measure nothing, and count old logs
        raise SystemExit(f"{out} exists: give --work a folder without earlier runs")
    sets = [f"scenario.nodes={n}", f"methods.{METHOD}.all_pairs_up_to=1",
            *([f"scenario.rounds={rounds}"] if rounds else []), *given]
    cmd = [sys.executable, "-m", "p2pfed", "run", str(SCENARIO), "--out", str(out), "-q"]
    for s in sets:
        cmd += ["--set", s]
    log = work / f"n{n}{tag}.log"
    env = dict(os.environ)
    if code is not None:
        # python -m puts the working folder (this checkout: watch_run's) ahead of PYTHONPATH; PYTHONSAFEPATH leaves
        # it out, here and in the node processes, which inherit both
        env.update(PYTHONPATH=str(code), PYTHONSAFEPATH="1")
    source = subprocess.run([sys.executable, "-c", "import p2pfed; print(p2pfed.__file__)"], env=env, cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    run = watch_run(cmd, env, log, timeout, sockets=True)
    lines = log.read_text(errors="replace").strip().splitlines()
    why = (f"not done within {timeout:.0f} s" if run.timed_out else
           f"exit {run.code}: {next((x for x in reversed(lines) if x.startswith('p2pfed: ')), 'no reason')[:300]}"
           if run.code else "")
    row: dict[str, Any] = {"nodes": n, "wall_s": run.wall_s, "cpu_s": run.cpu_s, "peak_mb": run.peak_mb,
                           "sockets_per_process": max(run.sockets.values(), default=0), "log": str(log),
                           "processes": run.processes, "code": str(code) if code is not None else "this",
                           "p2pfed": source, "set": list(given)}
    seen = verdicts(out)
    row.update({"suspect_per_node": seen["suspect"] / n, "dead_per_node": seen["dead"] / n,
                "refuted_per_node": seen["refuted"] / n})
    try:
        m = json.loads((out / "summary.json").read_text())["methods"][METHOD]
        finals = [r for r in read_records(out / METHOD) if r.get("event") == "final"]
        seconds = max(float(m["seconds"]), 1e-9)
        row.update({"method_s": m["seconds"], "finished": m["nodes_finished"], "rounds_skipped": m["rounds_skipped"],
                    "ari": m["ari"], "accuracy": m["accuracy"], "bottom5_accuracy": m["bottom5_accuracy"],
                    "mb_per_node": m["bytes_sent"] / n / 1e6,
                    "membership_per_node_s": sum(int(f.get("membership_messages", 0)) for f in finals) / n / seconds,
                    "membership_bytes_per_node_s": sum(int(f.get("membership_bytes", 0)) for f in finals) / n
                    / seconds})
    except (OSError, ValueError, KeyError, TypeError) as exc:  # no table: the run's own reason says why
        row["failed"] = why or f"no summary: {exc}"[:300]
        return row
    if why or row["finished"] < n:
        row["failed"] = why or f"{n - row['finished']} of {n} nodes did not finish"
    return row


def with_ratios(rows: list[dict[str, Any]]) -> None:
    """Each figure of each finished row as a ratio to the smallest finished N's (the same sweep)."""
    done = [r for r in rows if "failed" not in r]
    if not done:
        return
    base = min(done, key=lambda r: r["nodes"])
    for r in done:
        r["vs_smallest"] = {"nodes": base["nodes"], **{k: r[k] / base[k] if base[k] else None for k, _ in PANELS}}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Each figure against N, a panel each (log-log: a figure flat in N is a level line, linear a slope of 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = sorted((r for r in rows if "failed" not in r), key=lambda r: r["nodes"])
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        ax.plot([r["nodes"] for r in done], [r[key] for r in done], "o-")
        ax.set(xscale="log", yscale="log", xlabel="nodes N", title=title)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a text table, a row a size (a failed one says why)."""
    body = []
    for r in sorted(rows, key=lambda r: r["nodes"]):
        if "failed" in r:
            body.append([r["nodes"], "failed: " + r["failed"][:120]] + [""] * 9)
            continue
        ari = f"{r['ari']:.3f}" if r["ari"] is not None else "–"
        body.append([r["nodes"], f"{r['finished']}/{r['nodes']}", ari, f"{100 * r['accuracy']:.2f}",
                     f"{r['wall_s']:.0f}", f"{r['cpu_s']:.0f}", f"{r['peak_mb']:.0f}", f"{r['mb_per_node']:.2f}",
                     f"{r['membership_per_node_s']:.2f}", r["sockets_per_process"],
                     f"{r['vs_smallest']['wall_s']:.1f}x"])
    return tabulate(body, headers=["nodes", "finished", "ARI", "accuracy %", "wall s", "CPU s", "peak MiB",
                                   "MB/node", "membership msg/node/s", "sockets (busiest process)",
                                   "wall vs smallest finished"])


AGAINST = [("wall_s", "wall s"), ("cpu_s", "CPU s"), ("peak_mb", "peak MiB"), ("suspect_per_node", "suspect / node"),
           ("dead_per_node", "dead / node"), ("refuted_per_node", "refuted / node")]


def pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The --against runs as (the other checkout's, this one's) pairs, in the order they ran."""
    return [(a, b) for a, b in zip(rows[::2], rows[1::2], strict=False)
            if a["code"] != "this" and b["code"] == "this" and a["nodes"] == b["nodes"]]


def against_table(rows: list[dict[str, Any]]) -> str:
    """Each pair: both runs' figures, and this checkout's as a ratio to the other's."""
    body = []
    for a, b in pairs(rows):
        cells = []
        for key, _ in AGAINST:
            cells += [f"{a[key]:.2f}", f"{b[key]:.2f}", f"{b[key] / a[key]:.2f}" if a[key] else "–"]
        both = [f"{r.get('finished', 0)}/{r['nodes']}, ARI {r['ari']:.3f}, {100 * r['accuracy']:.2f} %"
                if "ari" in r and r["ari"] is not None else r.get("failed", "?")[:60] for r in (a, b)]
        body.append([a["nodes"], *cells, *both])
    return tabulate(body, headers=["nodes", *(f"{t} {w}" for _, t in AGAINST for w in ("before", "after", "ratio")),
                                   "before", "after"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,100,250,500,1000",
                        help="mesh sizes, comma-separated, run in this order (default 50,100,250,500,1000)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds of each run (default: the scenario's)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds a run may take (default 7200)")
    parser.add_argument("--work", type=Path, help="keep each run's folder and log here (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="also write the figures here, after every run")
    parser.add_argument("--plot", type=Path, help="also draw each figure against N here (PNG)")
    parser.add_argument("--against", type=Path, help="another checkout of p2pfed: each size runs with it, then "
                        "with this one, A B A B")
    parser.add_argument("--repeat", type=int, default=1, help="with --against: pairs of runs a size (default 1)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for this checkout's runs alone, as p2pfed run --set takes it (repeatable)")
    args = parser.parse_args()
    if any("=" not in s for s in args.sets):
        parser.error(f"--set takes KEY=VALUE (got {next(s for s in args.sets if '=' not in s)[:80]!r})")
    if args.against is not None and not (args.against / "p2pfed" / "__init__.py").exists():
        parser.error(f"--against takes a checkout of p2pfed (a folder holding p2pfed/__init__.py): {args.against}")
    if not 1 <= args.repeat <= 10 or (args.repeat > 1 and args.against is None):
        parser.error(f"--repeat takes 1..10, with --against (got {args.repeat})")
    try:
        sizes = list(dict.fromkeys(int(x) for x in args.sizes.split(",")))
    except ValueError:
        parser.error(f"--sizes takes whole numbers, comma-separated (got {args.sizes[:80]!r})")
    if min(sizes) < 10 or max(sizes) > 1000 or args.rounds < 0 or 0 < args.rounds < 7:
        parser.error(f"sizes must be in 10..1000 (the mesh's max_peers) and --rounds at least 7 (5 warm up) "
                     f"(got {args.sizes[:80]!r}, {args.rounds})")
    rows: list[dict[str, Any]] = []
    machine = {"cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)}
    with tempfile.TemporaryDirectory(prefix="p2pfed-scale-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runs = [(n, None, "") for n in sizes] if args.against is None else [
            (n, code, f"-{tag}{k}") for n in sizes for k in range(args.repeat)
            for code, tag in ((args.against.resolve(), "against"), (None, "this"))]
        for n, code, tag in runs:
            print(f"{n} nodes{' with ' + str(code) if code else ''} ...", file=sys.stderr, flush=True)
            rows.append(one(n, args.rounds or None, work, args.timeout, code, tag,
                            () if code is not None else tuple(args.sets)))
            if args.against is None:
                with_ratios(rows)
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "processes"}), file=sys.stderr, flush=True)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps({"scenario": str(SCENARIO.relative_to(ROOT)), "method": METHOD,
                                                 "rounds": args.rounds or "the scenario's", "machine": machine,
                                                 "rows": rows}, indent=1) + "\n")
    print(table(rows) if args.against is None else against_table(rows))
    if args.plot:
        plot([r for r in rows if r["code"] == "this"], args.plot)
    return 0 if all("failed" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
