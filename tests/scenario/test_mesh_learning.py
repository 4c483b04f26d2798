"""Learning over real sockets: a small digits mesh clusters correctly, a late joiner picks its true
cluster's peers, a crashed node restarts from its checkpoint, and the run folder keeps its contract."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from p2pfed.launch.runner import devices_said, run_scenario
from p2pfed.scenario.config import load_scenario

SCENARIO = """
[scenario]
name = "test-mesh"
seed = 1
nodes = 9
rounds = 30
methods = {methods}
processes = {processes}

[data]
dataset = "digits"
partition.kind = "pathological"
partition.clusters = 3

[train]
model = "cnn"
epochs = 1
lr = 0.05
participation = 1.0
round_timeout = 20

[methods.pfedlia-p2p]
warmup_rounds = 3
lia_epochs = 10
lia_batch = 60

[methods.pfedlia-central]
warmup_rounds = 3
lia_epochs = 10
lia_batch = 60

[mesh]
heartbeat = 0.3
{events}
"""

LATE_AND_CRASH = """
[[events]]
round = 5
action = "join"
node = 8
via = 0  # through a live node of another cluster, not the bootstrap: it learns the whole mesh all the same

[[events]]
round = 6
action = "crash"
node = 1
restart_after = 1

[[events]]
round = 6
action = "slow"
node = 4
delay = 0.5
"""


def write(tmp_path: Path, methods: str = '["pfedlia-p2p"]', processes: str = "false", events: str = "") -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.format(methods=methods, processes=processes, events=events))
    return path


def shrink(path: Path, nodes: int, clusters: int, rounds: int) -> None:
    """Rewrite the scenario at path with fewer nodes, clusters and rounds."""
    path.write_text(path.read_text().replace("nodes = 9", f"nodes = {nodes}")
                    .replace("clusters = 3", f"clusters = {clusters}").replace("rounds = 30", f"rounds = {rounds}"))


def records(run: Path, method: str, node: str) -> list[dict]:
    return [json.loads(line) for line in (run / method / f"{node}.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a whole pFedLIA mesh with a late joiner and a crash (44 s under coverage); CI runs it (-m slow)
def test_pfedlia_mesh_recovers_clusters_and_a_late_joiner_picks_its_cluster(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    scenario = load_scenario(write(tmp_path, events=LATE_AND_CRASH))
    out = tmp_path / "run"
    shown: list[tuple[str, int, int]] = []
    with caplog.at_level(logging.INFO, logger="p2pfed.net.endpoint"):
        run_scenario(scenario, out, lambda method, done, total: shown.append((method, done, total)))
    # the progress shown ends at every round done (a peer-to-peer run's stopped one short: 29 of 30)
    assert shown[-1] == ("pfedlia-p2p", scenario.rounds, scenario.rounds)
    summary = json.loads((out / "summary.json").read_text())["methods"]["pfedlia-p2p"]
    assert summary["ari"] == 1.0
    assert summary["accuracy"] > 0.9 and summary["nodes_finished"] == 9
    late = [r for r in records(out, "pfedlia-p2p", "n08") if r["event"] == "choice"]
    assert late and set(late[0]["chosen"]) == {"n06", "n07"}  # n08's true cluster mates
    # it joined through n00 and scored every live node (n01 crashed at round 6: it may have been down)
    assert "(n00)" in next(x for x in caplog.messages if "n08: joined mesh" in x)
    assert set(late[0]["scores"]) >= {"n00", *(f"n0{i}" for i in range(2, 8))}
    assert min(r["round"] for r in records(out, "pfedlia-p2p", "n08") if r["event"] == "round") >= 5
    # ... and then trains with them: models from its chosen peers arrive in its rounds (a late joiner used to
    # finish its join ~35 rounds behind them and receive nothing for the rest of the run)
    late_rounds = [r for r in records(out, "pfedlia-p2p", "n08") if r["event"] == "round"]
    # Under load (a shared 2-core CI machine) the first round or two after its choice may still miss the
    # peers' models (they were a round ahead); the old failure was missing them all.
    missed = sum(r["received"] == 0 for r in late_rounds)
    assert len(late_rounds) >= 5 and missed <= max(2, len(late_rounds) // 5), late_rounds
    assert isinstance(summary["rounds_skipped"], int)  # catching up is recorded as skipped rounds
    # the crashed node came back from its checkpoint with its choice and finished
    n01 = records(out, "pfedlia-p2p", "n01")
    assert [r for r in n01 if r["event"] == "final"]
    # ... its choice too: it did not run peer selection again (a node that lost its checkpoint would join late)
    # (a change its choice made as it kept learning says why)
    assert [sorted(r["chosen"]) for r in n01 if r["event"] == "choice" and "why" not in r] == [["n00", "n02"]]
    assert "round 6: crash n01" in " ".join(summary["events"])
    assert "slow n04" in " ".join(summary["events"]) and summary["nodes_finished"] == 9
    for key, kind in [("accuracy", float), ("micro_accuracy", float), ("bottom5_accuracy", float),
                      ("macro_f1", float), ("bytes_sent", int), ("seconds", float)]:
        assert isinstance(summary[key], kind)
    for png in ["accuracy.png", "influence-pfedlia-p2p.png", "peers-pfedlia-p2p.png"]:
        assert (out / png).stat().st_size > 1000


# slow: 8 node processes and a coordinator, each a Python importing torch (45 s under coverage on 2 cores). The
# default run stays within its 10 minutes; CI runs the slow tests too.
@pytest.mark.slow
def test_one_process_per_node_set_overrides_and_the_report_command(tmp_path: Path) -> None:
    path = write(tmp_path, methods='["oracle", "local"]', processes="true")
    shrink(path, nodes=4, clusters=2, rounds=4)
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "p2pfed", "run", str(path), "--out", str(out), "-q",
                          "--set", "scenario.rounds=3", "--set", "train.lr=0.1"],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "oracle" in res.stdout and "local" in res.stdout
    summary = json.loads((out / "summary.json").read_text())["methods"]
    assert summary["oracle"]["nodes_finished"] == 4 and summary["oracle"]["accuracy"] > 0.5
    as_run = load_scenario(out / "scenario.toml")  # the run folder records the scenario as changed
    assert (as_run.rounds, as_run.train.lr, as_run.nodes) == (3, 0.1, 4)
    rounds = [json.loads(x)["round"] for x in (out / "oracle" / "coordinator.jsonl").read_text().splitlines()]
    assert max(rounds) == 2  # the node processes read the changed copy too: three rounds, not four
    (out / "summary.json").unlink()
    again = subprocess.run([sys.executable, "-m", "p2pfed", "report", str(out)], capture_output=True, text=True)
    assert again.returncode == 0 and "oracle" in again.stdout and (out / "summary.json").exists()


def test_ctrl_c_stops_every_node_and_leaves_a_readable_run_folder(tmp_path: Path) -> None:
    path = write(tmp_path, methods='["fedavg"]', processes="true")
    shrink(path, nodes=3, clusters=1, rounds=100_000)  # never ends by itself: only Ctrl-C stops it
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "p2pfed", "run", str(path), "--out", str(out), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any((out / "fedavg").glob("*.jsonl")):
        time.sleep(0.5)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)  # a generous bound: CI machines are shared
    assert proc.returncode == 130, err[-2000:]
    assert "partial run folder" in err
    assert (out / "summary.json").exists()
    children = subprocess.run(["pgrep", "-f", f"--out {out / 'fedavg'}"], capture_output=True, text=True)
    assert children.stdout.strip() == "", "orphan node processes"
    assert os.path.exists(out / "results.md")


def test_the_papers_selection_and_clustering_rules_run_over_sockets(tmp_path: Path) -> None:
    path = write(tmp_path, methods='["pfedlia-p2p-paper", "pfedlia-central-paper"]')
    shrink(path, nodes=6, clusters=2, rounds=8)  # the paper forms take [methods.pfedlia-p2p] and -central's
    out = tmp_path / "run"
    run_scenario(load_scenario(path), out)
    summary = json.loads((out / "summary.json").read_text())["methods"]
    for method in ("pfedlia-p2p-paper", "pfedlia-central-paper"):
        assert summary[method]["nodes_finished"] == 6 and not summary[method]["crashed"], method
        assert summary[method]["accuracy"] > 0.8, (method, summary[method]["accuracy"])
    # two clean label clusters: the higher 2-means group of every node is its two cluster mates
    assert summary["pfedlia-p2p-paper"]["ari"] == 1.0
    assert [sorted(r["chosen"]) for r in records(out, "pfedlia-p2p-paper", "n00") if r["event"] == "choice"] == [
        ["n01", "n02"]]
    table = (out / "results.md").read_text()
    assert "pfedlia-p2p-paper" in table and "pfedlia-central-paper" in table
    # train.device = "auto" resolved and recorded: the GPU where there is one
    device = "cpu" if not torch.cuda.is_available() else f"cuda:0 ({torch.cuda.get_device_name(0)})"
    assert {summary[m]["device"] for m in summary} == {device} and table.endswith(f"Trained on: {device}.\n")
    # each node's final record says what it trained on (what run.json reports where the runner cannot know)
    assert {r["device"] for r in records(out, "pfedlia-p2p-paper", "n00") if r["event"] == "final"} == {device}


def test_run_json_says_what_the_nodes_said_they_trained_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # where the nodes run elsewhere (Ray actors given a share of a GPU), the runner cannot resolve "auto" for them:
    # run.json takes the devices from the nodes' final records, counted per node where they differ
    import p2pfed.node.learner as learner

    monkeypatch.setattr(learner, "describe_device", lambda device: "fake:0 (a test's device)")
    path = write(tmp_path, methods='["local-p2p"]')
    shrink(path, nodes=4, clusters=2, rounds=2)
    out = tmp_path / "run"
    run_scenario(load_scenario(path), out)
    assert json.loads((out / "local-p2p" / "run.json").read_text())["device"] == "fake:0 (a test's device)"
    lines = (out / "local-p2p" / "n00.jsonl").read_text().replace("fake:0 (a test's device)", "cpu")
    (out / "local-p2p" / "n00.jsonl").write_text(lines + lines.splitlines()[-1] + "\n")  # its end said twice
    (out / "local-p2p" / "n03.jsonl").write_text("not json\n")
    assert devices_said(out / "local-p2p") == "2 nodes on fake:0 (a test's device), 1 on cpu"
    assert devices_said(tmp_path / "nothing") is None


@pytest.mark.slow  # two p2pfed runs and a report, each a Python importing torch (30 s under coverage)
def test_a_run_over_seeds_reports_mean_and_sd_and_resumes_without_running_again(tmp_path: Path) -> None:
    path = write(tmp_path, methods='["oracle", "local"]')
    shrink(path, nodes=4, clusters=2, rounds=3)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "p2pfed", "run", str(path), "--out", str(out), "-q", "--seeds", "0,1"]
    res = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "± " in res.stdout and "oracle" in res.stdout
    per_seed = [json.loads((out / f"seed-{s}" / "summary.json").read_text())["methods"] for s in (0, 1)]
    assert [load_scenario(out / f"seed-{s}" / "scenario.toml").seed for s in (0, 1)] == [0, 1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1]
    for method in ("oracle", "local"):
        values = [s[method]["accuracy"] for s in per_seed]
        entry = summary["methods"][method]["accuracy"]
        assert entry["values"] == values and entry["mean"] == sum(values) / 2
        assert abs(entry["sd"] - abs(values[0] - values[1]) / 2 ** 0.5) < 1e-12  # n - 1: sd of two is |a-b|/√2
    assert (out / "accuracy.png").stat().st_size > 1000
    written = {p: p.stat().st_mtime_ns for p in out.glob("seed-*/*/*.jsonl")}
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("seed-*/*/*.jsonl")} == written  # nothing ran again
    (out / "summary.json").unlink()
    report = subprocess.run([sys.executable, "-m", "p2pfed", "report", str(out)], capture_output=True, text=True)
    assert report.returncode == 0 and "± " in report.stdout
    assert json.loads((out / "summary.json").read_text()) == summary
