"""What the keys cost a whole run: the quickstart (scenarios/quickstart.toml, 20 nodes, five methods over
TCP loopback) timed with CURVE keys (the default) and with --insecure, alternately, in the same session.

Each pair runs one after the other, so a machine that slows down mid-benchmark slows both sides; the figure
is the median of the per-pair ratios. Accuracy is read from each run's summary.json: the keys change how the
bytes travel, not what is learned.

Run: python benchmarks/quickstart.py [--pairs 3] [--json benchmarks/results/quickstart-keys.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.toml"


def one_run(out: Path, insecure: bool) -> tuple[float, dict[str, float]]:
    """Wall seconds of `p2pfed run` of the quickstart into out, and each method's mean accuracy."""
    cmd = [sys.executable, "-m", "p2pfed", "run", str(SCENARIO), "--out", str(out), "--quiet"]
    t0 = time.perf_counter()
    subprocess.run([*cmd, *(["--insecure"] if insecure else [])], check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    methods = json.loads((out / "summary.json").read_text())["methods"]
    return seconds, {m: row["accuracy"] for m, row in methods.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    args = parser.parse_args()
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            keyed = one_run(Path(tmp) / f"keyed-{i}", insecure=False)
            plain = one_run(Path(tmp) / f"insecure-{i}", insecure=True)
            pairs.append({"keyed_s": keyed[0], "insecure_s": plain[0], "ratio": keyed[0] / plain[0],
                          "keyed_accuracy": keyed[1], "insecure_accuracy": plain[1]})
            print(f"pair {i + 1}: keys {keyed[0]:.1f} s, --insecure {plain[0]:.1f} s, "
                  f"ratio {keyed[0] / plain[0]:.3f}", flush=True)
    ratio = statistics.median(p["ratio"] for p in pairs)
    print(f"\nquickstart with CURVE keys (the default): {ratio:.3f}x the time of --insecure "
          f"(median of {args.pairs} pairs)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"scenario": SCENARIO.name, "pairs": pairs, "median_ratio": ratio},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
