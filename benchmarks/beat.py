"""What one heartbeat period costs a member in work on its own table, against the table's size.

Each period a member sweeps its peer table (who fell silent), finds its partners, heartbeats them and the
bootstrap, picks whom to probe and closes idle connections (Endpoint._beat). A member of a deployment pays that
once a period; the members of one scripted process pay it each, so at 1,000 nodes in 4 worker processes a process
pays it for 250 tables of 1,000 peers every period. This times that work alone: a member (real sockets on TCP
loopback, no keys, the scale scenario's 2 s period) whose table holds N peers, most alive and not heard from
lately (under the probing membership their silence is not timed), `--partners` of them worked with, one a
bootstrap and `--dead` of them dead, runs `--periods` periods back to back (medians). Heartbeats to the
partners go to addresses nobody listens at (the send is refused at once), so no peer's answer is timed, only
the member's own work.

The reference, measured in the same run and process: one pass over the table that reads each peer's state
(`[p for p in table.values() if p.state == "alive"]`). With --before TREE (a checkout of other code, e.g.
`git worktree add --detach /tmp/before HEAD~1`) the same is measured for that tree, interleaved with this one's
(A B A B, each size in a fresh process of its own).

Run: python3 benchmarks/beat.py [--sizes 100,250,1000] [--periods 200] [--rounds 3] [--before TREE]
     [--json benchmarks/results/beat.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

# The member's side, run in a process of its own with the tree's code first on the path: prints a JSON line.
CHILD = r"""
import asyncio, json, logging, statistics, sys, time
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.net.membership import ALIVE, DEAD, Peer

n, periods, partners, dead = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
logging.disable(logging.CRITICAL)

async def main():
    e = Endpoint("me", options=MeshOptions(insecure=True, heartbeat=2.0, suspect_after=5, dead_after=15))
    await e.start("tcp://127.0.0.1:0")
    now = time.monotonic()
    dead_from = n - int(dead * n)
    for i in range(n):
        # ports nobody listens at: a heartbeat there is refused at once (IMMEDIATE), no answer is timed
        e.peers.peers[f"p{i:05d}"] = Peer(f"p{i:05d}", f"tcp://127.0.0.1:{20000 + i}", "bootstrap" if i == 0 else
                                         "node", 1, "", DEAD if i >= dead_from else ALIVE, now, period=2.0,
                                         dead_since=now if i >= dead_from else None)
    for i in range(1, 1 + partners):
        e.peers.touched(f"p{i:05d}")
    table = e.peers.peers
    beats, passes = [], []
    for _ in range(periods):
        t0 = time.perf_counter()
        e._beat(time.monotonic(), 0.0)
        beats.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        [p for p in table.values() if p.state == "alive"]
        passes.append(time.perf_counter() - t0)
    for task in list(e._probes):
        task.cancel()
    await e.stop(leave=False)
    print(json.dumps({"beat_s": statistics.median(beats), "pass_s": statistics.median(passes),
                      "table": len(table)}))

asyncio.run(main())
"""


def measure(tree: Path, n: int, periods: int, partners: int, dead: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(periods), str(partners), str(dead)], cwd=tree,
                         env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{tree}: the member's process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,250,1000", help="peers in the table, comma-separated (at most 1,024)")
    ap.add_argument("--periods", type=int, default=200, help="periods timed in each process")
    ap.add_argument("--rounds", type=int, default=3, help="processes per tree and size, interleaved")
    ap.add_argument("--partners", type=int, default=10, help="peers worked with lately (heartbeated, timed)")
    ap.add_argument("--dead", type=float, default=0.1, help="share of the table dead (probed now and then)")
    ap.add_argument("--before", type=Path, help="a checkout of other code, measured interleaved with this one")
    ap.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes takes whole numbers, comma-separated (got {args.sizes!r})")
    if any(not 1 <= s <= 1024 for s in sizes):
        ap.error("--sizes: each between 1 and 1024 (a member's table holds at most max_peers = 1,024)")
    if args.before is not None and not (args.before / "p2pfed" / "__init__.py").exists():
        ap.error(f"--before takes a checkout of p2pfed (a folder holding p2pfed/__init__.py): {args.before}")
    trees = {"this": HERE, **({"before": args.before.resolve()} if args.before else {})}
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(t, n): [] for t in trees for n in sizes}
    for r in range(args.rounds):
        for n in sizes:
            for label, tree in trees.items():
                runs[label, n].append(measure(tree, n, args.periods, args.partners, args.dead))
                print(f"round {r + 1}/{args.rounds}: {label}, {n} peers: "
                      f"{1e6 * runs[label, n][-1]['beat_s']:.0f} us a period", flush=True)
    rows = []
    for n in sizes:
        for label in trees:
            beat = statistics.median(x["beat_s"] for x in runs[label, n])
            ref = statistics.median(x["pass_s"] for x in runs[label, n])
            rows.append({"code": label, "peers": n, "beat_us": 1e6 * beat, "pass_us": 1e6 * ref,
                         "x_pass": beat / ref,
                         # the members of one process of a scripted run of n nodes in 4 worker processes
                         "process_core_share": beat * (n / 4) / 2.0})
    print(f"\n{'code':<8}{'peers':>7}{'us a period':>13}{'x one pass':>12}{'core share, n/4 members':>26}")
    for row in rows:
        print(f"{row['code']:<8}{row['peers']:>7}{row['beat_us']:>13.0f}{row['x_pass']:>12.1f}"
              f"{row['process_core_share']:>26.3f}")
    if args.before:
        for n in sizes:
            this, before = (next(r for r in rows if r["code"] == c and r["peers"] == n) for c in ("this", "before"))
            print(f"{n} peers: this / before = {this['beat_us'] / before['beat_us']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "periods": args.periods, "rounds": args.rounds, "partners": args.partners, "dead": args.dead,
            "command": " ".join(["python3", "benchmarks/beat.py", *sys.argv[1:]]), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
