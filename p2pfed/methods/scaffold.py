"""SCAFFOLD (Karimireddy et al., ICML 2020), a baseline of FedFM (Ye et al. 2023): FedAvg whose local steps are
corrected by control variates, estimates of the gradient of the global objective (c) and of a node's own
(c_i), so that nodes with different data drift less apart.

- The coordinator keeps the global model w and c, and sends both with every train task; Δc_i comes back
  with y_i: twice FedAvg's traffic both ways, the cost the FedFM paper's Tables III and V count.
- A participant trains w for K local steps with the corrected gradient g − c_i + c (the scenario's epochs of
  mini-batches and lr; the paper's Algorithm 1), to y_i, then updates its control variate by the paper's
  option II: c_i⁺ = c_i − c + (w − y_i)/(K·η). It sends y_i and Δc_i = c_i⁺ − c_i.
- The coordinator takes Δy_i = y_i − w against the model it sent this round, and steps
  w ← w + η_g·mean(Δy_i), c ← c + (|S|/N)·mean(Δc_i) (η_g = ``[methods.scaffold] server_lr``, default 1;
  S the updates that came back, N every node the coordinator has placed).
Every node is evaluated with the global model.

Where c_i lives: on the node, in its method's node side (ScaffoldClient.control), saved in the node's own
checkpoint after every train task through the node-side state hook (ClientMethod.state/restore), as
pFedLIA's peer choices live in a decentralized node's checkpoint; a restarted node trains on with its c_i.

Choices where the paper is silent:
- The correction enters as the loss term Σ⟨p, c − c_i⟩, whose gradient is c − c_i: it goes through the same
  optimiser as the data gradient (with the scenario's momentum, through its momentum too).
- K is counted, not computed: every optimiser step, the last short mini-batch of an epoch included, moves
  the model by η times a corrected gradient, so each one counts. With momentum μ (train.momentum) a
  constant corrected gradient d moves the model by η·d·Σ_{m=1..K}(1 − μ^m)/(1 − μ), so that sum stands for
  K: option II then still recovers d; with μ = 0 it is K, the paper's.
- Control variates cover the trainable parameters only (there are no gradients of buffers); a buffer (a
  BatchNorm's statistics) takes the participants' mean, as in FedAvg, not η_g times a step.
- mean(Δy_i) is weighted by samples, as this project's FedAvg (with η_g = 1 and c = c_i = 0 the round is
  FedAvg's); mean(Δc_i) is the paper's plain mean, which keeps c the mean of all the c_i.
- An update whose Δc_i is malformed is left out whole (its y_i too), so w and c move on the same set S.
  If a node's answer is lost after it saved c_i⁺ (it came after the deadline), c misses that node's
  Δc_i/N: c stays an estimate of the mean of the c_i, which is all the method asks of it.
- A node that joins late starts with c_i = 0, as every node does at the start.

Received control variates are checked against the model's trainable parameters, name, shape, dtype and
finiteness, at both ends; a node refuses a task whose c is malformed, the coordinator leaves such an update out.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from p2pfed.config import ConfigError
from p2pfed.learn.train import state_of, weighted_average
from p2pfed.methods.base import NodeContext
from p2pfed.methods.central import (
    ClientMethod,
    ServerContext,
    ServerMethod,
    Task,
    Update,
    trainable_names,
)
from p2pfed.methods.options import MethodOptions
from p2pfed.wire import WireError, check_tensors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScaffoldOptions(MethodOptions):
    """SCAFFOLD's options, the scenario's [methods.scaffold] table."""

    server_lr: float = 1.0  # η_g, the global step size

    def validate(self, where: str) -> None:
        if not 0 < self.server_lr < math.inf:
            raise ConfigError(f"{where}server_lr must be > 0 (got {self.server_lr})")


def checked_controls(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Control variates received from the network, checked against reference (the trainable parameters): the
    same names, shapes and dtypes, every value finite; WireError if not."""
    check_tensors(tensors, reference)
    for name, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            raise WireError(f"control variate {name!r} is not finite")
    return tensors


def moving_steps(steps: int, momentum: float) -> float:
    """How many lr-sized steps a constant gradient moves the model in `steps` SGD steps with momentum μ
    (PyTorch's form: buffer ← μ·buffer + g): Σ_{m=1..steps} (1 − μ^m)/(1 − μ); steps itself when μ = 0."""
    if momentum == 0:
        return float(steps)
    return sum((1 - momentum ** m) / (1 - momentum) for m in range(1, steps + 1))


class ScaffoldClient(ClientMethod):
    """Train the global model with the corrected gradient; keep c_i; answer with y_i and Δc_i."""

    def __init__(self, node: NodeContext, options: Any = None) -> None:
        super().__init__(node, options)
        self.control: dict[str, torch.Tensor] = {}  # c_i by parameter name (none yet: zeros)

    async def train(self, task: Task) -> tuple[Update, int]:
        if len(task.candidates) != 1:
            raise WireError("scaffold: a node trains the one global model")
        model = self.node.own
        start = task.candidates[0]
        model.load_state_dict(start)
        params = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}
        c = checked_controls(task.aux, params)
        mine = self.control if self.control.keys() == params.keys() else {n: torch.zeros_like(p) for n, p in
                                                                         params.items()}
        device = self.node.device
        correction = {n: (c[n] - mine[n]).to(device) for n in params}
        steps = 0

        def corrected(m: nn.Module) -> torch.Tensor:  # its gradient is c − c_i; called once per optimiser step
            nonlocal steps
            steps += 1
            return sum(((p * correction[n]).sum() for n, p in m.named_parameters() if n in correction),
                       torch.zeros((), device=device))

        loss = await self.node.fit(model, penalty=corrected)
        trained = state_of(model)
        delta = {n: torch.zeros_like(p) for n, p in params.items()}
        if steps:
            scale = moving_steps(steps, float(self.node.cfg.momentum)) * float(self.node.cfg.lr)
            updated = {n: mine[n] - c[n] + (start[n].float() - trained[n].float()) / scale for n in params}  # option II
            if all(bool(torch.isfinite(t).all()) for t in updated.values()):
                delta = {n: updated[n] - mine[n] for n in params}
                self.control = updated
            else:  # a diverged local run: its model is refused on the wire; c_i must not keep the NaN
                log.warning("%s: scaffold: c_i+ is not finite; c_i kept", self.node.name)
        return Update(trained, train_loss=loss, aux=delta), 0

    def state(self) -> dict[str, torch.Tensor]:
        return dict(self.control)

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        self.control = {n: t.float() for n, t in state.items()}


class ScaffoldServer(ServerMethod):
    """One global model (group 0) and the global control variate c."""

    name = "scaffold"
    options_type = ScaffoldOptions
    options: ScaffoldOptions
    client = ScaffoldClient

    def __init__(self, ctx: ServerContext, options: Any) -> None:
        super().__init__(ctx, options)
        self.trainable = trainable_names(ctx)
        self.control = {k: torch.zeros_like(ctx.initial[k], dtype=torch.float32) for k in self.trainable}

    def train_task(self, rnd: int, node: str) -> Task:
        task = super().train_task(rnd, node)
        task.aux = dict(self.control)
        return task

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        taken: list[tuple[dict[str, torch.Tensor], float, dict[str, torch.Tensor]]] = []  # (y_i, samples, Δc_i)
        for node, up in updates.items():
            try:
                if up.state is None:
                    raise WireError("no model")
                taken.append((up.state, float(up.samples), checked_controls(up.aux, self.control)))
            except WireError as exc:
                log.warning("scaffold: round %d: %s's update left out: %s", rnd, node, exc)
        if not taken or 0 not in self.models:
            return
        w = self.models[0]
        mean = weighted_average([y for y, _, _ in taken], [n for _, n, _ in taken])
        stepped = dict(mean)  # buffers: the participants' mean
        for k in self.trainable:  # w ← w + η_g·mean(y_i − w)
            stepped[k] = (w[k].float() + self.options.server_lr * (mean[k].float() - w[k].float())).to(w[k].dtype)
        self.models[0] = stepped
        share = len(taken) / max(len(self.groups), len(taken))  # |S|/N
        for k in self.trainable:  # c ← c + (|S|/N)·mean(Δc_i)
            self.control[k] = self.control[k] + share * torch.stack([dc[k] for _, _, dc in taken]).mean(0)

    def served_model(self) -> dict[str, torch.Tensor] | None:
        return self.models.get(0)

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        return data, {**models, "control": self.control}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.control = {k: v.float() for k, v in models.get("control", self.control).items()}
