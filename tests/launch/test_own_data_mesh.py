"""The worked example (docs/deploy.md) of nodes with their own data: three machines, each with its own .npz made by
node/example_data.py (a and b hold digits 0-4, c digits 5-9), join through a bootstrap with node/recipe.toml;
pFedLIA finds that a and b help each other and c neither, and each machine exports its personalised model
and predicts with it. Run on loopback, and (multihost) on hosts in network namespaces. A member with another
recipe, or with data that does not fit it, is stopped with one line saying why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import free_port, p2pfed, stop, wait_for
from tests.netns import network

ROOT = Path(__file__).resolve().parents[2]
MACHINES = ("a", "b", "c")


def recipe(tmp_path: Path, **changes: str) -> Path:
    """node/recipe.toml as docs/deploy.md runs it, with any changes (key = TOML value)."""
    text = (ROOT / "node" / "recipe.toml").read_text()
    for key, value in changes.items():
        old = next(line for line in text.splitlines() if line.startswith(f"{key} ="))
        text = text.replace(old, f"{key} = {value}")
    path = tmp_path / f"recipe{len(changes)}.toml"
    path.write_text(text)
    return path


def example_data(tmp_path: Path) -> Path:
    out = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "node" / "example_data.py"), str(out)], check=True, timeout=60)
    return out


def run_example(tmp_path: Path, boot: str, binds: dict[str, str], on: dict[str, list[str]]) -> None:
    """Run the example's bootstrap and machines until the machines end; check what pFedLIA found and what each
    machine's exported model does."""
    data, path = example_data(tmp_path), recipe(tmp_path)
    procs = [p2pfed("bootstrap", "--bind", boot, "--mesh", "own", log=tmp_path / "boot.log", prefix=on["boot"])]
    machines = {m: p2pfed("node", "--recipe", str(path), "--data", str(data / f"{m}.npz"), "--name", m, "--join",
                          boot, "--bind", binds[m], "--mesh", "own", "--wait-for", "2", "--out", str(tmp_path / m),
                          log=tmp_path / f"{m}.log", prefix=on[m]) for m in MACHINES}
    try:
        for m, proc in machines.items():
            assert proc.wait(240) == 0, (tmp_path / f"{m}.log").read_text()[-3000:]
    finally:
        stop(*procs, *machines.values())
    final = {m: next(json.loads(line) for line in (tmp_path / m / f"{m}.jsonl").read_text().splitlines()
                     if json.loads(line)["event"] == "final") for m in MACHINES}
    assert sorted(final["a"]["chosen"]) == ["b"] and sorted(final["b"]["chosen"]) == ["a"]
    assert "a" not in final["c"]["chosen"] and "b" not in final["c"]["chosen"]
    assert all(f["true_cluster"] == -1 for f in final.values())  # nobody knows true clusters in a real mesh
    log = (tmp_path / "a.log").read_text()
    assert "own data" in log and "36 training, 12 validation, 12 test samples of (1, 8, 8), 10 classes" in log
    # each machine's personalised model out, and put to use on the others' data
    for m in ("a", "c"):
        res = subprocess.run([sys.executable, "-m", "p2pfed", "export", str(tmp_path / m), str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and f"{m}'s personalised cnn (pfedlia-p2p, after round 19)" in res.stdout
    scores = {}
    for m, other in [("a", "b"), ("a", "c"), ("c", "c")]:
        res = subprocess.run([sys.executable, "-m", "p2pfed", "predict", str(tmp_path / f"{m}-model.safetensors"),
                              str(data / f"{other}.npz"), "--show", "0"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        scores[m, other] = float(res.stdout.splitlines()[-1].split()[1].rstrip("%"))
    # a's model knows digits 0-4 (its own and b's), not c's 5-9; c's knows its own
    assert scores["a", "b"] > 80 and scores["a", "c"] < 20 and scores["c", "c"] > 60, scores


@pytest.mark.slow  # a minute of learning; CI runs it (-m slow), and the refusals below stay in the default run
def test_three_machines_with_their_own_data_find_who_helps_whom_and_export_their_models(tmp_path: Path) -> None:
    boot = f"tcp://127.0.0.1:{free_port()}"
    binds = {m: f"tcp://127.0.0.1:{free_port()}" for m in MACHINES}
    run_example(tmp_path, boot, binds, {key: [] for key in ("boot", *MACHINES)})


@pytest.mark.multihost
def test_the_worked_example_on_three_hosts(tmp_path: Path) -> None:
    with network(4) as net:
        hosts = dict(zip(("boot", *MACHINES), net.hosts, strict=True))
        run_example(tmp_path, f"tcp://{net.addr(hosts['boot'])}:7000",
                    {m: "tcp://0.0.0.0:7100" for m in MACHINES}, {k: net.on(h) for k, h in hosts.items()})


def test_a_member_with_another_recipe_or_unfitting_data_is_stopped_saying_why(tmp_path: Path) -> None:
    data = example_data(tmp_path)
    first = f"tcp://127.0.0.1:{free_port()}"
    a = p2pfed("node", "--recipe", str(recipe(tmp_path)), "--data", str(data / "a.npz"), "--name", "a", "--bind",
               first, "--join", first, "--join-key", "a", "--mesh", "own", "--wait-for", "1", "--out",
               str(tmp_path / "a"),
               log=tmp_path / "a.log")
    try:
        odd = subprocess.run([sys.executable, "-m", "p2pfed", "node", "--recipe", str(recipe(tmp_path, lr="0.5")),
                              "--data", str(data / "b.npz"), "--name", "b", "--join", first, "--join-key", "a",
                              "--bind", "tcp://127.0.0.1:0", "--mesh", "own", "--out", str(tmp_path / "b")],
                             capture_output=True, text=True, timeout=120)
        assert odd.returncode != 0
        line = next(x for x in odd.stderr.splitlines() if "could not join" in x)
        assert "b trains recipe" in line and "this member (a) trains recipe" in line
        ours, theirs = line.split("trains recipe ")[1][:16], line.split("trains recipe ")[2][:16]
        assert len({ours, theirs}) == 2 and all(len(f) == 16 for f in (ours, theirs))
    finally:
        stop(a)
    np.savez(tmp_path / "big.npz", x=np.zeros((40, 28, 28)), y=np.zeros(40, dtype=int))
    res = subprocess.run([sys.executable, "-m", "p2pfed", "node", "--recipe", str(recipe(tmp_path)), "--data",
                          str(tmp_path / "big.npz"), "--join", first, "--name", "d"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"p2pfed: {tmp_path / 'big.npz'}: samples of shape (1, 28, 28), but the recipe's model takes (1, 8, 8) "
        "(data.input_shape, or that of the recipe's data.dataset)"]


TEXT_RECIPE = """
[scenario]
name = "own-words"
rounds = 3
methods = ["fedavg-p2p"]
[data]
vocabulary = "abcdefghijklmnopqrstuvwxyzæøå"  # every member's words are spelt with these letters
[train]
model = "char-gru"
batch_size = 32
lr = 0.5
[mesh]
heartbeat = 0.5
"""


@pytest.mark.slow
def test_two_machines_train_next_token_prediction_on_their_own_words(tmp_path: Path, key_home: Path) -> None:
    (tmp_path / "recipe.toml").write_text(TEXT_RECIPE)
    for m, ending in (("a", "en"), ("b", "ar")):
        (tmp_path / f"{m}.txt").write_text("\n".join(f"{x}{y}{z}{ending}" for x in "bdfgk" for y in "aeiou"
                                                     for z in "lmnrs") + "\n")
    first = f"tcp://127.0.0.1:{free_port()}"
    procs = {}
    for m in ("a", "b"):  # b joins through a, with a's public key (a member of this machine: in the key folder)
        procs[m] = p2pfed("node", "--recipe", str(tmp_path / "recipe.toml"), "--data", str(tmp_path / f"{m}.txt"),
                          "--name", m, "--bind", first if m == "a" else "tcp://127.0.0.1:0", "--join", first,
                          "--join-key", "a", "--mesh", "words", "--wait-for", "1", "--out", str(tmp_path / m),
                          log=tmp_path / f"{m}.log")
        wait_for(lambda: (key_home / "a.key").exists(), 60, "a's key pair")
    try:
        for m, proc in procs.items():
            assert proc.wait(180) == 0, (tmp_path / f"{m}.log").read_text()[-3000:]
    finally:
        stop(*procs.values())
    final = [json.loads(x) for x in (tmp_path / "b" / "b.jsonl").read_text().splitlines()][-1]
    assert final["event"] == "final" and 0 < final["loss"] < 3.4  # below a uniform guess over 31 tokens
    res = subprocess.run([sys.executable, "-m", "p2pfed", "export", str(tmp_path / "b"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "b's personalised char-gru (fedavg-p2p, after round 2) for inputs (17,), 31 tokens" \
        in res.stdout, res.stderr
    res = subprocess.run([sys.executable, "-m", "p2pfed", "predict", str(tmp_path / "b-model.safetensors"),
                          str(tmp_path / "b.txt"), "--show", "3"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "continues as" in res.stdout, res.stderr
    loss = float(res.stdout.split("loss ")[-1].split()[0])  # b's own words, as its final evaluation scored its share
    assert 0 < loss < 3.4 and "of 125 texts" in res.stdout
