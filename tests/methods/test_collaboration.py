"""Every method does its job over real sockets, on small scenarios built so that collaboration matters.

Two scenarios, 12 digits nodes with 12 training samples each (too few to learn well alone):
- clustered: 3 true clusters of 4 nodes, each cluster holding its own labels (the pathological partition of
  Rokvic et al. 2025). One global model serves them poorly; a method that finds the clusters (or the helpful
  peers) must beat both local-only training and FedAvg, and where it clusters, find the true clusters.
- iid: every node has every label. Here the global-model methods (FedAvg, FedProx, FedFM) must beat
  local-only training by far: it is what federated learning is for.
Measured on this machine (accuracy %): clustered local 86.9, fedavg 83.1, the clustered methods 95.2–97.3
(FedDSMIC and FedDS from random centers, the paper's: 96.8 and 97.3),
FedFomo 93.7, Per-FedAvg 86.2; iid local 54.6, fedavg 89.5, FedFM 78.8, FedFM-ℓ2 77.6, FedFM-Lite 69.3,
Per-FedAvg 89.1, FedAvgM 91.7, SCAFFOLD 89.8, FedProx 89.5, FedAvg+ and FedProx+ (K = 3) 90.4, FedProx + FM
82.3. The margins below leave room for the small differences that the order of arrivals makes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sklearn.metrics import adjusted_rand_score

from p2pfed.launch.runner import run_scenario
from p2pfed.scenario.config import load_scenario

# About two dozen short scenario runs, 2 to 3 minutes under coverage: marked slow so that the default run
# stays within its 10 minutes on a 2-core machine (it reached 10 min 12 s); CI runs the slow tests too.
pytestmark = pytest.mark.slow

SCENARIO = """
[scenario]
name = "collab-{partition}"
seed = 1
nodes = 12
rounds = 12
methods = ["{method}"]

[data]
dataset = "digits"
partition = {partition_table}
max_train = 12

[train]
model = "cnn"
epochs = 3
batch_size = 8
lr = 0.1
participation = 1.0
round_timeout = 20
eval_every = 4

[mesh]
heartbeat = 0.3
"""
# the two partitions: three clusters of four nodes, or every node every label
PARTITIONS_USED = {"pathological": '{kind = "pathological", clusters = 3}', "iid": '{kind = "iid"}'}
LIA = "warmup_rounds = 3\nlia_epochs = 10\nlia_batch = 60"
# each method's own table, where this small scenario needs other than its defaults
OPTIONS = {
    "pfedlia-p2p": LIA, "pfedlia-central": LIA,
    **dict.fromkeys(["ifca-cam", "fesem-cam", "feddsmic", "fedds", "feddsmic-paper", "fedds-paper"], "warmup = 3"),
    **dict.fromkeys(["fedfm", "fedfm-l2", "fedfm-lite", "fedprox-fm"], "start = 3"),
    # the iid partition is one cluster: K = 1 would be FedAvg itself; CAM's tables (Ma et al. 2023) use K = 5 and 10
    **dict.fromkeys(["fedavg-ensemble", "fedprox-ensemble"], "k = 3"),
    # CFL's thresholds are scale-dependent (see scenarios/compare-digits.toml): here a round's updates measure
    # ||mean ΔW|| ≈ 0.2–0.3 and max ||ΔW|| ≈ 0.9–1.3 before any split.
    "cfl": "eps1 = 0.35\neps2 = 0.6\nwarmup = 3",
}


class Runs:
    """Runs each (partition, method) once per test session, on demand, and keeps its results."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.done: dict[tuple[str, str, str], dict[str, Any]] = {}

    def __call__(self, partition: str, method: str, table: str = "") -> dict[str, Any]:
        """table: more of the method's own [methods.NAME] table (its options) than OPTIONS gives."""
        key = (partition, method, table)
        if key not in self.done:
            out = self.base / partition / f"{method}-{len(self.done)}"
            out.mkdir(parents=True)
            path = out / "scenario.toml"
            options = "\n".join(t for t in (OPTIONS.get(method, ""), table) if t)
            extra = f"\n[methods.{method}]\n{options}\n" if options else ""
            table = PARTITIONS_USED[partition]
            path.write_text(SCENARIO.format(partition=partition, partition_table=table, method=method) + extra)
            run_scenario(load_scenario(path), out)
            summary = json.loads((out / "summary.json").read_text())["methods"][method]
            assert summary["nodes_finished"] == 12 and not summary["crashed"], (method, summary)
            summary["out"] = out
            self.done[key] = summary
        return self.done[key]

    def accuracy(self, partition: str, method: str, table: str = "") -> float:
        return float(self(partition, method, table)["accuracy"])

    def assignment(self, method: str) -> tuple[list[int], list[int]]:
        """The coordinator's final clusters and the true ones, node by node (clustered scenario)."""
        out = self("pathological", method)["out"]
        final = json.loads((out / method / "coordinator.jsonl").read_text().splitlines()[-1])["assignment"]
        true = json.loads((out / "partition.json").read_text())
        return [final[n] for n in true["nodes"]], true["true_cluster"]


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("collaboration"))


CLUSTERING = ["oracle", "oracle-p2p", "pfedlia-p2p", "pfedlia-central", "fesem", "ifca", "ifca-cam", "fesem-cam",
              "feddsmic", "fedds", "feddsmic-paper", "fedds-paper"]
GLOBAL = ["fedavg", "fedavg-p2p", "fedprox", "fedfm", "fedfm-l2", "perfedavg", "fedavgm", "scaffold", "fedavg-ensemble",
          "fedprox-ensemble", "fedprox-fm"]
# Every method these tests hold to a bar of its own (above local training or FedAvg; FedProto: no worse than local
# training): the shipped scenario's test (tests/scenario/test_compare.py) leaves them out, to keep CI within its hour.
LEARNED_HERE = {*CLUSTERING, "cfl", "fedfomo", *GLOBAL, "fedfm-lite", "fedproto"}


@pytest.mark.parametrize("method", CLUSTERING)
def test_a_clustering_method_finds_the_clusters_and_beats_local_and_fedavg(runs: Runs, method: str) -> None:
    best_alone = max(runs.accuracy("pathological", "local"), runs.accuracy("pathological", "fedavg"))
    assert runs.accuracy("pathological", method) > best_alone + 0.05, (method, runs("pathological", method))
    ari = runs("pathological", method)["ari"]
    assert ari == 1.0 or method == "oracle-p2p", (method, ari)  # the oracle-p2p nodes report no clusters


def test_cfl_splits_only_between_true_clusters_and_beats_local_and_fedavg(runs: Runs) -> None:
    best_alone = max(runs.accuracy("pathological", "local"), runs.accuracy("pathological", "fedavg"))
    assert runs.accuracy("pathological", "cfl") > best_alone + 0.05
    found, true = runs.assignment("cfl")
    # CFL's bi-partitions separate incongruent clients (Sattler et al., Theorem 1): every cluster it ends with
    # holds nodes of one true cluster. It may split a true cluster further (measured: 4 = 2 + 2 once).
    assert all(len({t for f, t in zip(found, true, strict=True) if f == g}) == 1 for g in set(found)), found
    assert adjusted_rand_score(true, found) > 0.5


def test_fedfomo_weights_peers_by_how_much_they_help_and_beats_local_and_fedavg(runs: Runs) -> None:
    best_alone = max(runs.accuracy("pathological", "local"), runs.accuracy("pathological", "fedavg"))
    assert runs.accuracy("pathological", "fedfomo") > best_alone + 0.04


@pytest.mark.parametrize("method", GLOBAL)
def test_a_global_model_beats_local_training_when_data_is_scarce_and_alike(runs: Runs, method: str) -> None:
    assert runs.accuracy("iid", method) > runs.accuracy("iid", "local") + 0.15, runs("iid", method)


def test_fedfm_lite_beats_local_training_and_sends_less_than_fedfm(runs: Runs) -> None:
    # Measured: 69.3 % against local 54.6 % and FedFM 78.8 % (in 12 rounds with a = 5 its global model takes
    # two FM aggregations). When a node reloaded the global model at each model round, and when testing the
    # global model replaced the model a node was training, the rounds it trained alone were lost: 22.2 %.
    assert runs("iid", "fedfm-lite")["bytes_sent"] < runs("iid", "fedfm")["bytes_sent"]
    assert runs.accuracy("iid", "fedfm-lite") > runs.accuracy("iid", "local") + 0.10


def test_perfedavg_personalises_one_global_model_by_a_step_on_each_nodes_data(runs: Runs) -> None:
    # Measured: FedAvg 83.1 %; Per-FedAvg evaluated with no step 76.7 %, one step 86.2 %, three 89.7 %. The
    # MAML model is a starting point, worse than FedAvg's as it is, better after the step it was trained for.
    one_step = runs.accuracy("pathological", "perfedavg")
    assert one_step > runs.accuracy("pathological", "fedavg") + 0.02
    assert one_step > runs.accuracy("pathological", "perfedavg", "personal_steps = 0") + 0.05


def test_fedproto_shares_prototypes_not_models_and_trains_no_worse_than_alone(runs: Runs) -> None:
    # FedProto's models never travel: its nodes gain only through the global prototypes, and on these
    # scenarios that gain is within noise of local training (measured: iid 54.8 % against 54.6 %). What is
    # checked is that the prototype term does not hurt and that models stay home.
    assert runs.accuracy("iid", "fedproto") >= runs.accuracy("iid", "local") - 0.02
    assert runs("iid", "fedproto")["bytes_sent"] < runs("iid", "fedavg")["bytes_sent"] / 2


@pytest.mark.parametrize("method", ["fedavg-ensemble", "fedprox-ensemble"])
def test_an_ensemble_sends_its_k_models_each_way(runs: Runs, method: str) -> None:
    # K = 3 models per task and per answer: measured 2.9 and 3.0 times FedAvg's bytes (heartbeats and gossip
    # do not grow with K but with a run's length); one model each way would be about 1.
    assert runs("iid", method)["bytes_sent"] > 1.8 * runs("iid", "fedavg")["bytes_sent"]


def test_fedprox_fm_is_fedprox_with_feature_matching_plugged_in(runs: Runs) -> None:
    # Measured (accuracy %): FedProx 89.5; FedProx + FM at λ = 0 89.5 (FM off: FedProx itself), at λ = 1 89.6,
    # at the default λ = 10 82.3; FedFM (FM on FedAvg) at λ = 10 78.8 and at λ = 1 89.3. At λ = 10 the
    # matching term outweighs the task loss of a model trained on 12 samples a node for 12 rounds, on FedAvg
    # as on FedProx (starting FM at round 8 instead of 3: 78.4); the gap is FM's, not the composition's.
    fedprox = runs.accuracy("iid", "fedprox")
    assert abs(runs.accuracy("iid", "fedprox-fm", "lam = 0") - fedprox) < 0.01
    assert runs.accuracy("iid", "fedprox-fm", "lam = 1") > fedprox - 0.02
    assert runs.accuracy("iid", "fedprox-fm") > runs.accuracy("iid", "fedfm") - 0.02
