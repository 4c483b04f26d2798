"""Clustered Additive Modeling (Fed-CAM; Ma et al. 2023): a global model Θ_g plus K cluster models Θ_1:K, and
node i predicts with the logits h(x; Θ_g) + f(x; Θ_c(i)) (Eq. 1). The global model learns what all
clusters share, so the cluster models only learn how clusters differ, which keeps one cluster model from
taking every node ("clustering collapse").

Each round a participant trains two copies in parallel (Algorithm 1, lines 3–5): θ_i from its cluster's
model with Θ_g fixed (Eq. 5; Eq. 13 adds FeSEM-CAM's λ/2·||θ_i − Θ_c(i)||²), and θ_i^0 from Θ_g with its
cluster's model fixed (Eq. 8 / 15), and sends both back. The server updates the cluster models (Eq. 6
for IFCA-CAM, Eq. 11 for FeSEM-CAM) and the global model as the sample-weighted mean of the θ_i^0 (Eq. 9).

- ``ifca-cam``: a node joins the cluster whose model gives the lowest CAM loss on its data (Eq. 2), so
  every train and eval task carries all K cluster models. Warm-up (Algorithm 1): ``warmup`` rounds of
  plain FedAvg give a warm Θ_g first; the K cluster models start from random initialisations.
- ``fesem-cam``: the server assigns each node the cluster model nearest its last θ_i and recomputes the
  centroids weighted by sample counts (Eq. 11), iterating assignment and centroids until they settle
  (at most 10 times: "a few times until convergence"). Distances are over the parameters of the
  fully-connected layers only, as the paper's experiments measure them (§5); centroids are whole models.
  Warm-up: every node trains ``warmup`` local epochs, and k-means (20 restarts, as FeSEM) over those
  models gives the first clusters; Θ_g starts from the shared initial model. λ is ``penalty``.

Options: ``[methods.ifca-cam]`` ``k`` and ``warmup`` (default 5); ``[methods.fesem-cam]`` ``k``, ``warmup``
(default 5) and ``penalty`` (λ, default 0.01).

With partial participation, Eq. 6's n is the sample count of this round's participants (the m clients of
the paper's equation all take part there), so a cluster model moves toward its participants in
proportion to their share of the round's data, and stays put if none of its members trained.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from p2pfed.config import ConfigError
from p2pfed.learn.train import Evaluation, weighted_average
from p2pfed.methods.central import (
    MAX_EPOCHS,
    MAX_PENALTY,
    ClientMethod,
    Instructions,
    ServerMethod,
    Task,
    Update,
    flatten,
    keyed,
    kmeans_groups,
    nearest_groups,
    unkeyed,
)
from p2pfed.methods.options import ClusteredOptions, below_rounds
from p2pfed.scenario.config import Scenario

log = logging.getLogger(__name__)


class Additive(nn.Module):
    """CAM's model for one node: the logits of the global part plus those of its cluster part (Eq. 1)."""

    def __init__(self, global_part: nn.Module, cluster_part: nn.Module) -> None:
        super().__init__()
        self.h = global_part
        self.f = cluster_part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.h(x) + self.f(x)


class CAMClient(ClientMethod):
    """A node's side of IFCA-CAM and FeSEM-CAM. Tasks without a shared global model (the warm-up) are
    plain local training and evaluation."""

    def _additive(self, global_state: dict[str, torch.Tensor], cluster_state: dict[str, torch.Tensor],
                  train: str | None = None) -> Additive:
        model = Additive(self.node.new_model(global_state), self.node.new_model(cluster_state))
        for part in ("h", "f"):
            for p in getattr(model, part).parameters():
                p.requires_grad_(part == train)  # only the part being trained moves
        return model

    async def _choose(self, task: Task) -> int:
        """Eq. 2: the cluster model whose CAM prediction has the lowest loss on this node's data."""
        if len(task.candidates) == 1:
            return 0
        losses = [await self.node.train_loss(self._additive(task.models[0], c)) for c in task.candidates]
        return int(np.argmin(losses))

    async def train(self, task: Task) -> tuple[Update, int]:
        if task.shared != 1:
            return await super().train(task)
        global_state = task.models[0]
        choice = await self._choose(task)
        start = task.candidates[choice]
        coef = task.instructions.penalty
        cluster_side = self._additive(global_state, start, train="f")  # θ_i, Eq. 5 / 13
        anchor = {k: v.detach().clone() for k, v in start.items()}

        def penalty(model: nn.Module) -> torch.Tensor:
            total = torch.zeros(())
            for name, p in model.f.named_parameters():  # type: ignore[union-attr]
                total = total.to(p.device) + ((p - anchor[name].to(p.device)) ** 2).sum()
            return 0.5 * coef * total

        loss = await self.node.fit(cluster_side, penalty if coef else None)
        global_side = self._additive(global_state, start, train="h")  # θ_i^0, Eq. 8 / 15
        await self.node.fit(global_side)
        theta = {k: v.detach().to("cpu", copy=True) for k, v in cluster_side.f.state_dict().items()}
        theta0 = {k: v.detach().to("cpu", copy=True) for k, v in global_side.h.state_dict().items()}
        return Update(theta, choice=choice, train_loss=loss, extra=[theta0]), choice

    async def evaluate(self, task: Task) -> tuple[Evaluation, int]:
        if task.shared != 1:
            return await super().evaluate(task)
        choice = await self._choose(task)
        return await self.node.test(self._additive(task.models[0], task.candidates[choice])), choice


@dataclass(frozen=True)
class IFCACAMOptions(ClusteredOptions):
    """IFCA-CAM's options, the scenario's [methods.ifca-cam] table: K, and the FedAvg rounds before the cluster
    models join."""

    warmup: int = 5

    def within(self, scenario: Scenario, where: str) -> None:
        super().within(scenario, where)
        below_rounds(self.warmup, "warmup", scenario, where, "the warm-up would leave no round for the cluster "
                     "models")


@dataclass(frozen=True)
class FeSEMCAMOptions(ClusteredOptions):
    """FeSEM-CAM's options, the scenario's [methods.fesem-cam] table: K, the local epochs of the warm-up that
    makes the first clusters, and λ of Eq. 12."""

    warmup: int = 5
    penalty: float = 0.01  # λ of Eq. 12

    def validate(self, where: str) -> None:
        super().validate(where)
        if not 1 <= self.warmup <= MAX_EPOCHS or not 0 <= self.penalty <= MAX_PENALTY:
            raise ConfigError(f"{where}warmup must be in [1, {MAX_EPOCHS}] and penalty in [0, {MAX_PENALTY:g}] (got "
                              f"{self.warmup}, {self.penalty})")


class CAMServer(ServerMethod):
    """What IFCA-CAM and FeSEM-CAM share: the global model, the tasks, Eq. 9."""

    client = CAMClient
    options: IFCACAMOptions | FeSEMCAMOptions

    def __init__(self, ctx: Any, options: IFCACAMOptions | FeSEMCAMOptions) -> None:
        super().__init__(ctx, options)
        self.global_model: dict[str, torch.Tensor] = dict(ctx.initial)
        self.joint = False  # past the warm-up

    @property
    def k(self) -> int:
        return int(self.options.k or self.ctx.clusters_hint)

    def admit(self, node: str) -> None:
        return None  # placed by its data (lowest CAM loss) until the method's rule places it

    def _task(self, kind: str, node: str) -> Task:
        if not self.joint:
            return Task(kind, [self.global_model])
        task = super()._task(kind, node)
        return Task(kind, [self.global_model, *task.models], task.instructions, task.groups, shared=1)

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        ups = {n: u for n, u in updates.items() if u.state is not None}
        if not ups:
            return
        if not self.joint:  # warm-up FedAvg of the global model alone
            self.global_model = weighted_average([u.state for u in ups.values() if u.state is not None],
                                                 [float(u.samples) for u in ups.values()])
            return
        ups = {n: u for n, u in ups.items() if u.extra}
        self.update_clusters(rnd, ups)
        total = float(sum(u.samples for u in ups.values()))  # Eq. 9
        if ups:
            self.global_model = weighted_average([u.extra[0] for u in ups.values()],
                                                 [u.samples / total for u in ups.values()])

    def update_clusters(self, rnd: int, updates: dict[str, Update]) -> None:
        raise NotImplementedError

    def clusters(self) -> dict[str, int]:
        return dict(self.groups) if self.joint else {}

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return {**data, "joint": self.joint}, {**models, "global": self.global_model}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.joint = bool(data.get("joint", False))
        self.global_model = models.get("global", self.global_model)


class IFCACAMServer(CAMServer):
    """IFCA-CAM: min-loss assignment on the nodes (Eq. 2), Eq. 6 for the cluster models."""

    name = "ifca-cam"
    options_type = IFCACAMOptions

    async def before_round(self, rnd: int, live: list[str]) -> None:
        if not self.joint and rnd >= self.options.warmup:
            self.models = {g: self.ctx.build(self.ctx.seed + 1 + g) for g in range(self.k)}
            self.joint = True
            log.info("ifca-cam: round %d: warm-up over, %d cluster models join the global one", rnd, self.k)

    def _task(self, kind: str, node: str) -> Task:
        if not self.joint:
            return Task(kind, [self.global_model])
        groups = sorted(self.models)  # every node chooses anew each time (Eq. 2)
        return Task(kind, [self.global_model, *(self.models[g] for g in groups)], groups=groups, shared=1)

    def update_clusters(self, rnd: int, updates: dict[str, Update]) -> None:
        n = float(sum(u.samples for u in updates.values()))
        for g in self.models:
            members = [m for m in updates if self.groups.get(m) == g]
            if not members:
                continue
            share = sum(updates[m].samples for m in members) / n
            states = [self.models[g], *(updates[m].state for m in members)]
            weights = [1 - share, *(updates[m].samples / n for m in members)]
            self.models[g] = weighted_average([s for s in states if s is not None], weights)  # Eq. 6


class FeSEMCAMServer(CAMServer):
    """FeSEM-CAM: K-means on the nodes' cluster-side models θ_i (Eq. 10–11), λ-regularised local update."""

    name = "fesem-cam"
    options_type = FeSEMCAMOptions
    options: FeSEMCAMOptions

    def __init__(self, ctx: Any, options: FeSEMCAMOptions) -> None:
        super().__init__(ctx, options)
        self.local: dict[str, dict[str, torch.Tensor]] = {}
        self.flat: dict[str, torch.Tensor] = {}  # each θ_i's fully-connected parameters, as one vector
        self.samples: dict[str, int] = {}
        template = ctx.module(ctx.initial)
        self.fc_keys = [f"{name}.{p}" for name, m in template.named_modules() if isinstance(m, nn.Linear)
                        for p, _ in m.named_parameters(recurse=False)]

    def _fc(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """The parameters FeSEM-CAM measures distances on (all of them if the model has no linear layer)."""
        return flatten({k: state[k] for k in self.fc_keys} if self.fc_keys else state)

    async def before_round(self, rnd: int, live: list[str]) -> None:
        if self.joint or not live:
            return
        epochs = self.options.warmup
        tasks = {n: Task("train", [self.ctx.initial], Instructions(epochs=epochs)) for n in live}
        replies = await self.ctx.ask(live, tasks)
        ups = {n: u for n, u in replies.items() if isinstance(u, Update) and u.state is not None}
        if len(ups) < self.k:
            raise RuntimeError(f"fesem-cam: {len(ups)} nodes answered the warm-up, fewer than K = {self.k}")
        self._store(ups)
        self.groups = kmeans_groups(self.flat, self.k, self.ctx.seed)
        self._centroids()
        self.joint = True
        log.info("fesem-cam: warm-up of %d local epochs on %d nodes; cluster sizes %s", epochs, len(self.flat),
                 np.bincount(list(self.groups.values()), minlength=self.k).tolist())

    def _store(self, updates: dict[str, Update]) -> None:
        """Keep each node's θ_i (and as one vector, for the distances) and its sample count."""
        for n, u in updates.items():
            if u.state is not None:
                self.local[n], self.flat[n], self.samples[n] = u.state, self._fc(u.state), u.samples

    def _task(self, kind: str, node: str) -> Task:
        task = super()._task(kind, node)
        if self.joint:
            # Eq. 12: λ/2·||θ_i − Θ_c(i)||²
            task.instructions = replace(task.instructions, penalty=self.options.penalty)
        return task

    def update_clusters(self, rnd: int, updates: dict[str, Update]) -> None:
        self._store(updates)
        for _ in range(10):  # Eq. 11, iterated until the assignment settles
            new = nearest_groups(self.flat, {g: self._fc(m) for g, m in self.models.items()})
            moved = any(self.groups.get(n) != g for n, g in new.items())
            self.groups.update(new)
            self._centroids()
            if not moved:
                break

    def _centroids(self) -> None:
        for g in range(self.k):
            members = [n for n, gn in self.groups.items() if gn == g and n in self.local]
            if members:
                self.models[g] = weighted_average([self.local[m] for m in members],
                                                  [float(self.samples.get(m, 1)) for m in members])

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return {**data, "samples": self.samples}, {**models, **keyed("local", self.local)}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.samples = {k: int(v) for k, v in data.get("samples", {}).items()}
        self.local = unkeyed("local", models)
        self.flat = {n: self._fc(s) for n, s in self.local.items()}
