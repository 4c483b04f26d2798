"""Gossip averaging, push-pull with one random peer per round (randomized gossip, Boyd et al. 2006, in the
synchronous rounds of decentralized SGD): each round a node trains on its own data, picks one other live
member at random, pushes its model to it and pulls that member's model back; it then mixes its model with
every model it exchanged in the round.

Where the sources are silent (randomized gossip averages one pair per tick; here every node picks a partner in
the same round, so a node may be picked by several):
- The round's contacts form a graph (an edge between each node and the partner it picked). A node mixes with
  the Metropolis–Hastings weights of that graph (methods/dpsgd.py), so the mixing stays doubly stochastic
  and the mesh's mean model is kept, as pairwise averaging keeps it; with one contact each it is the pairwise
  average (½, ½).
- Every node draws every node's partner from the scenario's seed, the node's name and the round, among the
  learning members it knows of, so each knows whose models to wait for with no message: the peers it picked
  and the peers that picked it. A member that died or finished keeps its place in the draw (a pick of it is
  a round without that exchange), so the draws do not shift under the others in mid-round.
- Every node exchanges and mixes every round; the scenario's participation draw decides only who trains in
  a round (methods/base.py: ``Exchanging``), so the mixing stays doubly stochastic and the mean model is kept.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import networkx as nx

from p2pfed.methods.base import Mixing, shared_rng
from p2pfed.methods.dpsgd import metropolis_hastings


def partner(seed: int, node: str, rnd: int, members: Sequence[str]) -> str | None:
    """The member node picks in round rnd (None if it is alone): a draw every node computes alike."""
    others = [m for m in members if m != node]
    if not others:
        return None
    return others[int(shared_rng(seed, "gossip", node, rnd).integers(len(others)))]


@functools.lru_cache(maxsize=64)
def contacts(seed: int, rnd: int, members: tuple[str, ...]) -> nx.Graph:
    """The round's contact graph: an edge from every member to the partner it picked (drawn once for a process's
    nodes alike: a node asks on every model it is sent); callers only read it."""
    graph = nx.Graph()
    graph.add_nodes_from(members)
    for node in members:
        other = partner(seed, node, rnd, members)
        if other is not None:
            graph.add_edge(node, other)
    return graph


class Gossip(Mixing):
    """Train, exchange with one random peer (and whoever picked this node), mix."""

    name = "gossip"

    def graph(self, rnd: int) -> nx.Graph:
        """The round's contacts among the learning members this node knows of."""
        return contacts(self.node.seed, rnd, tuple(self.node.members()))

    def sources(self, rnd: int) -> set[str]:
        return set(self.graph(rnd).neighbors(self.node.name))

    def weights(self, rnd: int) -> dict[str, float]:
        return metropolis_hastings(self.graph(rnd), self.node.name)
