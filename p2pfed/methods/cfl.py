"""CFL (Sattler, Müller, Samek, 2020): clustered FL by recursive bipartition.

Every cluster is trained by FedAvg. After a cluster's round, with ΔW_i the update of each participant,
the cluster is split in two when FedAvg has converged for the cluster as a whole but not for its members:
||mean ΔW|| < ε1 (``eps1``) and max ||ΔW_i|| > ε2 (``eps2``), after ``warmup`` rounds and only if each
side gets at least ``min_size`` nodes (the ``[methods.cfl]`` table). The split is
the optimal bipartition of the cosine similarities of the updates: complete-linkage agglomerative
clustering into two groups (as the authors' code). Defaults ε1 = 0.4, ε2 = 1.6, warm-up 20 rounds are the
authors' and FL-bench's.

The split indexes members by their names, never by their position in the similarity sub-matrix: the
reference code takes positions in the sub-matrix of one cluster as global client ids, which moves the
wrong clients once the first split has happened (tests/methods/test_cfl.py checks this).

With partial participation a split sees only the members that trained that round. Paper and code assume
every client takes part, so here (our choice) a member that did not train is left pending between the
two halves and takes the one whose model fits its training data best the next time it trains or is
evaluated once both halves have trained since the split (right after a split both are copies of the
parent, so their losses cannot tell), the same rule that places a node that joins later. Until then it
trains and is evaluated on the parent's model, and its update is not averaged into either half.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from sklearn.cluster import AgglomerativeClustering

from p2pfed.config import ConfigError
from p2pfed.methods.central import ServerMethod, Task, Update, flatten
from p2pfed.methods.options import MethodOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CFLOptions(MethodOptions):
    """CFL's options, the scenario's [methods.cfl] table (the authors' defaults)."""

    eps1: float = 0.4  # split when ||mean update|| < ε1 ...
    eps2: float = 1.6  # ... and max ||update|| > ε2
    warmup: int = 20  # no split before this round
    min_size: int = 2  # each half of a split has at least this many nodes

    def validate(self, where: str) -> None:
        if not (self.eps1 > 0 and self.eps2 > 0) or self.min_size < 1 or self.warmup < 0:
            raise ConfigError(f"{where}eps1 and eps2 must be > 0, min_size >= 1 and warmup >= 0 (got {self.eps1}, "
                              f"{self.eps2}, {self.min_size}, {self.warmup})")


def bipartition(names: list[str], updates: list[torch.Tensor]) -> tuple[list[str], list[str]]:
    """Split names in two by the cosine similarity of their updates (complete linkage), by name."""
    u = torch.stack(updates)
    u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    similarity = (u @ u.T).numpy()
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(
        -similarity).labels_
    return ([n for n, lab in zip(names, labels, strict=True) if lab == 0],
            [n for n, lab in zip(names, labels, strict=True) if lab == 1])


class CFLServer(ServerMethod):
    """One cluster at first; clusters split when their members' updates disagree."""

    name = "cfl"
    options_type = CFLOptions
    options: CFLOptions

    def __init__(self, ctx: Any, options: CFLOptions) -> None:
        super().__init__(ctx, options)
        self.pending: dict[str, list[int]] = {}  # node -> the halves it may go to
        self.trained: set[int] = set()  # clusters that have trained since they were made
        self.splits: list[dict[str, Any]] = []  # what split when (for the record)

    def place(self, node: str, group: int) -> None:
        super().place(node, group)
        self.pending.pop(node, None)

    def knows(self, node: str) -> bool:
        return node in self.groups or node in self.pending

    def admit(self, node: str) -> None:
        if not self.models:
            self.models[0] = dict(self.ctx.initial)
        if len(self.models) == 1:
            self.groups[node] = 0
        else:
            self.pending[node] = sorted(self.models)  # a late joiner: the best-fitting cluster

    def _task(self, kind: str, node: str) -> Task:
        if node in self.pending:
            groups = self.pending[node]
            if all(g in self.trained for g in groups):
                return Task(kind, [self.models[g] for g in groups], groups=groups)
            return Task(kind, [self.models[groups[0]]])  # the parent's model still; no placement yet
        return super()._task(kind, node)

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        updates = {n: u for n, u in updates.items() if n in self.groups}  # pending nodes are not averaged
        self.trained.update(self.groups[n] for n in updates)
        before = {g: flatten(m) for g, m in self.models.items()}
        trained = {n: u for n, u in updates.items() if u.state is not None}
        deltas = {n: flatten(u.state) - before[self.groups[n]] for n, u in trained.items() if u.state is not None}
        super().aggregate(rnd, updates)
        o = self.options
        for g in sorted({self.groups[n] for n in deltas}):
            names = sorted(n for n in deltas if self.groups[n] == g)
            weights = torch.tensor([float(trained[n].samples) for n in names])
            mean = (torch.stack([deltas[n] for n in names]) * (weights / weights.sum())[:, None]).sum(0)
            mean_norm, max_norm = float(mean.norm()), max(float(deltas[n].norm()) for n in names)
            log.info("cfl: round %d: cluster %d: %d updates, ||mean ΔW|| %.3f, max ||ΔW|| %.3f", rnd, g,
                      len(names), mean_norm, max_norm)
            converging = mean_norm < o.eps1 and max_norm > o.eps2
            if rnd < o.warmup or not converging or len(names) < 2 * o.min_size:
                continue
            left, right = bipartition(names, [deltas[n] for n in names])
            if min(len(left), len(right)) < o.min_size:
                continue
            self._split(rnd, g, left, right, mean_norm, max_norm)

    def _split(self, rnd: int, g: int, left: list[str], right: list[str], mean_norm: float, max_norm: float) -> None:
        a, b = max(self.models) + 1, max(self.models) + 2
        self.models[a] = dict(self.models[g])
        self.models[b] = dict(self.models[g])
        del self.models[g]
        for n in left:
            self.groups[n] = a
        for n in right:
            self.groups[n] = b
        stay = [n for n, gn in self.groups.items() if gn == g]
        for n in stay:  # members that did not train this round: pending between the halves
            del self.groups[n]
            self.pending[n] = [a, b]
        for n, options in self.pending.items():
            if g in options:
                self.pending[n] = sorted({*options, a, b} - {g})
        self.splits.append({"round": rnd, "cluster": g, "into": [a, b], "left": left, "right": right,
                            "pending": stay, "mean_norm": mean_norm, "max_norm": max_norm})
        log.info("cfl: round %d: split cluster %d (%d trained, ||mean ΔW|| %.3f, max ||ΔW|| %.3f) into %d: %s "
                 "and %d: %s; %d members pending", rnd, g, len(left) + len(right), mean_norm, max_norm, a,
                 len(left), b, len(right), len(stay))

    def clusters(self) -> dict[str, int]:
        return {**self.groups, **{n: -1 for n in self.pending}}

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return {**data, "pending": self.pending, "splits": self.splits, "trained": sorted(self.trained)}, models

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.pending = {k: [int(x) for x in v] for k, v in data.get("pending", {}).items()}
        self.splits = list(data.get("splits", []))
        self.trained = set(data.get("trained", []))


