"""The shipped comparison (scenarios/compare-digits.toml, as a user runs it) over real sockets: each of its methods
beats chance, and pFedLIA with a center finds the true clusters without being told how many."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2pfed.launch.runner import run_scenario
from p2pfed.methods import METHODS
from p2pfed.scenario.config import load_scenario
from tests.methods.test_collaboration import LEARNED_HERE

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "compare-digits.toml"
# The Table I methods of pFedLIA (Rokvic et al. 2025) and the coordinated baselines (CAM has its own test:
# tests/methods/test_cam.py)
ISSUE_4 = ("oracle", "local", "fedavg", "fedprox", "fesem", "ifca", "cfl", "pfedlia-central", "pfedlia-p2p")
# Run here whatever other tests run: the methods this test's own checks read. (pFedLIA-p2p, run here too before,
# is held to its bars in tests/methods/test_collaboration.py and tests/scenario/test_mesh_learning.py: here it took
# 2 of the test's 10 minutes under coverage on a slow day.)
OWN = ("oracle", "local", "fedavg", "pfedlia-central")


@pytest.mark.slow  # 4 to 10 minutes on 2 cores, by the machine's day; CI runs the slow tests too
@pytest.mark.timeout(1800)
def test_every_method_beats_chance_and_pfedlia_central_recovers_the_clusters(tmp_path: Path) -> None:
    scenario = load_scenario(SCENARIO)
    assert set(ISSUE_4) <= set(scenario.methods) <= set(METHODS)
    # All 34 methods one after another took 17 minutes under coverage on 2 cores, a third of CI's hour. Those that
    # tests/methods/test_collaboration.py already holds to a bar above local training are left out here: a method
    # added to the scenario and learned nowhere else still runs here.
    scenario.methods = [m for m in scenario.methods if m in OWN or m not in LEARNED_HERE]
    run_scenario(scenario, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())["methods"]
    chance = 1 / 10
    for method in scenario.methods:
        m = summary[method]
        assert m["nodes_finished"] == scenario.nodes and not m["crashed"], method
        assert m["accuracy"] > 2 * chance, (method, m["accuracy"])
        assert m["bytes_sent"] > 0 or method == "local", method
    assert summary["pfedlia-central"]["ari"] == 1.0
    assert summary["oracle"]["ari"] == 1.0 and summary["fedavg"]["ari"] == 0.0
    # clustering pays on this partition: the clustered methods that found the clusters beat one global model
    assert summary["pfedlia-central"]["accuracy"] > summary["fedavg"]["accuracy"] + 0.3
    assert (tmp_path / "clusters.png").stat().st_size > 1000
    table = (tmp_path / "results.md").read_text()
    assert all(method in table for method in scenario.methods)
