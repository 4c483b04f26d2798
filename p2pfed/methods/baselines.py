"""The baselines of pFedLIA (Rokvic et al. 2025, Table I), each one strategy (methods/strategy.py) run either way:
by a coordinator (``fedavg``, ``oracle``, ``local``, with the paper's partial participation) or peer to peer with
no coordinator (``fedavg-p2p``, ``oracle-p2p``, ``local-p2p``).

A baseline is a grouping alone: the group a node is in, whose members average their models by sample count.
FedAvg puts everyone in one group (one model for all, McMahan et al.); Oracle puts each node in its true
cluster (the upper bound of any clustering method); Local-only puts each node on its own (no model leaves
it). With a coordinator a group has one FedAvg model; peer to peer a node averages with the live peers of its
group, so both end a round with the group's average.

Every node trains in the rounds the participation sampling gives it, Local-only's too (as FL-bench, which
Rokvic et al. 2025 used for their baselines, samples local-only clients), so all methods get the same amount
of local computation and differ only in what they average.
"""

from __future__ import annotations

from p2pfed.methods.strategy import Coordinated, Knows, Peered, Strategy


class FedAvg(Strategy):
    """One group: one model for everyone (McMahan et al.)."""

    name, serves_one_model = "fedavg", True


class Oracle(Strategy):
    """The true clusters (known from the scenario's partition; the nodes of no known cluster, -1, are one more
    group)."""

    name = "oracle"

    def group(self, ctx: Knows, node: str) -> int | None:
        return ctx.true_cluster_of(node)


class Local(Strategy):
    """No collaboration: every node trains only on its own data."""

    name = "local"

    def group(self, ctx: Knows, node: str) -> int | None:
        return None


class FedAvgServer(Coordinated):
    strategy = FedAvg


class OracleServer(Coordinated):
    strategy = Oracle


class LocalServer(Coordinated):
    strategy = Local


class FedAvgPeer(Peered):
    strategy = FedAvg


class OraclePeer(Peered):
    strategy = Oracle


class LocalPeer(Peered):
    strategy = Local
