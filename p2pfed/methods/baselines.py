"""The decentralized forms of the baselines of pFedLIA (Rokvic et al. 2025), with no coordinator: Local-only,
FedAvg (everyone averages with everyone) and Oracle (averages only within the true cluster, the upper bound
of any clustering method). Their classic server forms are ``local``, ``fedavg`` and ``oracle`` (fedavg.py)."""

from __future__ import annotations

from p2pfed.methods.base import Method


class Local(Method):
    """No collaboration: a node trains only on its own data.

    It trains in the rounds the participation sampling gives it, like every other method (as FL-bench,
    which Rokvic et al. 2025 used for their baselines, samples local-only clients), so all methods get the same
    amount of local computation and differ only in what they average.
    """

    name = "local-p2p"

    def sources(self, rnd: int) -> set[str]:
        return set()


class FedAvg(Method):
    """Every node averages with every live node: one model for all (McMahan et al.)."""

    name = "fedavg-p2p"


class Oracle(Method):
    """FedAvg inside the true clusters only (known from the scenario's partition)."""

    name = "oracle-p2p"

    def sources(self, rnd: int) -> set[str]:
        mine = self.node.true_cluster_of(self.node.name)
        return {p for p in self.node.live_peers() if self.node.true_cluster_of(p) == mine}
