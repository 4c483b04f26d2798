"""What a member that moves no model costs to start: a bootstrap, and `p2pfed mesh status`.

Measured in one run, interleaved, --repeat times each (medians), each in a fresh process and a fresh key folder:
- torch imported, nothing else (`python3 -c "import torch"`): the reference, what any learning node pays first;
- `p2pfed bootstrap`: seconds from its start until its port takes a TCP connection, and its resident memory a
  second later;
- `p2pfed mesh status --join` that bootstrap's ticket: seconds until it has printed the table and exited.
With --before TREE (a checkout of other code, e.g. `git worktree add --detach /tmp/before HEAD~1`), the last two
rows are measured for that tree too, interleaved with this one's.

Run: python3 benchmarks/start.py [--repeat 5] [--before TREE] [--json benchmarks/results/start.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parents[1]
TICKET = re.compile(r"--join (tcp://\S+/[0-9a-f]{64})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_of(tree: Path, home: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "HOME": home}


def import_torch() -> tuple[float, float]:
    """Seconds and MiB of a process that imports torch and nothing else (its memory read just before it ends)."""
    code = ("import resource, time; t = time.monotonic(); import torch; "
            "print(time.monotonic() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return time.monotonic() - start, float(out[1])


def bootstrap(tree: Path) -> tuple[float, float, float]:
    """A bootstrap of tree's code: seconds until it listens, its MiB a second later, and the seconds a
    `mesh status` of it takes."""
    port, home = free_port(), tempfile.mkdtemp(prefix="p2pfed-start-")
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "p2pfed", "bootstrap", "--bind", f"tcp://127.0.0.1:{port}"],
                            cwd=tree, env=env_of(tree, home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the bootstrap of {tree} ended: {proc.communicate()[0][-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.01)
        listening = time.monotonic() - start
        time.sleep(1.0)
        rss = psutil.Process(proc.pid).memory_info().rss / 2**20
        assert proc.stdout is not None
        line = ""
        while not TICKET.search(line):  # its ticket line, printed once it listens
            line = proc.stdout.readline()
        ticket = TICKET.search(line).group(1)  # type: ignore[union-attr]
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "p2pfed", "mesh", "status", "--join", ticket], cwd=tree,
                       env=env_of(tree, home), capture_output=True, check=True, timeout=60)
        return listening, rss, time.monotonic() - start
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", type=Path, help="a checkout of other code, measured interleaved with this one")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = {"this": HERE, **({"before": args.before.resolve()} if args.before else {})}
    torch_runs: list[tuple[float, float]] = []
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in trees}
    for i in range(args.repeat):
        torch_runs.append(import_torch())
        for name, tree in trees.items():
            runs[name].append(bootstrap(tree))
        print(f"{i + 1}/{args.repeat}", file=sys.stderr)
    ref_s = statistics.median(t for t, _ in torch_runs)
    ref_mb = statistics.median(m for _, m in torch_runs)
    rows = [{"what": "python3 -c 'import torch' (reference)", "s": ref_s, "mib": ref_mb, "x_s": 1.0, "x_mib": 1.0}]
    for name, got in runs.items():
        listen = statistics.median(r[0] for r in got)
        mib = statistics.median(r[1] for r in got)
        status = statistics.median(r[2] for r in got)
        rows.append({"what": f"p2pfed bootstrap, listening ({name})", "s": listen, "mib": mib,
                     "x_s": listen / ref_s, "x_mib": mib / ref_mb})
        rows.append({"what": f"p2pfed mesh status of it ({name})", "s": status, "mib": None,
                     "x_s": status / ref_s, "x_mib": None})
    for row in rows:
        mib = f"{row['mib']:.0f} MiB" if row["mib"] is not None else ""
        print(f"{row['what']:48s} {row['s']:6.2f} s ({row['x_s']:.2f}x)  {mib}")
    if args.json:
        args.json.write_text(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} cores",
                                         "command": "python3 " + " ".join(sys.argv), "repeat": args.repeat,
                                         "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
