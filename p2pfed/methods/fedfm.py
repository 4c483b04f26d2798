"""FedFM (Ye et al. 2023): FedAvg whose local training also matches each sample's feature (the L2-normalised
input of the model's head) to its class's global anchor, so that every node builds the same feature space.

A round from ``start`` (T_s; FedAvg before it, as the paper runs) has two exchanges (Fig. 5):
1. anchors: the round's participants get the global model and compute their local anchors, the mean
   normalised feature of each class (Eq. 8); the coordinator's global anchor of a class is their
   count-weighted mean (Eq. 9), or the plain mean over the nodes that have the class when
   ``uniform`` keeps class counts private (the paper's Table VI);
2. models: participants, which kept the global model from step 1 (it is not sent twice), train with
   task loss + λ·matching loss (Eq. 10, λ = ``lam``) and send
   their models; the global model is their FedAvg.
The matching loss is ``fedfm`` contrastive guiding, CE(softmax(<a_n, f(x)>/α), y) with temperature α
(``temperature``), or ``fedfm-l2``'s squared distance ||f(x) − a_y||².

``fedfm-lite`` (Section VI) has one exchange per round: participants train with the anchors they were
sent, then compute their anchors on the trained model and send them with the model; the model itself
travels only every ``every`` rounds (a), so in the other rounds a participant trains the model it
kept and sends anchors alone (the communication FedFM-Lite saves shows in bytes_sent). A node keeps
training its own model across the rounds without a model exchange and sends that model at the model
round; it gets the global model back once, at its first round after the global model changed, and testing
the global model (evaluation rounds) leaves the node's own model as it was. The paper
says models travel "every a rounds" and no more; sending the global model down only when it is new is our
reading, and it keeps what a node learned between exchanges (reloading the global model at every model
round threw those rounds away).

Choices where the paper is silent: anchors are means of normalised features (the paper normalises the
features before matching); α defaults to 0.1 (our choice; normalised features make inner products lie in
[−1, 1]); λ defaults to 10 and T_s to 20, inside the ranges of the paper's Fig. 8c. With partial
participation the anchors of a round come from that round's participants. FedFM trains one global model
(generalised FL): every node is evaluated with it.

Options, ``[methods.fedfm]`` and ``[methods.fedfm-l2]``: ``lam``, ``start``, ``temperature``, ``uniform``;
``[methods.fedfm-lite]`` adds ``every``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from p2pfed.config import ConfigError
from p2pfed.learn.models import features_and_logits
from p2pfed.learn.train import Evaluation, distance_penalty, state_of, weighted_average
from p2pfed.methods.baselines import FedAvgServer
from p2pfed.methods.central import ClientMethod, Instructions, Task, Update
from p2pfed.methods.class_tables import class_mean, class_prototypes, global_table, head_classes, local_table
from p2pfed.methods.options import MethodOptions
from p2pfed.wire import WireError
from p2pfed.wire.messages import OneOf

log = logging.getLogger(__name__)


def matching_loss(feats: torch.Tensor, y: torch.Tensor, anchors: torch.Tensor, have: torch.Tensor, kind: str,
                  temperature: float) -> torch.Tensor:
    """FedFM's feature matching term for a batch: contrastive guiding ("cg") or squared distance ("l2")
    between the normalised feature and the normalised anchors, over the samples whose class has a global
    anchor. The paper normalises features; anchors (means of normalised features, so shorter than 1) are
    normalised too, as the authors' code does, so CG's logits are cosine similarities / α. A sample whose
    feature is all zero (every ReLU off) has no direction to match and is left out: normalising it would
    divide by ~0, and its gradient turned a node's model into NaN in a Fashion-MNIST run."""
    norms = feats.norm(dim=1)
    known = have[y] & (norms > 1e-6)
    if not bool(known.any()):
        return feats.sum() * 0.0
    f = feats[known] / norms[known, None]
    anchors = F.normalize(anchors, dim=1)
    if kind == "l2":
        return ((f - anchors[y[known]]) ** 2).sum(1).mean()
    logits = f @ anchors.T / temperature
    logits = logits.masked_fill(~have[None, :], float("-inf"))  # only classes with an anchor compete
    return F.cross_entropy(logits, y[known])


@dataclass(frozen=True)
class FMInstructions(Instructions):
    """FedFM's tasks: whether the matching loss is on, which one, and the Lite form's steps. (The anchor tables
    have a row per class of the node's own model: the coordinator need not say how many.)"""

    matching: bool = False  # train with the feature matching loss (rounds from T_s on)
    loss: str = "cg"  # cg (contrastive guiding) | l2
    lite: bool = False  # FedFM-Lite: anchors of the trained model in the same answer
    send_model: bool = True  # the trained model travels back (FedFM-Lite: every a rounds)
    keep_own: bool = False  # eval: test the global model and keep the model the node is training

    SPEC: ClassVar[dict[str, Any]] = {**Instructions.SPEC, "matching": bool, "loss": OneOf(("cg", "l2")), "lite": bool,
                                      "send_model": bool, "keep_own": bool}


class FedFMClient(ClientMethod):
    """Local anchors (compute tasks) and training with the matching loss (λ and α: the options'); a ``penalty``
    adds coef/2·||w − w_global||², as the base node side does (FedProx + FM)."""

    options: FedFMOptions
    instructions = FMInstructions

    def _how(self, task: Task) -> FMInstructions:
        return FMInstructions.of(task.instructions)

    async def compute(self, task: Task) -> Update:
        if len(task.candidates) != 1:
            raise WireError("fedfm: anchors are computed on one model")
        model = self.node.own  # the node keeps the global model: the round's train task then sends none
        model.load_state_dict(task.candidates[0])
        anchors, counts = await self.node.run_on_train(
            lambda x, y: class_prototypes(model, x, y, head_classes(model.state_dict()), normalize=True))
        return Update(None, aux={"anchors": anchors, "counts": counts})

    async def train(self, task: Task) -> tuple[Update, int]:
        how = self._how(task)
        if not how.matching:
            return await super().train(task)
        model = self.node.own
        if task.candidates:
            model.load_state_dict(task.candidates[0])
        anchors, have = global_table(task.aux, "anchors") or (None, None)
        lam, kind, temperature = self.options.lam, how.loss, self.options.temperature

        def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            feats, logits = features_and_logits(m, x)
            loss = self.node.task.loss(logits, y)
            if anchors is None or have is None or not lam:
                return loss
            return loss + lam * matching_loss(feats, y, anchors.to(feats.device), have.to(y.device), kind,
                                              temperature)

        coef = how.penalty  # to the global model, sent now or kept from the anchor step
        penalty = distance_penalty(state_of(model), coef, self.node.device) if coef else None
        loss = await self.node.fit(model, penalty, loss_fn=loss_fn)
        aux: dict[str, torch.Tensor] = {}
        if how.lite:  # FedFM-Lite: anchors of the trained model, in the same exchange
            mine, counts = await self.node.run_on_train(
                lambda x, y: class_prototypes(model, x, y, head_classes(model.state_dict()), normalize=True))
            aux = {"anchors": mine, "counts": counts}
        state = state_of(model) if how.send_model else None
        return Update(state, train_loss=loss, aux=aux), 0

    async def evaluate(self, task: Task) -> tuple[Evaluation, int]:
        if not self._how(task).keep_own or len(task.candidates) != 1:
            return await super().evaluate(task)
        # FedFM-Lite: the global model is tested, and the model the node is training stays its own
        return await self.node.test(self.node.new_model(task.candidates[0])), 0


@dataclass(frozen=True)
class FedFMOptions(MethodOptions):
    """FedFM's options, the scenario's [methods.fedfm] (or [methods.fedfm-l2]) table."""

    lam: float = 10.0  # λ on the feature matching loss (the paper's Fig. 8c: 10–100)
    start: int = 20  # T_s: FedAvg before this round (the paper's 20)
    temperature: float = 0.1  # α of contrastive guiding
    uniform: bool = False  # average anchors uniformly (class counts stay private)

    def validate(self, where: str) -> None:
        if not self.lam >= 0 or self.start < 0 or not self.temperature > 0:
            raise ConfigError(f"{where}lam and start must be >= 0 and temperature > 0 (got {self.lam}, {self.start}, "
                              f"{self.temperature})")


@dataclass(frozen=True)
class FedFMLiteOptions(FedFMOptions):
    """FedFM-Lite's options, the scenario's [methods.fedfm-lite] table: FedFM's and how often models travel."""

    every: int = 5  # a: models travel every a rounds (anchors every round)

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.every < 1:
            raise ConfigError(f"{where}every must be >= 1 (got {self.every})")


class FedFMServer(FedAvgServer):
    """FedAvg plus global anchors; the matching loss in local training from round T_s."""

    name = "fedfm"
    tasks = frozenset({"classification"})  # anchors are per class
    options_type: type[FedFMOptions] = FedFMOptions
    options: FedFMOptions
    client = FedFMClient
    loss = "cg"
    lite = False

    def __init__(self, ctx: Any, options: Any) -> None:
        super().__init__(ctx, options)
        self.global_model: dict[str, torch.Tensor] = dict(ctx.initial)
        self.num_classes = head_classes(ctx.initial)
        self.anchors: torch.Tensor | None = None
        self.have: torch.Tensor | None = None
        self.holding: set[str] = set()  # nodes that got the global model in this round's anchor exchange

    def admit(self, node: str) -> None:
        self.groups[node] = -1  # one global model

    def matching(self, rnd: int) -> bool:
        return rnd >= self.options.start

    async def before_round(self, rnd: int, live: list[str]) -> None:
        await super().before_round(rnd, live)
        if self.lite or not self.matching(rnd):
            return
        nodes = self.participants(rnd, live)  # step 1: this round's participants compute local anchors
        task = Task("compute", [self.global_model], FMInstructions())
        replies = await self.ctx.ask(nodes, {n: task for n in nodes})
        self.aggregate_anchors({n: u for n, u in replies.items() if isinstance(u, Update)})
        self.holding = {n for n, u in replies.items() if isinstance(u, Update)}  # they hold the global model

    def aggregate_anchors(self, updates: dict[str, Update]) -> None:
        """Eq. 9: count-weighted (or, with uniform, plain) mean of local anchors per class."""
        rows: list[tuple[torch.Tensor, torch.Tensor]] = []
        for node, up in updates.items():
            row = local_table(up.aux, "anchors", self.num_classes, rows[0][0] if rows else None)
            if row is None:
                log.warning("fedfm: %s sent malformed anchors; left out", node)
                continue
            rows.append(row)
        if rows:
            self.anchors, self.have = class_mean(rows, uniform=self.options.uniform)

    def _how(self) -> FMInstructions:
        return FMInstructions(matching=True, loss=self.loss, lite=self.lite)

    def _aux(self) -> dict[str, torch.Tensor]:
        if self.anchors is None or self.have is None:
            return {}
        return {"anchors": self.anchors, "have": self.have.to(torch.uint8)}

    def train_task(self, rnd: int, node: str) -> Task:
        if not self.matching(rnd):
            return Task("train", [self.global_model])
        # A node that computed its anchors on the global model this round still holds it: no second copy.
        models = [] if node in self.holding else [self.global_model]
        return Task("train", models, self._how(), aux=self._aux())

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        models = {n: u for n, u in updates.items() if u.state is not None}
        if models:
            self.global_model = weighted_average([u.state for u in models.values() if u.state is not None],
                                                 [float(u.samples) for u in models.values()])
        if self.lite and self.matching(rnd):
            self.aggregate_anchors(updates)

    def eval_task(self, node: str) -> Task:
        return Task("eval", [self.global_model])

    def served_model(self) -> dict[str, torch.Tensor] | None:
        return self.global_model

    def clusters(self) -> dict[str, int]:
        return {}

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        extra = {"global": self.global_model}
        if self.anchors is not None and self.have is not None:
            extra["anchors"] = {"anchors": self.anchors, "have": self.have}
        return data, {**models, **extra}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.global_model = models.get("global", self.global_model)
        if "anchors" in models:
            self.anchors, self.have = models["anchors"]["anchors"], models["anchors"]["have"]


class FedFML2Server(FedFMServer):
    """FedFM with the plain ℓ2 matching loss (the paper's Fig. 8b ablation)."""

    name = "fedfm-l2"
    loss = "l2"


class FedFMLiteServer(FedFMServer):
    """FedFM-Lite: one exchange per round, anchors every round, models up every `every` rounds, and the global
    model down to a node once after each change (see the module's docstring)."""

    name = "fedfm-lite"
    options_type = FedFMLiteOptions
    options: FedFMLiteOptions
    lite = True

    def __init__(self, ctx: Any, options: Any) -> None:
        super().__init__(ctx, options)
        self.version = 0  # how often the global model has changed
        self.held: dict[str, int] = {}  # the version of the global model each node has trained from
        self.sending: dict[str, int] = {}  # the version sent in a node's task this round (held once it answers)

    def train_task(self, rnd: int, node: str) -> Task:
        self.sending[node] = self.version
        if not self.matching(rnd):
            return Task("train", [self.global_model])
        model_round = (rnd - self.options.start) % self.options.every == 0
        how = replace(self._how(), send_model=model_round)
        fresh = self.held.get(node, -1) < self.version  # the node has not trained from this global model yet
        return Task("train", [self.global_model] if fresh else [], how, aux=self._aux())

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        for node in updates:  # its answer shows the task, and the model in it, arrived
            if node in self.sending:
                self.held[node] = self.sending[node]
        self.sending = {}
        before = self.global_model
        super().aggregate(rnd, updates)
        if self.global_model is not before:
            self.version += 1

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return {**data, "version": self.version, "held": self.held}, models

    def eval_task(self, node: str) -> Task:
        return Task("eval", [self.global_model], FMInstructions(keep_own=True))

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.version = int(data.get("version", 0))  # checkpoints from before it was kept: every node refreshes
        self.held = {k: int(v) for k, v in data.get("held", {}).items()}
