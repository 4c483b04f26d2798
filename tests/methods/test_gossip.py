"""Gossip averaging: every node computes the same partners, each exchange is two-way, a pair averages ½–½, and
a round's mix keeps the mesh's mean model."""

from __future__ import annotations

import pytest

from p2pfed.methods.gossip import Gossip, contacts, partner
from tests.methods.fake import FakePeers, models

NAMES = [f"n{i:02d}" for i in range(9)]


def method(name: str) -> Gossip:
    return Gossip(FakePeers(name, NAMES))  # type: ignore[arg-type]


def test_partners_are_drawn_alike_everywhere_never_oneself_and_change_with_the_round() -> None:
    draws = {rnd: [partner(0, n, rnd, NAMES) for n in NAMES] for rnd in range(4)}
    assert all(p != n for row in draws.values() for n, p in zip(NAMES, row, strict=True))
    assert draws[0] == [partner(0, n, 0, NAMES) for n in NAMES] and draws[0] != draws[1]
    assert partner(0, "n00", 0, ["n00"]) is None


def test_each_node_exchanges_with_the_peer_it_picked_and_the_peers_that_picked_it() -> None:
    for rnd in range(5):
        sources = {n: method(n).sources(rnd) for n in NAMES}
        assert all(partner(0, n, rnd, NAMES) in sources[n] for n in NAMES)
        assert all((a in sources[b]) == (b in sources[a]) for a in NAMES for b in NAMES)  # every exchange two-way


def test_a_pair_averages_half_and_half_and_the_end_of_a_path_a_third() -> None:
    pair = FakePeers("a", ["b"], own=2.0)
    mixed = Gossip(pair).aggregate(0, pair.mine(), models(b=6.0))  # type: ignore[arg-type]
    assert mixed is not None and mixed["w"].item() == pytest.approx(4.0)
    rnd = next(r for r in range(50) if len(contacts(0, r, ("a", "b", "c")).edges) == 2)  # a path: one end has one
    graph = contacts(0, rnd, ("a", "b", "c"))
    end = next(n for n in graph.nodes if graph.degree[n] == 1)
    other = next(iter(graph.neighbors(end)))
    node = FakePeers(end, ["a", "b", "c"], own=2.0)
    mixed = Gossip(node).aggregate(rnd, node.mine(), models(**{other: 6.0}))  # type: ignore[arg-type]
    assert mixed is not None and mixed["w"].item() == pytest.approx(6.0 * 1 / 3 + 2.0 * 2 / 3)  # 1/(1+max(1,2))


@pytest.mark.parametrize("out", [frozenset(), frozenset({"n02", "n05"})])
def test_a_rounds_mix_keeps_the_mean_model_whoever_trains(out: frozenset[str]) -> None:
    values = {n: float(i * i) for i, n in enumerate(NAMES)}
    for rnd in range(3):
        new = {}
        for n in NAMES:
            view = FakePeers(n, NAMES, own=values[n], out=out)
            node = Gossip(view)  # type: ignore[arg-type]
            sent = {p: values[p] for p in node.expected(rnd)}  # what the peers it waits for send it
            assert all(n in Gossip(FakePeers(p, NAMES, out=out)).subscribers(rnd)  # type: ignore[arg-type]
                       for p in sent)
            mixed = node.aggregate(rnd, view.mine(), models(**sent))
            new[n] = mixed["w"].item() if mixed is not None else values[n]
        assert sum(new.values()) == pytest.approx(sum(values.values()))
        assert max(new.values()) - min(new.values()) < max(values.values()) - min(values.values())
        values = new
