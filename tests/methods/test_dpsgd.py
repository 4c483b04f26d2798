"""D-PSGD: the topologies, the Metropolis–Hastings weights, the mix (a missing neighbour's weight stays with the
node), a graph that does not shift when a member dies, and the options' errors."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from p2pfed.config import ConfigError
from p2pfed.methods import load_checked
from p2pfed.methods.dpsgd import DPSGD, DPSGDOptions, metropolis_hastings, topology
from tests.methods.fake import FakePeers, models

NAMES = tuple(f"n{i:02d}" for i in range(12))


@pytest.mark.parametrize(("kind", "n", "degree"), [("ring", 8, 2), ("torus", 12, 4), ("regular", 10, 4),
                                                   ("full", 5, 4), ("regular", 7, 2), ("torus", 7, 2)])
def test_every_topology_gives_every_member_its_degree(kind: str, n: int, degree: int) -> None:
    # (a 3-regular graph of 7 cannot exist: d·N odd, so d − 1 = 2, a ring; a prime N's torus is a ring)
    graph = topology(kind, NAMES[:n], seed=3, degree=4 if kind == "regular" and n == 10 else 3)
    assert len(graph.edges) == n * degree // 2
    assert tuple(sorted(graph.nodes)) == NAMES[:n] and nx.is_connected(graph)
    assert {d for _, d in graph.degree} == {degree}


def test_the_random_regular_graph_is_the_same_on_every_node_and_changes_with_the_seed() -> None:
    edges = {seed: sorted(map(sorted, topology("regular", NAMES, seed=seed).edges)) for seed in (0, 1)}
    topology.cache_clear()  # drawn again, as another process would
    assert edges[0] == sorted(map(sorted, topology("regular", NAMES, seed=0).edges)) and edges[0] != edges[1]


def test_metropolis_hastings_weights_are_doubly_stochastic_on_an_irregular_graph() -> None:
    graph = nx.relabel_nodes(nx.lollipop_graph(4, 3), dict(enumerate(NAMES)))  # degrees 3, 4, 2 and 1
    rows = {node: metropolis_hastings(graph, node) for node in graph.nodes}
    matrix = np.array([[rows[i].get(j, 0.0) for j in graph.nodes] for i in graph.nodes])
    assert np.allclose(matrix.sum(axis=1), 1) and np.allclose(matrix, matrix.T) and (matrix >= 0).all()
    assert rows["n00"]["n01"] == pytest.approx(1 / 4)  # 1 / (1 + max(3, 3))
    assert rows["n03"]["n04"] == pytest.approx(1 / 5)  # 1 / (1 + max(4, 2))


def test_a_node_mixes_its_ring_neighbours_a_missing_ones_weight_stays_with_its_own() -> None:
    node = FakePeers("b", ["a", "c", "d"], own=3.0)
    method = DPSGD(node, DPSGDOptions(topology="ring"))  # type: ignore[arg-type]
    assert method.sources(0) == method.subscribers(0) == method.expected(0) == {"a", "c"}
    assert method.accepts("model", "a", 0) and not method.accepts("model", "d", 0)  # not a neighbour: refused
    assert not method.accepts("partial", "a", 0)  # nor a kind it does not take
    mixed = method.aggregate(0, node.mine(), models(a=0.0, c=6.0))
    assert mixed is not None and mixed["w"].item() == pytest.approx(3.0)  # (0 + 3 + 6) / 3
    alone = method.aggregate(0, node.mine(), models(a=0.0))
    assert alone is not None and alone["w"].item() == pytest.approx(2.0)  # 0/3 + 3·2/3
    assert method.aggregate(0, node.mine(), {}) is None


def test_a_node_drawn_out_of_training_still_exchanges_and_mixes() -> None:
    # c does not train this round: it still sends its model, waits for its neighbours' and mixes them (were it to
    # sit the round out, it would wait for nobody and run rounds ahead of them)
    c = FakePeers("c", ["a", "b", "d"], own=3.0, out=frozenset({"c"}))
    method = DPSGD(c, DPSGDOptions(topology="ring"))  # type: ignore[arg-type]
    assert not method.takes_part(0) and method.sends(0)
    assert method.expected(0) == method.subscribers(0) == {"b", "d"}
    mixed = method.aggregate(0, c.mine(), models(b=0.0, d=6.0))
    assert mixed is not None and mixed["w"].item() == pytest.approx(3.0)


def test_a_dead_member_keeps_its_place_it_is_not_sent_to() -> None:
    alive = DPSGD(FakePeers("b", ["a", "c", "d"]), DPSGDOptions())  # type: ignore[arg-type]
    one_dead = DPSGD(FakePeers("b", ["a", "c", "d"], live=["a", "d"]), DPSGDOptions())  # type: ignore[arg-type]
    assert one_dead.sources(3) == alive.sources(3) == {"a", "c"} and one_dead.subscribers(3) == {"a"}


@pytest.mark.parametrize(("table", "error"), [
    ('topology = "star"', "methods.dpsgd.topology must be one of ring, torus, regular, full (got 'star')"),
    ('topology = "regular"\ndegree = 2', "methods.dpsgd.degree must be >= 3 for a regular topology"),
    ('topology = "regular"\ndegree = 6', "methods.dpsgd.degree (6) must be below scenario.nodes (6)"),
    ('topology = "regular"\ndegree = 3\n[scenario]\nnodes = 5', "degree × scenario.nodes must be even"),
])
def test_options_that_cannot_work_are_refused_naming_the_key(tmp_path: Path, table: str, error: str) -> None:
    path = tmp_path / "s.toml"
    nodes = "" if "nodes = 5" in table else "nodes = 6\n"
    method_table, _, scenario_extra = table.partition("\n[scenario]\n")
    path.write_text(f'[scenario]\nname = "t"\n{nodes}{scenario_extra}\nmethods = ["dpsgd"]\n'
                    f'[data]\ndataset = "digits"\n[methods.dpsgd]\n{method_table}\n')
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
        load_checked(path)
