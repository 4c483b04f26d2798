"""FedAvg, Oracle and Local-only are one rule each, run by a coordinator or peer to peer: the same groups
either way, a node on its own gets no model and what it sends back is ignored, and a restarted coordinator
knows who was on its own."""

from __future__ import annotations

import torch

from p2pfed.methods.baselines import LocalPeer, LocalServer, OraclePeer, OracleServer
from p2pfed.methods.central import Update
from tests.methods.fake import FakeCoordinator, FakePeers, vec

CLUSTERS = {"a": 0, "b": 0, "c": 1, "x": -1, "y": -1}  # x and y: no known cluster


class Clustered(FakeCoordinator):
    def true_cluster_of(self, name: str) -> int:
        return CLUSTERS[name]


class ClusteredPeers(FakePeers):
    def true_cluster_of(self, name: str) -> int:
        return CLUSTERS[name]


async def test_oracle_groups_the_same_either_way_the_unknown_ones_together() -> None:
    server = OracleServer(Clustered(lambda n, t: None), None)
    await server.before_round(0, list(CLUSTERS))
    assert server.clusters() == CLUSTERS and sorted(server.models) == [-1, 0, 1]
    for node in CLUSTERS:
        peers = OraclePeer(ClusteredPeers(node, list(CLUSTERS)))  # type: ignore[arg-type]
        assert peers.sources(0) == {p for p, c in CLUSTERS.items() if c == CLUSTERS[node] and p != node}


async def test_local_sends_no_model_ignores_what_comes_back_and_survives_a_restart() -> None:
    server = LocalServer(FakeCoordinator(lambda n, t: None), None)
    await server.before_round(0, ["a", "b"])
    train, ev = server.train_task(0, "a"), server.eval_task("a")
    assert (train.kind, train.models, ev.kind, ev.models) == ("train", [], "eval", [])
    server.aggregate(0, {"a": Update(vec(5.0), 10)})  # a node that sends a model anyway
    assert server.models == {} and server.clusters() == {}
    data, models = server.state()
    restored = LocalServer(FakeCoordinator(lambda n, t: None), None)
    restored.restore(data, models)
    assert restored.knows("a") and restored.train_task(1, "b").models == []
    assert LocalPeer(FakePeers("a", ["b", "c"])).sources(0) == set()  # type: ignore[arg-type]


async def test_oracle_with_a_coordinator_averages_each_group_by_sample_count() -> None:
    server = OracleServer(Clustered(lambda n, t: None), None)
    await server.before_round(0, list(CLUSTERS))
    server.aggregate(0, {"a": Update(vec(1.0), 1), "b": Update(vec(4.0), 2), "c": Update(vec(7.0), 1)})
    assert server.models[0]["w"].tolist() == [3.0] and server.models[1]["w"].tolist() == [7.0]
    assert torch.equal(server.models[-1]["w"], torch.zeros(4))  # nobody of the unknown group trained
