"""The command line as a user runs it: separate processes, real TCP, readable errors."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from p2pfed.cli import parse_index, parse_seeds
from tests.helpers import free_port, p2pfed, peer_states, status, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "p2pfed", *args], capture_output=True, text=True, timeout=60)


def test_bootstrap_nodes_and_mesh_status_as_separate_processes(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text("[node]\n[node.mesh]\nheartbeat = 0.3\n")
    boot = f"tcp://127.0.0.1:{free_port()}"
    procs = [p2pfed("bootstrap", "--bind", boot, log=tmp_path / "boot.log")]
    procs += [p2pfed("node", "--join", boot, "--bind", "tcp://127.0.0.1:0", "--name", n, "--config", str(cfg),
                     log=tmp_path / f"{n}.log") for n in ("alice", "bob")]
    try:
        wait_for(lambda: peer_states(status(boot)) == {"bootstrap": "alive", "alice": "alive", "bob": "alive"},
                 30, "the mesh to form")
        text = run("mesh", "status", "--join", boot)
        assert text.returncode == 0 and "alice" in text.stdout and "3 alive of 3 known" in text.stdout
        doc = json.loads(run("mesh", "status", "--join", boot, "--json").stdout)
        assert all({"name", "address", "state"} <= set(p) for p in doc["peers"])
        stop(procs[2], sig=signal.SIGKILL)
        wait_for(lambda: peer_states(status(boot)).get("bob") == "dead", 30, "bob to be noticed dead")
        # bob restarts with the same name and rejoins through alice, not the bootstrap
        alice = next(p["ticket"] for p in doc["peers"] if p["name"] == "alice")  # its address and key
        procs.append(p2pfed("node", "--join", alice, "--bind", "tcp://127.0.0.1:0", "--name", "bob",
                            log=tmp_path / "bob2.log"))
        wait_for(lambda: peer_states(status(boot)).get("bob") == "alive", 30, "bob to rejoin")
    finally:
        stop(*procs)
    assert "alice: stopped" in (tmp_path / "alice.log").read_text()  # SIGTERM is a clean stop


def test_status_of_nothing_fails_clearly() -> None:
    nobody = f"tcp://127.0.0.1:{free_port()}"
    res = run("mesh", "status", "--join", f"{nobody}/{'ab' * 32}", "--timeout", "0.5")
    assert res.returncode == 1 and "no answer" in res.stderr
    res = run("mesh", "status", "--join", nobody)  # no key, and no member called bootstrap started here
    assert res.returncode == 2 and f"pass its ticket, --join {nobody}/KEY" in res.stderr


def test_keys_generate_refuses_to_overwrite(tmp_path: Path) -> None:
    assert run("keys", "generate", str(tmp_path / "k"), "--name", "alice").returncode == 0
    assert (tmp_path / "k" / "alice.key_secret").stat().st_mode & 0o077 == 0
    assert (tmp_path / "k" / "allowed" / "alice.key").exists()
    again = run("keys", "generate", str(tmp_path / "k"), "--name", "alice")
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr


def test_config_errors_name_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "node.toml"
    bad.write_text("[node]\njoin = ['tcp://h:1']\n[node.mesh]\nheartbeat = 'fast'\n")
    res = run("node", "--config", str(bad))
    assert res.returncode == 2 and "node.toml" in res.stderr and "mesh.heartbeat" in res.stderr
    bad.write_text("[node]\njoin = ['tcp://h:1']\nhartbeat = 1\n")
    res = run("node", "--config", str(bad))
    assert "hartbeat is not a known key" in res.stderr
    res = run("node")
    assert res.returncode == 2 and "--join" in res.stderr


def test_a_coordinator_and_nodes_that_take_their_method_from_it(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text("[scenario]\nname = 'cli'\nnodes = 3\nrounds = 3\nmethods = ['fedavg']\n"
                        "[data]\nmax_train = 16\npartition.clusters = 1\n"
                        "[train]\nmodel = 'logreg'\nround_timeout = 20\n"
                        "[mesh]\nheartbeat = 0.3\n")
    out = tmp_path / "out"
    coord = f"tcp://127.0.0.1:{free_port()}"
    procs = [p2pfed("coordinator", "--bind", coord, "--scenario", str(scenario), "--method", "fedprox",
                    "--out", str(out), "--wait-for", "3", "--mesh", "cli", log=tmp_path / "coordinator.log")]
    procs += [p2pfed("node", "--coordinator", coord, "--bind", "tcp://127.0.0.1:0", "--scenario", str(scenario),
                     "--index", str(i), "--out", str(out), "--mesh", "cli", log=tmp_path / f"n{i}.log")
              for i in range(3)]
    try:
        for p in procs:
            p.wait(120)
    finally:
        stop(*procs)
    assert [p.returncode for p in procs] == [0, 0, 0, 0], (tmp_path / "coordinator.log").read_text()[-2000:]
    for i in range(3):
        lines = [json.loads(x) for x in (out / f"n{i:02d}.jsonl").read_text().splitlines()]
        assert lines[-1]["event"] == "final" and lines[-1]["method"] == "fedprox"
    rounds = [json.loads(x) for x in (out / "coordinator.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds if r["event"] == "round"] == [0, 1, 2]
    bad = run("coordinator", "--bind", "tcp://127.0.0.1:0", "--scenario", str(scenario), "--method", "fedavg-p2p")
    assert bad.returncode == 2 and "decentralized" in bad.stderr


def test_a_node_that_cannot_join_stops_on_sigterm_and_says_why_when_it_gives_up(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    dead = f"{address}/{'ab' * 32}"  # nobody listens: a bootstrap that is down (its ticket)
    scenario = tmp_path / "s.toml"
    scenario.write_text("[scenario]\nname = 'cli'\nnodes = 2\nrounds = 2\nmethods = ['fedavg-p2p']\n"
                        "[data]\npartition.clusters = 1\nmax_train = 16\n")
    learner = p2pfed("node", "--join", dead, "--bind", "tcp://127.0.0.1:0", "--scenario", str(scenario),
                     "--index", "0", "--method", "fedavg-p2p", "--out", str(tmp_path / "out"),
                     log=tmp_path / "learner.log")
    try:
        wait_for(lambda: "not answered yet" in (tmp_path / "learner.log").read_text(), 60, "the join to start")
        t0 = time.monotonic()
        learner.send_signal(signal.SIGTERM)  # it ignored SIGTERM until its 60 s join wait ended
        assert learner.wait(20) == 0 and time.monotonic() - t0 < 15
    finally:
        stop(learner)
    cfg = tmp_path / "node.toml"
    cfg.write_text("[node]\n[node.mesh]\nheartbeat = 0.2\njoin_give_up = 2\n")
    res = run("node", "--join", dead, "--bind", "tcp://127.0.0.1:0", "--name", "lonely", "--config", str(cfg))
    assert res.returncode == 2, res.stderr
    assert f"lonely could not join mesh 'default': no answer from {address} in 2 s" in res.stderr  # not "p2pfed: "


def test_an_unknown_method_is_refused_before_the_join(tmp_path: Path) -> None:
    # A node with its own data refused it when its first round started, after the join and its wait (74 s in a
    # user's try); nobody answers at this address, so only a check before the join ends it within the timeout.
    scenario = tmp_path / "s.toml"
    scenario.write_text("[scenario]\nnodes = 2\nmethods = ['fedavg-p2p']\n[data]\npartition.clusters = 1\n")
    digits = load_digits()
    np.savez(tmp_path / "own.npz", x=digits.images[:60], y=digits.target[:60])
    dead = f"tcp://127.0.0.1:{free_port()}/{'ab' * 32}"
    for role in (["node", "--recipe", str(ROOT / "node" / "recipe.toml"), "--data", str(tmp_path / "own.npz")],
                 ["node", "--scenario", str(scenario), "--index", "0"],
                 ["coordinator", "--scenario", str(scenario)]):
        res = run(*role, "--join", dead, "--bind", "tcp://127.0.0.1:0", "--method", "pfedlia-ptp",
                  "--out", str(tmp_path / "out"))
        assert res.returncode == 2, res.stderr
        assert "'pfedlia-ptp'" in res.stderr and "not answered" not in res.stderr


@pytest.mark.parametrize(("text", "seeds"), [("4", [0, 1, 2, 3]), ("0-3", [0, 1, 2, 3]), ("0,1,5", [0, 1, 5]),
                                             ("2-3,7", [2, 3, 7]), ("7-7", [7])])
def test_seeds_are_a_count_or_seeds_and_ranges(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["0", "abc", "1,1", "3-1", "0-", "3-1,5", "101", "-2", "0-1000000000", "7,"])
def test_bad_seeds_are_refused_with_the_forms_that_work(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="give a count"):
        parse_seeds(text)


def test_node_indices_are_checked_as_seeds_are(tmp_path: Path) -> None:
    assert parse_index("3") == [3] and parse_index("0-2,7") == [0, 1, 2, 7]
    for text in ["abc", "5-3", "1,1", "-1", "0-99999"]:
        with pytest.raises(argparse.ArgumentTypeError, match="give node indices >= 0 and ranges"):
            parse_index(text)
    res = run("node", "--join", "tcp://127.0.0.1:1", "--scenario", "x.toml", "--index", "5-3")
    assert res.returncode == 2 and "argument --index: '5-3': give node indices" in res.stderr
    res = run("node", "--join", "tcp://127.0.0.1:1", "--recipe", "x.toml", "--data", "d.npz", "--index", "0")
    assert res.returncode == 2 and "--data and --index exclude each other" in res.stderr


def test_a_run_over_seeds_that_is_refused_leaves_no_folder_behind(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from p2pfed.cli import main

    path, out = tmp_path / "s.toml", tmp_path / "run"
    path.write_text("[scenario]\nnodes = 4\nmethods = ['local']\n[data]\npartition.clusters = 2\n")
    assert main(["run", str(path), "--seeds", "2", "--set", "scenario.seed=3", "--out", str(out)]) == 2
    assert "leave --set scenario.seed out" in capsys.readouterr().err and not out.exists()


def test_a_scripted_run_stopped_by_sigterm_stops_its_node_processes_and_removes_the_shared_dataset(
        tmp_path: Path) -> None:
    """SIGTERM (a service manager's stop, `kill`) ended `p2pfed run` where it stood: its node processes, in
    sessions of their own, ran on, and the dataset it wrote for them to share stayed in the temporary folder.
    It now stops as Ctrl-C does."""
    temp = tmp_path / "temp"
    temp.mkdir()
    out = tmp_path / "run"
    runner = subprocess.Popen([sys.executable, "-m", "p2pfed", "run", str(ROOT / "scenarios" / "quickstart.toml"),
                               "--set", "scenario.workers=2", "--set", "scenario.rounds=30", "--methods",
                               "local-p2p", "--out", str(out), "-q"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "TMPDIR": str(temp)})

    def children() -> list[int]:  # the node processes of this run (they name its folder on their command line)
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and str(out).encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
        return [p for p in found if p != runner.pid]

    try:
        wait_for(lambda: len(children()) == 2 and any(temp.glob("p2pfed-data-*/dataset.json")), 60,
                 "two node processes and the shared dataset")
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(60) == 130
        wait_for(lambda: not children(), 30, "the node processes to stop")
        assert not list(temp.glob("p2pfed-data-*"))
    finally:
        stop(runner)
        for pid in children():
            os.kill(pid, signal.SIGKILL)
