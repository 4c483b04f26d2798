"""The baselines of pFedLIA (Rokvic et al. 2025, Table I), each defined once and run either way: by a
coordinator (``fedavg``, ``oracle``, ``local``, with the paper's partial participation) or peer to peer with no
coordinator (``fedavg-p2p``, ``oracle-p2p``, ``local-p2p``).

A baseline is a rule alone: the group a node is in, whose members average their models by sample count.
FedAvg puts everyone in one group (one model for all, McMahan et al.); Oracle puts each node in its true
cluster (the upper bound of any clustering method); Local-only puts each node on its own (no model leaves
it). Its coordinated form (``ServerForm``) keeps one FedAvg model per group; its peer-to-peer form
(``PeerForm``) averages with the live peers of its group, so both end a round with the group's average.

Every node trains in the rounds the participation sampling gives it, Local-only's too (as FL-bench, which
Rokvic et al. 2025 used for their baselines, samples local-only clients), so all methods get the same amount
of local computation and differ only in what they average.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import torch

from p2pfed.methods.base import Method
from p2pfed.methods.central import ServerContext, ServerMethod, Task, Update


class Knows(Protocol):
    """What a rule may ask of whoever runs it, a node or a coordinator."""

    def true_cluster_of(self, name: str) -> int:
        """A node's true cluster (from the scenario's partition), -1 if unknown."""


class Baseline:
    """The group of each node; None: the node is on its own."""

    serves_one_model: ClassVar[bool] = False  # every node gets the same model (a server test set can test it)

    @staticmethod
    def group(ctx: Knows, node: str) -> int | None:
        raise NotImplementedError


class FedAvg(Baseline):
    """One group: one model for everyone (McMahan et al.)."""

    serves_one_model = True

    @staticmethod
    def group(ctx: Knows, node: str) -> int | None:
        return 0


class Oracle(Baseline):
    """The true clusters (known from the scenario's partition; the nodes of no known cluster, -1, are one more
    group)."""

    @staticmethod
    def group(ctx: Knows, node: str) -> int | None:
        return ctx.true_cluster_of(node)


class Local(Baseline):
    """No collaboration: every node trains only on its own data."""

    @staticmethod
    def group(ctx: Knows, node: str) -> int | None:
        return None


class ServerForm(ServerMethod):
    """A baseline run by a coordinator: FedAvg per group; a node on its own gets train tasks with no model,
    trains its own, and anything it sends back is ignored."""

    baseline: ClassVar[type[Baseline]]

    def __init__(self, ctx: ServerContext, options: Any) -> None:
        super().__init__(ctx, options)
        self.alone: set[str] = set()  # the nodes on their own

    def knows(self, node: str) -> bool:
        return node in self.groups or node in self.alone

    def admit(self, node: str) -> None:
        group = self.baseline.group(self.ctx, node)
        if group is None:
            self.alone.add(node)
            return
        self.groups[node] = group
        self.models.setdefault(group, dict(self.ctx.initial))

    def train_task(self, rnd: int, node: str) -> Task:
        return Task("train") if node in self.alone else super().train_task(rnd, node)

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        super().aggregate(rnd, {node: up for node, up in updates.items() if node not in self.alone})

    def eval_task(self, node: str) -> Task:
        return Task("eval") if node in self.alone else super().eval_task(node)

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return {**data, "alone": sorted(self.alone)}, models

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.alone = set(data.get("alone", []))

    def served_model(self) -> dict[str, torch.Tensor] | None:
        return self.models.get(0) if self.baseline.serves_one_model else None


class PeerForm(Method):
    """A baseline run peer to peer: a node averages with the live peers of its group."""

    baseline: ClassVar[type[Baseline]]

    def sources(self, rnd: int) -> set[str]:
        mine = self.baseline.group(self.node, self.node.name)
        if mine is None:
            return set()
        return {p for p in self.node.live_peers() if self.baseline.group(self.node, p) == mine}


class FedAvgServer(ServerForm):
    name, baseline = "fedavg", FedAvg


class OracleServer(ServerForm):
    name, baseline = "oracle", Oracle


class LocalServer(ServerForm):
    name, baseline = "local", Local


class FedAvgPeer(PeerForm):
    name, baseline = "fedavg-p2p", FedAvg


class OraclePeer(PeerForm):
    name, baseline = "oracle-p2p", Oracle


class LocalPeer(PeerForm):
    name, baseline = "local-p2p", Local
