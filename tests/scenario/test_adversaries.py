"""Scripted adversaries over real sockets: what lazy influence buys against a poisoned peer.

A small digits mesh (3 clusters of 3 nodes, each holding its own labels) with one adversary in cluster 0.
pFedLIA's honest nodes keep it out by their own scores; FedAvg takes its model like any other.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from p2pfed.config import ConfigError
from p2pfed.launch.adversary import KINDS, flip_labels, noise_like
from p2pfed.launch.runner import run_scenario
from p2pfed.scenario.config import ADVERSARIES, load_scenario

SCENARIO = """
[scenario]
name = "adversary"
seed = 1
nodes = 9
rounds = 12
methods = ["pfedlia-p2p", "fedavg-p2p"]
[data]
dataset = "digits"
partition.kind = "pathological"
partition.clusters = 3
max_train = 24
[train]
epochs = 2
lr = 0.1
round_timeout = 20
[methods.pfedlia-p2p]
warmup_rounds = 3
lia_epochs = 10
lia_batch = 24
[mesh]
heartbeat = 0.3
[[adversaries]]
node = 1
kind = "{kind}"
"""


def run(tmp_path: Path, kind: str) -> dict:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(kind=kind))
    run_scenario(load_scenario(path), tmp_path / "run")
    return json.loads((tmp_path / "run" / "summary.json").read_text())["methods"]


@pytest.mark.slow  # two methods learning with an adversary (about 24 s under coverage); CI runs it (-m slow)
def test_pfedlias_honest_nodes_keep_a_label_flipper_out_and_fedavgs_cannot(tmp_path: Path) -> None:
    summary = run(tmp_path, "label-flip")
    lia, fedavg = summary["pfedlia-p2p"], summary["fedavg-p2p"]
    assert lia["adversaries"] == {"n01": {"kind": "label-flip", "excluded_by": 1.0}}  # both honest mates of n01
    assert fedavg["adversaries"]["n01"]["excluded_by"] is None  # FedAvg has no choice to make
    # measured: 94.7 % against 68.7 %
    assert lia["accuracy"] > fedavg["accuracy"] + 0.1 and lia["accuracy"] > 0.85, (lia, fedavg)


@pytest.mark.slow  # two methods learning with an adversary (about 24 s under coverage); CI runs it (-m slow)
def test_a_noise_model_sinks_fedavg_not_pfedlia(tmp_path: Path) -> None:
    summary = run(tmp_path, "noise-model")
    lia, fedavg = summary["pfedlia-p2p"], summary["fedavg-p2p"]
    # measured: 80.0 % against 38.3 %. pFedLIA's nodes may still choose the noise: its loss on their labels can
    # be below the warm-up model's (measured: influence +0.3 against +1.3 for the honest mate), so it keeps a
    # place in their average (docs/security.md, "Adversaries in a scenario").
    assert lia["accuracy"] > fedavg["accuracy"] + 0.25, (lia, fedavg)
    assert isinstance(lia["adversaries"]["n01"]["excluded_by"], float)


def test_every_kind_of_adversary_a_scenario_may_name_has_a_conduct() -> None:
    assert set(KINDS) == set(ADVERSARIES)


def test_what_the_adversaries_do() -> None:
    import torch

    assert flip_labels(torch.tensor([0, 3, 9]), 10).tolist() == [9, 6, 0]
    state = {"w": torch.full((1000,), 2.0) + torch.randn(1000), "n": torch.tensor(4)}
    noise = noise_like(state, seed=1)
    assert abs(float(noise["w"].std()) - float(state["w"].std())) < 0.1 and abs(float(noise["w"].mean())) < 0.2
    assert int(noise["n"]) == 4 and torch.equal(noise_like(state, seed=1)["w"], noise["w"])


@pytest.mark.parametrize(("table", "message"), [
    ("[[adversaries]]\nnode = 1\nkind = 'sybil'\n", "adversaries[0].kind must be one of label-flip, noise-model, "
                                                    "free-rider"),
    ("[[adversaries]]\nnode = 12\n", "adversaries[0].node 12 is outside the scenario"),
    ("[[adversaries]]\nnode = 1\n[[adversaries]]\nnode = 1\nkind = 'free-rider'\n", "a node can be one adversary"),
])
def test_an_adversary_that_cannot_be_is_named(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.split("[[adversaries]]")[0].format(kind="") + table)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_scenario(path)
