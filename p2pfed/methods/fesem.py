"""FeSEM (Long et al. 2023): multi-center FL solved by federated stochastic EM.

Each round (Algorithm 1): E-step, every node goes to the center nearest its local model W_i (Eq. 8,
Euclidean distance of the parameters); M-step, each center is the plain mean of its members' W_i (Eq. 9,
not weighted by samples: the paper's objective weighs nodes equally); local update, a participant starts
from its center and minimises its loss plus λ·||W_i − W̃_k||² (Eq. 7, with the paper's λ/m folded into
``[methods.fesem] penalty`` and the squared distance for a smooth gradient; the E-step's argmin is the same).

Choices where the paper leaves room, and why:
- K is given (``[methods.fesem] k``, default the scenario's number of clusters): pFedLIA's paper
  (Rokvic et al. 2025) ran FeSEM with the correct K too, and the FeSEM paper picks K by trying several.
- Initial centers: as the paper's experiments, "pure clustering 20 times with randomized
  initialization", keeping the one with the least intra-cluster distance: in round 0 every live node
  trains the shared initial model on its data (its first W_i), and k-means with 20 restarts
  (scikit-learn, ``n_init=20``, lowest inertia) over the W_i gives the first assignment and centers.
- With partial participation the server keeps every node's latest W_i, so the E/M steps run over all
  nodes each round, with the stale W_i of those who did not train.
- A node that joins later has no W_i yet: it starts from the center that fits its data best (lowest
  training loss), and the E-step places it once it has sent its first W_i.
- Participation: the scenario's (``train.participation``), so that FeSEM trains as often as the methods it is
  compared with (Rokvic et al. 2025 run it at 10%), unless ``[methods.fesem] participation`` says otherwise:
  the FeSEM paper runs every client every round ("the clustering algorithm usually requires the full
  participation of all clients"), which ``participation = 1.0`` reproduces.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from p2pfed.config import ConfigError
from p2pfed.learn.train import weighted_average
from p2pfed.methods.central import (
    MAX_PENALTY,
    ServerMethod,
    Task,
    Update,
    flatten,
    keyed,
    kmeans_groups,
    nearest_groups,
    participates,
    unkeyed,
)
from p2pfed.methods.options import ClusteredOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeSEMOptions(ClusteredOptions):
    """FeSEM's options, the scenario's [methods.fesem] table: K and λ (penalty)."""

    penalty: float = 0.01  # λ of Eq. 7 (λ/m folded in)
    # the share of nodes training each round; 0: the scenario's (Long et al. 2023: 1.0)
    participation: float = 0.0

    def validate(self, where: str) -> None:
        super().validate(where)
        if not 0 <= self.penalty <= MAX_PENALTY / 2:  # it travels doubled (coef/2·||·||² = λ·||·||²)
            raise ConfigError(f"{where}penalty must be in [0, {MAX_PENALTY / 2:g}] (got {self.penalty})")
        if not 0 <= self.participation <= 1:
            raise ConfigError(f"{where}participation must be in [0, 1] (0: the scenario's; got {self.participation})")


class FeSEMServer(ServerMethod):
    """K centers, E-step by parameter distance, M-step mean, distance-regularised local update."""

    name = "fesem"
    options_type = FeSEMOptions
    options: FeSEMOptions

    def __init__(self, ctx: Any, options: FeSEMOptions) -> None:
        super().__init__(ctx, options)
        self.local: dict[str, dict[str, torch.Tensor]] = {}  # W_i, the latest each node sent
        self.flat: dict[str, torch.Tensor] = {}  # the same, each as one vector

    @property
    def k(self) -> int:
        return int(self.options.k or self.ctx.clusters_hint)

    def admit(self, node: str) -> None:
        return None  # placed by the initial clustering, or (later) by its data, then by the E-step

    async def before_round(self, rnd: int, live: list[str]) -> None:
        if self.models or not live:
            return
        # Initialisation: every live node's first local model, then k-means with 20 restarts.
        replies = await self.ctx.ask(live, {n: Task("train", [self.ctx.initial]) for n in live})
        ups = {n: u for n, u in replies.items() if isinstance(u, Update) and u.state is not None}
        if len(ups) < self.k:
            raise RuntimeError(f"fesem: {len(ups)} nodes answered the initial round, fewer than K = {self.k}")
        self._store(ups)
        self.groups = kmeans_groups(self.flat, self.k, self.ctx.seed)
        self._m_step()
        log.info("fesem: initial centers from %d local models, sizes %s", len(self.flat),
                 np.bincount(list(self.groups.values()), minlength=self.k).tolist())

    def _store(self, updates: dict[str, Update]) -> None:
        """Keep each node's new W_i, and its parameters as one vector for the distances."""
        for n, u in updates.items():
            if u.state is not None:
                self.local[n], self.flat[n] = u.state, flatten(u.state)

    def participants(self, rnd: int, live: list[str]) -> list[str]:
        if not self.options.participation:
            return super().participants(rnd, live)
        return [n for n in live if participates(self.ctx.seed, n, rnd, self.options.participation)]

    def train_task(self, rnd: int, node: str) -> Task:
        task = super().train_task(rnd, node)
        # coef/2·||·||² = λ·||W_i − W̃_k||²
        task.instructions = replace(task.instructions, penalty=2.0 * self.options.penalty)
        return task

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        self._store(updates)
        self.groups.update(nearest_groups(self.flat, {g: flatten(m) for g, m in self.models.items()}))  # Eq. 8
        self._m_step()

    def _m_step(self) -> None:
        """Eq. 9: each center is the mean of its members' local models (a center nobody chose stays)."""
        for g in range(self.k):
            members = [n for n, gn in self.groups.items() if gn == g and n in self.local]
            if members:
                self.models[g] = weighted_average([self.local[m] for m in members], [1.0] * len(members))

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return data, {**models, **keyed("local", self.local)}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.local = unkeyed("local", models)
        self.flat = {n: flatten(s) for n, s in self.local.items()}
