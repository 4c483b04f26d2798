"""D-PSGD, decentralized parallel SGD (Lian et al. 2017), over a fixed topology with Metropolis–Hastings
weights, as decentralizepy runs it: each round a node trains on its own data, sends its model to its
neighbours in the topology, and takes the weighted mean of its own model and theirs,

    x_i ← W_ii·x_i + Σ_{j ∈ N(i)} W_ij·x_j,   W_ij = 1 / (1 + max(d_i, d_j)),   W_ii = 1 − Σ_j W_ij,

a doubly stochastic mixing matrix (d: a node's degree), so the mesh's mean model is that of plain parallel SGD.
Options, ``[methods.dpsgd]``: ``topology`` (``ring``, ``torus``, ``regular``: a random d-regular graph,
``full``) and ``degree`` (d of ``regular``).

Where the paper is silent:
- The topology is laid over the learning members a node knows of, sorted by name (and, for ``regular``,
  drawn with the scenario's seed), so every node computes the same graph with no message. A member that dies
  or finishes keeps its place (the others' graphs must not shift under them in mid-round); one that joins
  late changes the graph for each node as it hears of it.
- A neighbour whose model did not come by the deadline (dead, finished, or not drawn to take part) leaves its
  weight with the node's own model: the row still sums to 1.
- Every node exchanges and mixes every round; the scenario's participation draw decides only who trains in
  a round (methods/base.py: ``Exchanging``), so the mixing stays doubly stochastic and the mean model is kept.
- Train, then mix, as decentralizepy runs it (Lian et al.'s Algorithm 1 mixes the models and steps with the
  gradient of the model before mixing in the same iteration).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import networkx as nx

from p2pfed.config import ConfigError
from p2pfed.methods.base import Mixing
from p2pfed.methods.options import MethodOptions
from p2pfed.scenario.config import Scenario

TOPOLOGIES = ("ring", "torus", "regular", "full")


@dataclass(frozen=True)
class DPSGDOptions(MethodOptions):
    """D-PSGD's options, the scenario's [methods.dpsgd] table."""

    topology: str = "ring"  # ring, torus (a 2-D grid that wraps around), regular (random d-regular) or full
    degree: int = 4  # d, each node's neighbours in the regular topology (at least 3; d·N must be even)

    def validate(self, where: str) -> None:
        if self.topology not in TOPOLOGIES:
            raise ConfigError(f"{where}topology must be one of {', '.join(TOPOLOGIES)} (got {self.topology!r})")
        if self.topology == "regular" and self.degree < 3:
            raise ConfigError(f"{where}degree must be >= 3 for a regular topology (degree 2 is a ring: topology = "
                              f'"ring"; got {self.degree})')

    def within(self, scenario: Scenario, where: str) -> None:
        if self.topology == "regular" and self.degree >= scenario.nodes:
            raise ConfigError(f"{where}degree ({self.degree}) must be below scenario.nodes ({scenario.nodes})")
        if self.topology == "regular" and self.degree * scenario.nodes % 2:
            raise ConfigError(f"{where}degree × scenario.nodes must be even for a regular graph "
                              f"({self.degree} × {scenario.nodes})")


@functools.lru_cache(maxsize=16)
def topology(kind: str, members: tuple[str, ...], seed: int, degree: int = 4) -> nx.Graph:
    """The graph of kind over members (their order is their place in a ring or grid), computed once for a
    process's nodes and rounds alike (a node asks on every model it is sent); callers only read it. A random
    d-regular graph that cannot exist for this many members (d ≥ N, or d·N odd) falls back to d − 1, and to a
    ring below that."""
    n = len(members)
    if n < 3 or kind == "full":
        graph = nx.complete_graph(n)
    elif kind == "ring":
        graph = nx.cycle_graph(n)
    elif kind == "torus":
        # rows × columns, as square as N allows (a prime N gives one row: a ring)
        rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
        grid = nx.grid_2d_graph(rows, n // rows, periodic=True)
        graph = nx.convert_node_labels_to_integers(nx.Graph(grid), ordering="sorted")
    else:
        d = min(degree, n - 1)
        d -= (d * n) % 2  # a d-regular graph on N nodes needs d·N even
        graph = nx.random_regular_graph(d, n, seed=seed) if d >= 3 else nx.cycle_graph(n)
    return nx.relabel_nodes(graph, dict(enumerate(members)))


def metropolis_hastings(graph: nx.Graph, node: str) -> dict[str, float]:
    """Node's row of the Metropolis–Hastings mixing matrix of graph: 1 / (1 + max(d_i, d_j)) for each neighbour
    j, and the rest for itself."""
    row = {j: 1.0 / (1 + max(graph.degree[node], graph.degree[j])) for j in graph.neighbors(node)}
    return {**row, node: 1.0 - sum(row.values())}


class DPSGD(Mixing):
    """Train, send to the topology's neighbours, mix with Metropolis–Hastings weights."""

    name = "dpsgd"
    options_type = DPSGDOptions
    options: DPSGDOptions

    def graph(self) -> nx.Graph:
        """The topology over the learning members this node knows of, in name order."""
        return topology(self.options.topology, tuple(self.node.members()), self.node.seed, self.options.degree)

    def sources(self, rnd: int) -> set[str]:
        return set(self.graph().neighbors(self.node.name))

    def weights(self, rnd: int) -> dict[str, float]:
        return metropolis_hastings(self.graph(), self.node.name)
