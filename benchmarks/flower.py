"""p2pfed against Flower on one FedAvg workload, runs interleaved A B A B, each figure a ratio to Flower's.

The workload (issue 29): FedAvg over 100 clients of Fashion-MNIST's pathological partition
(scenarios/fmnist-pathological.toml), 20 rounds, 10 % of the clients training each round, the small CNN, every
client evaluated every round. p2pfed runs it as `p2pfed run` does (a coordinator and 100 nodes over ZeroMQ, the
scenario's worker processes); Flower runs it in its simulation engine (benchmarks/flower_fedavg.py: the same
partition indices, initial weights, local training and its seeds, and clients drawn; Flower's FedAvg and Ray).

Each run is a process tree watched from outside (psutil, every 0.5 s): its peak memory (the proportional set
size summed over the tree, so pages shared between processes count once) and its CPU seconds. From each
side's own round records: start-up (launch to the first round's start), the steady round time (mean of rounds
2..R), and the clients' mean accuracy at the end.

Needs flwr (the `bench` extra: pip install -e ".[bench]"), in this Python or the one --flower-python names.
Both sides are sized alike: p2pfed runs --workers node processes (default: the scenario's, 4), Flower as many
client actors (client_resources num_cpus = cores / workers). Both map one copy of the dataset
written by their launcher (p2pfed's runner; the Flower driver, with p2pfed's share), so the memory compared is
the engines'. p2pfed also evaluates every client once more at the end (its "finish"), writes checkpoints and
draws the run folder's report and plots: all counted in its wall and CPU time.

Run: python benchmarks/flower.py [--pairs 2] [--nodes 100] [--rounds 20] [--workers N] [--flower-python PY]
[--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "fmnist-pathological.toml"


@dataclass
class Run:
    """One side's figures in one run."""

    side: str
    wall_s: float
    startup_s: float
    round_s: float  # steady round time: mean of rounds 2..R
    cpu_s: float
    peak_mb: float  # peak proportional set size of the process tree
    accuracy: float  # mean over the clients of their last accuracy
    processes: dict[str, Any] = field(default_factory=dict)  # Watch.processes: what the memory went to


class Watch:
    """The CPU seconds and peak memory of a process tree, sampled from outside."""

    def __init__(self, root: int, every: float = 0.5, sockets: bool = False) -> None:
        self.root, self.every, self.count_sockets = root, every, sockets
        self.cpu: dict[tuple[int, float], float] = {}  # (pid, start) -> its last user + system seconds seen
        self.peak = 0.0
        self.each: dict[int, tuple[str, float]] = {}  # pid -> what it is, its peak proportional set size
        self.sockets: dict[int, int] = {}  # pid -> the most sockets it held open at once (with sockets=True)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.root)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _run(self) -> None:
        while not self.stop.is_set():
            total = 0.0
            for p in self._tree():
                try:
                    t = p.cpu_times()
                    self.cpu[(p.pid, p.create_time())] = t.user + t.system
                    pss = p.memory_full_info().pss
                    total += pss
                    # named as last seen: a process first seen as a shell may exec Python (one of Flower's tree
                    # was counted as an 878 MB bash while it was named as first seen)
                    self.each[p.pid] = (kind_of(p), max(pss, self.each.get(p.pid, ("", 0.0))[1]))
                    if self.count_sockets:
                        self.sockets[p.pid] = max(open_sockets(p.pid), self.sockets.get(p.pid, 0))
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            self.peak = max(self.peak, total)
            self.stop.wait(self.every)

    def close(self) -> tuple[float, float]:
        """CPU seconds, peak MB."""
        self.stop.set()
        self.thread.join()
        return sum(self.cpu.values()), self.peak / 2**20

    def processes(self) -> dict[str, dict[str, float]]:
        """What the memory went to: for each kind of process, how many ran and their peaks' sum (MB; each at
        its own peak, so the sum may exceed the tree's peak)."""
        kinds: dict[str, dict[str, float]] = {}
        for label, peak in self.each.values():
            k = kinds.setdefault(label, {"count": 0, "peak_mb": 0.0})
            k["count"] += 1
            k["peak_mb"] = round(k["peak_mb"] + peak / 2**20, 1)
        return dict(sorted(kinds.items(), key=lambda kv: -kv[1]["peak_mb"]))


def open_sockets(pid: int) -> int:
    """The sockets a process holds open now (its /proc/PID/fd entries that are sockets)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue  # closed meanwhile
    return count


def kind_of(p: psutil.Process) -> str:
    """A process's kind: `p2pfed run`, `p2pfed node` (a worker), Flower's driver, a Ray process by its name."""
    cmd = p.cmdline()
    if "p2pfed" in cmd[:3]:
        return "p2pfed " + cmd[cmd.index("p2pfed") + 1]
    if any(c.endswith("flower_fedavg.py") for c in cmd[:2]):
        return "flower driver (ServerApp, simulation engine)"
    name = p.name()
    return f"ray {cmd[0].split()[0]}" if cmd and cmd[0].startswith("ray::") else name


@dataclass
class Watched:
    """What a watched run cost, and how it ended."""

    launched: float  # time.time() at launch
    wall_s: float
    cpu_s: float
    peak_mb: float  # peak proportional set size of the tree, MiB
    processes: dict[str, Any]  # Watch.processes: what the memory went to
    code: int  # its exit status (-9 when killed at the timeout)
    sockets: dict[int, int]  # pid -> the most sockets it held open at once (watch_run(sockets=True))
    timed_out: bool = False


def watch_run(cmd: list[str], env: dict[str, str], log: Path, timeout: float | None = None,
              sockets: bool = False) -> Watched:
    """Run cmd, watched from outside; a run past timeout seconds is killed, its whole tree."""
    launched = time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    timed_out = False
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**env, "P2PFED_BENCH_LAUNCHED":
                                                                                 str(launched)}, cwd=ROOT)
        watch = Watch(proc.pid, sockets=sockets)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            for child in [*psutil.Process(proc.pid).children(recursive=True), proc]:
                with contextlib.suppress(psutil.Error, OSError):
                    child.kill()
            code = proc.wait()
    wall = time.time() - launched
    sampled, peak = watch.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the samples miss each process's last half second, the kernel's count the descendants nobody waited for
    cpu = max(sampled, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
    return Watched(launched, wall, cpu, peak, watch.processes(), code, watch.sockets, timed_out)


LOG_TAIL = 12  # lines of a failed run's output the benchmark prints


RUN_LIMIT = 1800.0  # seconds: a side's run takes under two minutes here; one past this hangs (it is killed)


def watched(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, float, float, float, dict[str, Any]]:
    """Run cmd, watched: launch time, wall seconds, CPU seconds, peak MB, what the memory went to; a run that
    fails or hangs stops the benchmark with the end of its output (its log lies in the benchmark's temporary
    folder, which is gone once the benchmark stops)."""
    run = watch_run(cmd, env, log, timeout=RUN_LIMIT)
    if run.code != 0:
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL:] if log.exists() else []
        how = f"was stopped after {RUN_LIMIT:.0f} s" if run.timed_out else f"exited with {run.code}"
        raise SystemExit(f"{' '.join(cmd[:4])} ... {how}; the end of its output:\n" + ("\n".join(lines) or "(none)"))
    return run.launched, run.wall_s, run.cpu_s, run.peak_mb, run.processes


def overrides(nodes: int, rounds: int) -> list[str]:
    return ["scenario.methods=['fedavg']", f"scenario.nodes={nodes}", f"scenario.rounds={rounds}",
            "train.eval_every=1"]


def p2pfed_overrides(nodes: int, rounds: int, workers: int) -> list[str]:
    """The workload, and p2pfed's node processes sized to the machine as Flower's actors are (one a core)."""
    return [*overrides(nodes, rounds), f"scenario.workers={workers}"]


def run_p2pfed(nodes: int, rounds: int, workers: int, work: Path, tag: str) -> Run:
    out = work / f"p2pfed-{tag}"
    cmd = [sys.executable, "-m", "p2pfed", "run", str(SCENARIO), "--out", str(out), "-q"]
    for o in p2pfed_overrides(nodes, rounds, workers):
        cmd += ["--set", o]
    launched, wall, cpu, peak, processes = watched(cmd, dict(os.environ), work / f"p2pfed-{tag}.log")
    rows = [json.loads(line) for line in (out / "fedavg" / "coordinator.jsonl").read_text().splitlines()]
    rounds_seen = [r for r in rows if r.get("event") == "round"]
    ends = [r["time"] for r in rounds_seen]
    start = rounds_seen[0]["time"] - rounds_seen[0]["seconds"]
    summary = json.loads((out / "summary.json").read_text())["methods"]["fedavg"]
    return Run("p2pfed", wall, start - launched, (ends[-1] - ends[0]) / (len(ends) - 1), cpu, peak,
               summary["accuracy"], processes)


def run_flower(python: str, nodes: int, rounds: int, workers: int, work: Path, tag: str) -> Run:
    result = work / f"flower-{tag}.json"
    cpus = (os.cpu_count() or 1) / workers  # as many client actors as p2pfed has node processes
    cmd = [python, str(ROOT / "benchmarks" / "flower_fedavg.py"), str(SCENARIO), str(result),
           "--client-cpus", f"{cpus:g}"]
    for o in overrides(nodes, rounds):
        cmd += ["--set", o]
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONPATH": str(ROOT)}
    launched, wall, cpu, peak, processes = watched(cmd, env, work / f"flower-{tag}.log")
    t = json.loads(result.read_text())
    ends = t["round_end"]
    accuracy = statistics.fmean(t["accuracy"].values())
    return Run("flower", wall, t["round_start"][0] - launched, (ends[-1] - ends[0]) / (len(ends) - 1), cpu, peak,
               accuracy, processes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="runs of each side, interleaved (default 2)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=0,
                        help="p2pfed's node processes, and Flower's client actors (default: the scenario's, 4)")
    parser.add_argument("--flower-python", default=sys.executable, help="a Python with flwr[simulation] installed")
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    args = parser.parse_args()
    if args.rounds < 2 or args.nodes < 2 or args.pairs < 1:
        parser.error("--rounds and --nodes must be at least 2 and --pairs at least 1")
    check = subprocess.run([args.flower_python, "-c", "import flwr, ray; print(flwr.__version__, ray.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        parser.error(f"{args.flower_python} has no flwr[simulation]: pip install -e '.[bench]' (or name a Python "
                     "that has it with --flower-python)")
    flwr_version, ray_version = check.stdout.split()
    if args.workers <= 0:
        from p2pfed.scenario.config import load_scenario
        args.workers = load_scenario(SCENARIO).workers
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="p2pfed-flower-") as tmp:
        work = Path(tmp)
        for i in range(args.pairs):
            for side in ("p2pfed", "flower"):
                run = (run_p2pfed(args.nodes, args.rounds, args.workers, work, str(i)) if side == "p2pfed"
                       else run_flower(args.flower_python, args.nodes, args.rounds, args.workers, work, str(i)))
                runs.append(run)
                print(f"  {side:7s} run {i + 1}: wall {run.wall_s:6.1f} s, start-up {run.startup_s:5.1f} s, "
                      f"round {run.round_s:5.2f} s, CPU {run.cpu_s:6.1f} s, peak {run.peak_mb:6.0f} MB, "
                      f"accuracy {100 * run.accuracy:.2f} %", flush=True)
    figures = {"workload": {"scenario": str(SCENARIO.relative_to(ROOT)), "nodes": args.nodes, "rounds": args.rounds,
                            "overrides": overrides(args.nodes, args.rounds),
                            "p2pfed_overrides": p2pfed_overrides(args.nodes, args.rounds, args.workers)},
               "machine": {"cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)},
               "flwr": flwr_version, "ray": ray_version, "runs": [asdict(r) for r in runs]}
    medians = {side: {k: statistics.median(getattr(r, k) for r in runs if r.side == side)
                      for k in ("wall_s", "startup_s", "round_s", "cpu_s", "peak_mb", "accuracy")}
               for side in ("p2pfed", "flower")}
    figures["median"] = medians
    print(f"\np2pfed against Flower {flwr_version} (median of {args.pairs} interleaved runs each; < 1 is p2pfed "
          "ahead, except accuracy)")
    for k, what in (("round_s", "steady round time"), ("startup_s", "start-up"), ("wall_s", "wall time"),
                    ("cpu_s", "CPU seconds"), ("peak_mb", "peak memory"), ("accuracy", "accuracy")):
        print(f"  {what:18s} {medians['p2pfed'][k]:9.2f} / {medians['flower'][k]:9.2f} = "
              f"{medians['p2pfed'][k] / medians['flower'][k]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
