"""FedAvgM (Hsu, Qi and Brown, 2019, "Measuring the effects of non-identical data distribution for federated
visual classification"), a baseline of FedFM (Ye et al. 2023): FedAvg whose server takes a momentum step. With
w the global model and w̄ the sample-weighted mean of the round's updates, the server treats Δ = w − w̄ as a
gradient: v ← β·v + Δ, w ← w − η_s·v (β = ``momentum``, η_s = ``server_lr``; β = 0 with η_s = 1 is FedAvg).
Nodes train as in FedAvg (the base node side). Options, ``[methods.fedavgm]``: ``momentum`` (default 0.9) and
``server_lr`` (default 1.0: with β = 0.9 the steps grow towards 10 times FedAvg's, the effective rate
η_s/(1 − β) that Hsu et al. discuss).

Choices where the paper is silent: the momentum step moves the model's trainable parameters only; buffers
(a BatchNorm's running statistics and counter) take the participants' mean as in FedAvg, since a statistic
pushed past the mean by momentum is no statistic (a running variance could turn negative). A round whose
updates all failed leaves the model and the velocity as they were (the paper's rounds always have updates).
The velocity is kept in the coordinator's checkpoint, so a restarted coordinator resumes the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from p2pfed.config import ConfigError
from p2pfed.learn.train import weighted_average
from p2pfed.methods.baselines import FedAvgServer
from p2pfed.methods.central import ServerContext, Update, trainable_names
from p2pfed.methods.options import MethodOptions


@dataclass(frozen=True)
class FedAvgMOptions(MethodOptions):
    """FedAvgM's options, the scenario's [methods.fedavgm] table."""

    momentum: float = 0.9  # β of the server's velocity
    server_lr: float = 1.0  # η_s of the server's step

    def validate(self, where: str) -> None:
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"{where}momentum must be in [0, 1) (got {self.momentum})")
        if not 0 < self.server_lr < float("inf"):
            raise ConfigError(f"{where}server_lr must be > 0 (got {self.server_lr})")


class FedAvgMServer(FedAvgServer):
    """One global model (group 0) moved by server momentum on the participants' mean update."""

    name = "fedavgm"
    options_type = FedAvgMOptions
    options: FedAvgMOptions

    def __init__(self, ctx: ServerContext, options: Any) -> None:
        super().__init__(ctx, options)
        self.trainable = trainable_names(ctx)
        self.velocity = {k: torch.zeros_like(ctx.initial[k], dtype=torch.float32) for k in self.trainable}

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        answered = [up for up in updates.values() if up.state is not None]
        if not answered or 0 not in self.models:
            return
        w = self.models[0]
        mean = weighted_average([up.state for up in answered if up.state is not None],
                                [float(up.samples) for up in answered])
        stepped = dict(mean)  # buffers: the participants' mean, as FedAvg
        beta, lr = self.options.momentum, self.options.server_lr
        for k in self.trainable:
            self.velocity[k] = beta * self.velocity[k] + (w[k].float() - mean[k].float())  # v ← βv + Δ
            stepped[k] = (w[k].float() - lr * self.velocity[k]).to(w[k].dtype)  # w ← w − η_s·v
        self.models[0] = stepped

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return data, {**models, "velocity": self.velocity}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.velocity = {k: v.float() for k, v in models.get("velocity", self.velocity).items()}
