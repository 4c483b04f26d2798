"""FedProto (Tan et al., AAAI 2022), a baseline of pFedLIA (Rokvic et al. 2025): nodes exchange per-class
prototypes (the mean feature embedding of each class, taken at the input of the model's head), never models.

Each round a participant trains its own model with the loss CE + λ·||f(x) − P̄_y||² (mean over the
batch, for the classes that have a global prototype; λ is ``[methods.fedproto] lam``), then sends its
prototypes and per-class sample counts. The coordinator's global prototype of a class is the
count-weighted mean of the nodes' prototypes of that class. Each node is evaluated with its own model.

Choice: with partial participation the coordinator keeps each node's latest prototypes and averages over
all of them (the paper's clients all take part each round), so a class seen by nodes that did not train
this round keeps its prototype.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from p2pfed.config import ConfigError
from p2pfed.learn.models import features_and_logits
from p2pfed.methods.central import ClientMethod, ServerMethod, Task, Update, keyed, unkeyed
from p2pfed.methods.class_tables import class_mean, class_prototypes, global_table, head_classes, local_table
from p2pfed.methods.options import MethodOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FedProtoOptions(MethodOptions):
    """FedProto's options, the scenario's [methods.fedproto] table."""

    lam: float = 1.0  # λ on the prototype distance (FL-bench's default)

    def validate(self, where: str) -> None:
        if not self.lam >= 0:
            raise ConfigError(f"{where}lam must be >= 0 (got {self.lam})")


class FedProtoClient(ClientMethod):
    """Train the node's own model with the prototype term; answer with prototypes and class counts."""

    options: FedProtoOptions

    async def train(self, task: Task) -> tuple[Update, int]:
        model = self.node.own
        lam = self.options.lam
        protos, have = global_table(task.aux, "protos") or (None, None)

        def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            feats, logits = features_and_logits(m, x)
            loss = self.node.task.loss(logits, y)
            if protos is None or have is None or not lam:
                return loss
            known = have.to(y.device)[y]
            if known.any():
                target = protos.to(feats.device)[y[known]]
                loss = loss + lam * F.mse_loss(feats[known], target)
            return loss

        loss = await self.node.fit(model, loss_fn=loss_fn)
        num_classes = head_classes(model.state_dict())  # a row per class of its model, as the coordinator's
        mine, counts = await self.node.run_on_train(lambda x, y: class_prototypes(model, x, y, num_classes))
        return Update(None, train_loss=loss, aux={"protos": mine, "counts": counts}), 0


class FedProtoServer(ServerMethod):
    """Global prototypes: the count-weighted mean of the nodes' latest prototypes per class."""

    name = "fedproto"
    tasks = frozenset({"classification"})  # prototypes are per class
    options_type = FedProtoOptions
    client = FedProtoClient

    def __init__(self, ctx: Any, options: Any) -> None:
        super().__init__(ctx, options)
        self.protos: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # node -> (prototypes, counts)
        self.num_classes = head_classes(ctx.initial)

    def admit(self, node: str) -> None:
        self.groups[node] = -1  # no groups: every node keeps its own model

    def train_task(self, rnd: int, node: str) -> Task:
        if not self.protos:
            return Task("train")
        protos, have = self.global_prototypes()
        return Task("train", aux={"protos": protos, "have": have.to(torch.uint8)})

    def global_prototypes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per class, the count-weighted mean of the nodes' prototypes, and whether any node has the class."""
        return class_mean(list(self.protos.values()))

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        for node, up in updates.items():
            like = next(iter(self.protos.values()))[0] if self.protos else None
            row = local_table(up.aux, "protos", self.num_classes, like)
            if row is None:
                log.warning("fedproto: %s sent malformed prototypes; left out", node)
                continue
            self.protos[node] = row

    def eval_task(self, node: str) -> Task:
        return Task("eval")  # the node's own model

    def clusters(self) -> dict[str, int]:
        return {}

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return data, {**models, **keyed("protos", {n: {"protos": p, "counts": c} for n, (p, c) in self.protos.items()})}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.protos = {n: (m["protos"], m["counts"]) for n, m in unkeyed("protos", models).items()}
