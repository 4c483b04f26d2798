"""FedFomo (Zhang et al., ICLR 2021), a baseline of pFedLIA (Rokvic et al. 2025): each node personalises by
weighing the models it downloads by how much they help it.

A participant receives the latest models of M other nodes (``[methods.fedfomo] m``), computes for each
w_j = max(0, (L(θ_i) − L(θ_j)) / ||θ_j − θ_i||) with L its validation loss, normalises the weights,
moves its own model θ_i ← θ_i + Σ_j w_j (θ_j − θ_i), trains it locally and sends it back with the
weights. The coordinator keeps every node's latest model and an affinity matrix (the sum of the weights
node i gave node j) and sends node i the M nodes it has found most useful.

Choices: exploration is ε-greedy (ε = ``[methods.fedfomo] epsilon``, 0.3 as in the FedFomo paper's setup,
no decay), each of the M slots independently picks a random other node with probability ε; the draw
is seeded by seed, round and node so every run is reproducible. A node that has never sent a model is
not offered to anyone. Each node is evaluated with its own model.
"""

from __future__ import annotations

import hashlib
import logging
import random
from dataclasses import dataclass
from typing import Any

import torch

from p2pfed.config import ConfigError
from p2pfed.learn.train import state_of
from p2pfed.methods.central import ClientMethod, ServerMethod, Task, Update, flatten, keyed, unkeyed
from p2pfed.methods.options import MethodOptions

log = logging.getLogger(__name__)


class FedFomoClient(ClientMethod):
    """Weigh the downloaded models against the node's own, move toward the helpful ones, train."""

    async def train(self, task: Task) -> tuple[Update, int]:
        own = self.node.own
        mine = state_of(own)
        weights = torch.zeros(len(task.candidates))
        if task.candidates:
            base = await self.node.val_loss(own)
            me = flatten(mine)
            for j, theirs in enumerate(task.candidates):
                gain = base - await self.node.val_loss(self.node.new_model(theirs))
                distance = float((flatten(theirs) - me).norm())
                weights[j] = max(0.0, gain) / max(distance, 1e-12)
            if float(weights.sum()) > 0:
                weights = weights / weights.sum()
                moved = {k: v.float().clone() for k, v in mine.items()}
                for j, theirs in enumerate(task.candidates):
                    if weights[j] > 0:
                        for k in moved:
                            if moved[k].is_floating_point():
                                moved[k] += float(weights[j]) * (theirs[k].float() - mine[k].float())
                own.load_state_dict({k: v.to(mine[k].dtype) for k, v in moved.items()})
        loss = await self.node.fit(own)
        return Update(state_of(own), train_loss=loss, aux={"weights": weights}), 0

    def given_back(self, task: Task, choice: int, before: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return [before]  # its update is its own model; the task's models are its peers'


@dataclass(frozen=True)
class FedFomoOptions(MethodOptions):
    """FedFomo's options, the scenario's [methods.fedfomo] table."""

    m: int = 5  # models each node downloads per round
    epsilon: float = 0.3  # chance that a download slot picks a random node

    def validate(self, where: str) -> None:
        if self.m < 1:
            raise ConfigError(f"{where}m must be >= 1 (got {self.m})")
        if not 0 <= self.epsilon <= 1:
            raise ConfigError(f"{where}epsilon must be in [0, 1] (got {self.epsilon})")


class FedFomoServer(ServerMethod):
    """Latest model per node, an affinity matrix, and the top-M (ε-greedy) downloads for each node."""

    name = "fedfomo"
    options_type = FedFomoOptions
    options: FedFomoOptions
    client = FedFomoClient

    def __init__(self, ctx: Any, options: Any) -> None:
        super().__init__(ctx, options)
        self.latest: dict[str, dict[str, torch.Tensor]] = {}
        self.affinity: dict[str, dict[str, float]] = {}
        self.sent: dict[str, list[str]] = {}

    def admit(self, node: str) -> None:
        self.groups[node] = -1  # no groups: every node personalises its own model

    def downloads(self, rnd: int, node: str) -> list[str]:
        """The M nodes whose models node gets this round."""
        others = sorted(n for n in self.latest if n != node)
        row = self.affinity.get(node, {})
        ranked = sorted(others, key=lambda n: (-row.get(n, 0.0), n))
        seed = int.from_bytes(hashlib.blake2b(f"{self.ctx.seed}/{rnd}/{node}".encode(), digest_size=8).digest(), "big")
        rng = random.Random(seed)
        chosen: list[str] = []
        for _ in range(min(self.options.m, len(others))):
            rest = [n for n in ranked if n not in chosen]
            chosen.append(rng.choice(rest) if rng.random() < self.options.epsilon else rest[0])
        return chosen

    def train_task(self, rnd: int, node: str) -> Task:
        names = self.downloads(rnd, node)
        self.sent[node] = names
        return Task("train", [self.latest[n] for n in names], names=names)

    def place(self, node: str, group: int) -> None:
        return None

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        for node, up in updates.items():
            if up.state is not None:
                self.latest[node] = up.state
            weights = up.aux.get("weights")
            names = self.sent.pop(node, [])
            if weights is None or weights.shape != (len(names),) or bool((weights < 0).any()):
                if names:
                    log.warning("fedfomo: %s sent weights that do not match its %d downloads", node, len(names))
                continue
            row = self.affinity.setdefault(node, {})
            for name, w in zip(names, weights.tolist(), strict=True):
                row[name] = row.get(name, 0.0) + w

    def eval_task(self, node: str) -> Task:
        return Task("eval")  # the node's own model

    def clusters(self) -> dict[str, int]:
        return {}

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return {**data, "affinity": self.affinity}, {**models, **keyed("latest", self.latest)}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.affinity = data.get("affinity", {})
        self.latest = unkeyed("latest", models)
