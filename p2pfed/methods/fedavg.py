"""The classic server baselines of pFedLIA (Rokvic et al. 2025, Table I), run by a coordinator with the
paper's partial participation: FedAvg (one model for everyone), Oracle (one FedAvg per true cluster, the
upper bound of any clustering method) and Local-only (every node keeps and trains its own model; the
coordinator only says who trains when, so all methods do the same local work). They differ only in the
grouping, so they share one module; their decentralized forms are in baselines.py.
"""

from __future__ import annotations

import torch

from p2pfed.methods.central import ServerMethod, Task, Update


class FedAvgServer(ServerMethod):
    """McMahan et al.: participants train the global model; it becomes their sample-weighted mean."""

    name = "fedavg"

    def served_model(self) -> dict[str, torch.Tensor] | None:
        return self.models.get(0)


class OracleServer(ServerMethod):
    """FedAvg inside each true cluster (known from the scenario's partition)."""

    name = "oracle"

    def admit(self, node: str) -> None:
        group = self.ctx.true_cluster_of(node)
        self.groups[node] = group
        self.models.setdefault(group, dict(self.ctx.initial))


class LocalServer(ServerMethod):
    """Local-only: no model leaves a node. A train task carries no model; the node trains its own."""

    name = "local"

    def admit(self, node: str) -> None:
        self.groups[node] = -1  # no group: every node is on its own

    def train_task(self, rnd: int, node: str) -> Task:
        return Task("train")

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        return None

    def eval_task(self, node: str) -> Task:
        return Task("eval")

    def clusters(self) -> dict[str, int]:
        return {}
