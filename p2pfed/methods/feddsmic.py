"""FedDSMIC (Li et al. 2022): clustering by the similarity of what models predict, and cluster centers learned
as good starting points (first-order MAML), personalised by one gradient step.

- The coordinator holds indicator samples (``indicator_per_class`` per class, drawn from the
  training data with the scenario's seed). It places each node that sent a model in the cluster whose
  center's softmax outputs on them are closest in KL divergence to the node model's (Eq. 6–7).
- A participant starts from its center and runs first-order MAML steps (Algorithm 2, Eq. 15–16):
  per mini-batch, ŵ = w − η∇l(w) (η = ``inner_lr``), then w ← w − ε∇l(ŵ) (ε = the
  scenario's lr), for the scenario's local work (its epochs, or τ steps: ``train.steps``) and with its
  momentum on the outer step (the paper: τ = 20, momentum 0.9 "for all algorithms").
- A center is the sample-weighted mean of its members' new models (Eq. 17).
- A node's personalised model is one gradient step (lr η) from its center on a batch of its own data.

``fedds`` is the clustering-only ablation of the paper's Table 2: the same KL clustering, plain local SGD
and no personalisation step.

Initial centers (``init``): the paper's Algorithm 1 and §4 start from "C randomly initialized center
models" (``init = "random"``: centers from seeds seed+1 .. seed+C, as IFCA's; in its first training round a
node trains from the shared initial model, its w_i^0, and Eq. 6–7 place it against those centers). On our
runs random centers let one cluster take everyone (their outputs on the indicator samples are all near
uniform, so the first placements say little), so the default, ``init = "kmeans"``, is our choice: as
FeSEM's paper does with parameters, in the first round every live node trains from the shared initial model
and k-means (20 restarts) on their softmax outputs on the indicator samples gives the first clusters, whose
centers follow by Eq. 17.

Choices where the paper is silent, and why:
- C is given (``k``, default the true number).
- Indicator samples are drawn from the training split. The paper sets them aside before partitioning:
  ``data.server_per_class`` does that (the indicator samples are then the first ``indicator_per_class`` of
  each class's set-aside samples). Without it (the default, so earlier runs stay as they were) a handful may
  also be in some node's shard (10 per class of tens of thousands).
- A node that joins later (§4.3: "first train on its local dataset for a few epochs and choose the most
  similar center") gets the shared initial model and ``warmup`` local epochs the first time it
  trains; its model places it by Eq. 6–7 and is not averaged into any center.
- With partial participation, Eq. 17 averages the members that trained this round; a center none of
  whose members trained keeps its model.

Options, ``[methods.feddsmic]`` and ``[methods.fedds]``: ``k``, ``indicator_per_class`` (default 10, the
paper's), ``inner_lr`` (default 0.01, the paper's), ``warmup`` (default 5) and ``init`` ("kmeans", ours, the
default; "random", the paper's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch.nn import functional as F

from p2pfed.config import ConfigError
from p2pfed.learn.train import Evaluation, maml_first_order, personalise, state_of, weighted_average
from p2pfed.methods.central import MAX_EPOCHS, ClientMethod, Instructions, ServerMethod, Task, Update, kmeans_groups
from p2pfed.methods.options import ClusteredOptions
from p2pfed.scenario.config import Scenario
from p2pfed.wire.messages import Int

log = logging.getLogger(__name__)


def kl_to_centers(node_probs: torch.Tensor, center_probs: torch.Tensor) -> torch.Tensor:
    """Eq. 6: Σ over indicator samples of KL(p_node || p_center), for every center (probabilities
    [samples, classes] and [centers, samples, classes]; returns [centers])."""
    p = node_probs.clamp_min(1e-12)
    q = center_probs.clamp_min(1e-12)
    return (p * (p.log() - q.log())).sum(dim=(-1, -2))


@dataclass(frozen=True)
class MAMLInstructions(Instructions):
    """FedDSMIC's tasks: train with first-order MAML, and personalisation steps before an evaluation."""

    maml: bool = False
    personalise: int = 0  # eval: SGD steps on the node's training data before testing

    SPEC: ClassVar[dict[str, Any]] = {**Instructions.SPEC, "maml": bool, "personalise": Int(0, 1000)}


class FedDSMICClient(ClientMethod):
    """First-order MAML local steps; evaluation after one personalisation step (η: the options' inner_lr)."""

    options: FedDSMICOptions
    instructions = MAMLInstructions

    def _how(self, task: Task) -> MAMLInstructions:
        return MAMLInstructions.of(task.instructions)

    async def train(self, task: Task) -> tuple[Update, int]:
        if not self._how(task).maml or not task.candidates or len(task.candidates) > 1:
            return await super().train(task)
        model = self.node.new_model(task.candidates[0])
        cfg = self.node.cfg
        loss = await self.node.run_on_train(lambda x, y: maml_first_order(
            model, x, y, epochs=cfg.epochs, batch_size=cfg.batch_size, inner_lr=self.options.inner_lr, outer_lr=cfg.lr,
            seed=self.node.round_seed, device=self.node.device, task=self.node.task, steps=cfg.steps,
            momentum=cfg.momentum))
        return Update(state_of(model), train_loss=loss), 0

    async def evaluate(self, task: Task) -> tuple[Evaluation, int]:
        steps = self._how(task).personalise
        if not steps or len(task.candidates) != 1:
            return await super().evaluate(task)
        model = self.node.new_model(task.candidates[0])
        cfg = self.node.cfg
        await self.node.run_on_train(lambda x, y: personalise(
            model, x, y, steps=steps, lr=self.options.inner_lr, batch_size=cfg.batch_size, seed=self.node.round_seed,
            device=self.node.device, task=self.node.task))
        return await self.node.test(model), 0


@dataclass(frozen=True)
class FedDSMICOptions(ClusteredOptions):
    """FedDSMIC's (and FedDS's) options: C, the indicator samples, η, and a late joiner's first local epochs."""

    indicator_per_class: int = 10  # server-held indicator samples per class (the paper's 10)
    inner_lr: float = 0.01  # η of the inner step and of the personalisation step
    warmup: int = 5  # local epochs of a node that joins after the first clustering (§4.3: "a few")
    init: str = "kmeans"  # first centers: k-means on the first local models (ours), or "random" (the paper's)

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.indicator_per_class < 1 or not self.inner_lr > 0 or not 1 <= self.warmup <= MAX_EPOCHS:
            raise ConfigError(f"{where}indicator_per_class must be >= 1, inner_lr > 0 and warmup in [1, "
                              f"{MAX_EPOCHS}] (got "
                              f"{self.indicator_per_class}, {self.inner_lr}, {self.warmup})")
        if self.init not in ("kmeans", "random"):
            raise ConfigError(f"{where}init must be kmeans or random (got {self.init[:40]!r})")

    def within(self, scenario: Scenario, where: str) -> None:
        super().within(scenario, where)
        held = scenario.data.server_per_class
        if held and self.indicator_per_class > held:
            raise ConfigError(f"{where}indicator_per_class ({self.indicator_per_class}) must not exceed "
                              f"data.server_per_class ({held}): the server holds only those")


@dataclass(frozen=True)
class PaperFedDSMICOptions(FedDSMICOptions):
    """feddsmic-paper's: feddsmic's table but the first centers, random (Algorithm 1) unless told otherwise."""

    init: str = "random"
    base: ClassVar[str] = "feddsmic"
    own: ClassVar[frozenset[str]] = frozenset({"init"})


@dataclass(frozen=True)
class PaperFedDSOptions(PaperFedDSMICOptions):
    """fedds-paper's: fedds's table but the first centers, random unless told otherwise."""

    base: ClassVar[str] = "fedds"


class FedDSMICServer(ServerMethod):
    """KL clustering on indicator samples, MAML centers, one-step personalisation."""

    name = "feddsmic"
    tasks = frozenset({"classification"})  # the server's indicator samples are drawn per class
    options_type = FedDSMICOptions
    options: FedDSMICOptions
    client = FedDSMICClient
    maml = True  # fedds: False

    def __init__(self, ctx: Any, options: FedDSMICOptions) -> None:
        super().__init__(ctx, options)
        self.indicator = ctx.data.samples(options.indicator_per_class)
        self.newcomers: set[str] = set()  # nodes placed by their first local model, not yet averaged in
        if options.init == "random":  # Algorithm 1: C randomly initialised centers
            self.models = {g: ctx.build(ctx.seed + 1 + g) for g in range(self.k)}

    @property
    def k(self) -> int:
        return int(self.options.k or self.ctx.clusters_hint)

    def probs(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """Softmax outputs of a model on the indicator samples (Eq. 5)."""
        with torch.no_grad():
            return F.softmax(self.ctx.module(state)(self.indicator), dim=1)

    def admit(self, node: str) -> None:
        if self.groups:
            self.newcomers.add(node)  # a node that joins after the first clustering (§4.3)

    def knows(self, node: str) -> bool:
        return node in self.groups or node in self.newcomers

    async def before_round(self, rnd: int, live: list[str]) -> None:
        await super().before_round(rnd, live)
        if self.models or not live:
            return
        replies = await self.ctx.ask(live, {n: self._first(n) for n in live})
        ups = {n: u for n, u in replies.items() if isinstance(u, Update) and u.state is not None}
        if len(ups) < self.k:
            raise RuntimeError(f"{self.name}: {len(ups)} nodes answered the first round, fewer than C = {self.k}")
        self.groups = kmeans_groups({n: self.probs(_state(u)).flatten() for n, u in ups.items()}, self.k,
                                    self.ctx.seed)
        self._centers(ups)
        log.info("%s: first clusters from %d nodes' outputs on %d indicator samples: sizes %s", self.name,
                 len(ups), len(self.indicator), np.bincount(list(self.groups.values()), minlength=self.k).tolist())

    def _first(self, node: str) -> Task:
        """A node's first local training, from the shared initial model."""
        return Task("train", [self.ctx.initial], MAMLInstructions(maml=self.maml))

    def train_task(self, rnd: int, node: str) -> Task:
        if node in self.newcomers:
            return Task("train", [self.ctx.initial], MAMLInstructions(epochs=self.options.warmup))
        if self.options.init == "random" and node not in self.groups:  # not yet placed: it trains its w_i^0
            return self._first(node)
        task = super().train_task(rnd, node)
        task.instructions = MAMLInstructions(maml=self.maml)
        return task

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        ups = {n: u for n, u in updates.items() if u.state is not None}
        if not ups:
            return
        groups = sorted(self.models)
        centers = torch.stack([self.probs(self.models[g]) for g in groups])
        for node, up in ups.items():
            assert up.state is not None
            self.groups[node] = groups[int(kl_to_centers(self.probs(up.state), centers).argmin())]  # Eq. 6–7
        trained = {n: u for n, u in ups.items() if n not in self.newcomers}
        self.newcomers -= set(ups)
        self._centers(trained)

    def _centers(self, updates: dict[str, Update]) -> None:
        """Eq. 17: each center is the sample-weighted mean of its members' new models."""
        for g in range(self.k):
            members = [n for n, u in updates.items() if self.groups.get(n) == g and u.state is not None]
            if members:
                self.models[g] = weighted_average([_state(updates[m]) for m in members],
                                                  [float(updates[m].samples) for m in members])

    def eval_task(self, node: str) -> Task:
        task = super().eval_task(node)
        if self.maml and len(task.candidates) == 1:
            task.instructions = MAMLInstructions(personalise=1)
        return task

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return {**data, "newcomers": sorted(self.newcomers)}, models

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.newcomers = set(data.get("newcomers", []))


def _state(update: Update) -> dict[str, torch.Tensor]:
    assert update.state is not None
    return update.state


class FedDSServer(FedDSMICServer):
    """FedDS, the paper's ablation: the KL clustering alone, with plain local SGD and no personalisation."""

    name = "fedds"
    maml = False


class FedDSMICPaperServer(FedDSMICServer):
    """FedDSMIC from random initial centers, as the paper's Algorithm 1: run beside feddsmic, it shows what our
    first clustering (k-means on the first local models) adds."""

    name = "feddsmic-paper"
    options_type = PaperFedDSMICOptions


class FedDSPaperServer(FedDSServer):
    """FedDS from random initial centers (the paper's Algorithm 1 for its ablation too)."""

    name = "fedds-paper"
    options_type = PaperFedDSOptions
