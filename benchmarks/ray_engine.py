"""What Ray's placement costs: one scenario run with the local engine and with `--engine ray` (a Ray cluster of this
machine, started for the run), runs interleaved A B A B, each figure a ratio to the local engine's.

The workload: the quickstart (or --scenario FILE) grown to --nodes nodes (the bundled digits, 5 true clusters,
pFedLIA-p2p), --rounds rounds, in --workers worker processes: local processes, or as many Ray actors. Each run is
a process tree watched from outside as benchmarks/flower.py watches it (peak proportional set size, CPU seconds),
so Ray's own processes (its control store, its raylet, the actors' worker processes) are counted. From the run
folder: the table's accuracy and ARI, which must be equal on both engines for the same seed, and the seconds the
method ran.

Needs Ray (the `ray` extra: pip install -e '.[ray]') and psutil (the `bench` extra, or pip install psutil).

Run: python benchmarks/ray_engine.py [--pairs 2] [--nodes 100] [--rounds 10] [--workers 4] [--scenario FILE]
[--ray-first] [--json FILE]. The JSON is written again after every run, so a long comparison cut short keeps the
runs it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

# benchmarks/ is no package: the same watch as the Flower benchmark's, imported from beside this file
sys.path.insert(0, str(Path(__file__).resolve().parent))
from flower import watched

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "quickstart.toml"
METHOD = "pfedlia-p2p"


@dataclass
class Run:
    """One engine's figures in one run."""

    engine: str
    wall_s: float
    method_s: float  # the method's own seconds (run.json): from its bootstrap's start to its last node's end
    cpu_s: float
    peak_mb: float
    accuracy: float
    ari: float | None
    finished: str
    processes: dict[str, Any] = field(default_factory=dict)  # what the memory went to, by kind of process


def overrides(nodes: int, rounds: int, workers: int) -> list[str]:
    return [f"scenario.nodes={nodes}", f"scenario.rounds={rounds}", f"scenario.workers={workers}",
            f"scenario.methods=['{METHOD}']"]


def run_once(scenario: Path, engine: str, nodes: int, rounds: int, workers: int, work: Path, tag: str) -> Run:
    out = work / f"{engine}-{tag}"
    cmd = [sys.executable, "-m", "p2pfed", "run", str(scenario), "--out", str(out), "-q", "--engine", engine]
    for o in overrides(nodes, rounds, workers):
        cmd += ["--set", o]
    _, wall, cpu, peak, processes = watched(cmd, dict(os.environ), work / f"{engine}-{tag}.log")
    summary = json.loads((out / "summary.json").read_text())["methods"][METHOD]
    return Run(engine, wall, summary["seconds"], cpu, peak, summary["accuracy"], summary["ari"],
               f"{summary['nodes_finished']}/{summary['nodes']}", processes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="runs of each engine, interleaved (default 2)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4, help="worker processes: local, or Ray actors (default 4)")
    parser.add_argument("--scenario", type=Path, default=SCENARIO,
                        help="the scenario grown to --nodes (default scenarios/quickstart.toml)")
    parser.add_argument("--ray-first", action="store_true",
                        help="each pair's Ray run before its local one (a long comparison learns first whether Ray's "
                             "run goes through)")
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ray.md is drawn from)")
    args = parser.parse_args()
    scenario = args.scenario.resolve()
    if args.nodes < 2 or args.rounds < 7 or args.pairs < 1 or args.workers < 1:
        parser.error("--nodes must be at least 2, --rounds at least 7 (the quickstart warms up for 5), --pairs and "
                     "--workers at least 1")
    try:
        import ray
    except ImportError:
        parser.error("needs Ray: pip install -e '.[ray]'")
    runs: list[Run] = []
    order = ("ray", "local") if args.ray_first else ("local", "ray")
    with tempfile.TemporaryDirectory(prefix="p2pfed-ray-bench-") as tmp:
        for i in range(args.pairs):
            for engine in order:
                run = run_once(scenario, engine, args.nodes, args.rounds, args.workers, Path(tmp), str(i))
                runs.append(run)
                print(f"  {engine:5s} run {i + 1}: wall {run.wall_s:6.1f} s, method {run.method_s:6.1f} s, CPU "
                      f"{run.cpu_s:6.1f} s, peak {run.peak_mb:6.0f} MB, accuracy {100 * run.accuracy:.2f} %, "
                      f"ARI {run.ari}, finished {run.finished}", flush=True)
                figures = figures_of(runs, scenario, args, ray.__version__)
                if args.json:  # after every run: hours of runs are not lost to one cut short
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    medians, same = figures["median"], figures["same_table"]
    print(f"\nRay {ray.__version__} against the local engine (median of {args.pairs} interleaved runs each; > 1 is "
          "Ray costing more)")
    for k, what in (("wall_s", "wall time"), ("method_s", "method's seconds"), ("cpu_s", "CPU seconds"),
                    ("peak_mb", "peak memory")):
        print(f"  {what:17s} {medians['ray'][k]:9.1f} / {medians['local'][k]:9.1f} = "
              f"{medians['ray'][k] / medians['local'][k]:.2f}")
    print(f"  accuracy and ARI the same in every run: {same}")
    return 0


def figures_of(runs: list[Run], scenario: Path, args: argparse.Namespace, version: str) -> dict[str, Any]:
    """What the JSON holds: the workload, the machine, every run, and each engine's medians (of the runs so far)."""
    medians = {engine: {k: statistics.median(getattr(r, k) for r in runs if r.engine == engine)
                        for k in ("wall_s", "method_s", "cpu_s", "peak_mb", "accuracy")}
               for engine in ("local", "ray") if any(r.engine == engine for r in runs)}
    where = scenario.relative_to(ROOT) if scenario.is_relative_to(ROOT) else scenario
    return {"workload": {"scenario": str(where), "method": METHOD,
                         "overrides": overrides(args.nodes, args.rounds, args.workers)},
            "machine": {"cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)},
            "ray": version, "runs": [asdict(r) for r in runs], "median": medians,
            "same_table": len({(r.accuracy, r.ari) for r in runs}) == 1}


if __name__ == "__main__":
    sys.exit(main())
