"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020), the "PerFedAvg" baseline of FedDSMIC
(Li et al. 2022): "a personalized method that finds one initial shared model for all clients". One global
model, trained so that one gradient step on a node's own data makes it good for that node (MAML's
objective, Eq. 8 of Li et al. 2022 with a single center); each node's personalised model is that step.

- A participant starts from the global model and runs first-order MAML (Per-FedAvg (FO)): per mini-batch
  D, ŵ = w − α∇l(w; D), then w ← w − β∇l(ŵ; D') with D' an independent mini-batch (the next of the
  epoch), α = ``inner_lr``, β = the scenario's lr. The global model is the sample-weighted mean of the
  participants' models, as in FedAvg.
- A node is evaluated with the global model after ``personal_steps`` gradient steps (lr α) on mini-batches
  of its own training data (Per-FedAvg's evaluation: one step).

Options, ``[methods.perfedavg]``: ``inner_lr`` (α, default 0.01: Li et al. 2022 train every method with lr
0.01 and give Per-FedAvg no other) and ``personal_steps`` (default 1). Local work is the scenario's, as
every method's: its epochs, or τ steps (``train.steps``; their τ = 20), with the scenario's momentum on the
outer step (their 0.9 "for all algorithms").
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pfed.config import ConfigError
from p2pfed.learn.train import Evaluation, maml_first_order, personalise, state_of
from p2pfed.methods.central import ClientMethod, ServerMethod, Task, Update
from p2pfed.methods.options import MethodOptions
from p2pfed.wire import WireError


@dataclass(frozen=True)
class PerFedAvgOptions(MethodOptions):
    """Per-FedAvg's options, the scenario's [methods.perfedavg] table."""

    inner_lr: float = 0.01  # α: the inner step of training and the personalisation steps
    personal_steps: int = 1  # gradient steps from the global model to a node's personalised model

    def validate(self, where: str) -> None:
        if not self.inner_lr > 0:
            raise ConfigError(f"{where}inner_lr must be > 0 (got {self.inner_lr})")
        if not 0 <= self.personal_steps <= 100:
            raise ConfigError(f"{where}personal_steps must be in [0, 100] (got {self.personal_steps})")


class PerFedAvgClient(ClientMethod):
    """First-order MAML from the global model; evaluation after the personalisation steps."""

    options: PerFedAvgOptions

    async def train(self, task: Task) -> tuple[Update, int]:
        if len(task.candidates) != 1:
            raise WireError("perfedavg: a node trains the one global model")
        model, cfg = self.node.new_model(task.candidates[0]), self.node.cfg
        loss = await self.node.run_on_train(lambda x, y: maml_first_order(
            model, x, y, epochs=cfg.epochs, batch_size=cfg.batch_size, inner_lr=self.options.inner_lr,
            outer_lr=cfg.lr, seed=self.node.round_seed, device=self.node.device, task=self.node.task,
            independent=True, steps=cfg.steps, momentum=cfg.momentum))
        return Update(state_of(model), train_loss=loss), 0

    async def evaluate(self, task: Task) -> tuple[Evaluation, int]:
        if len(task.candidates) != 1:
            raise WireError("perfedavg: a node is evaluated from the one global model")
        model, cfg = self.node.new_model(task.candidates[0]), self.node.cfg
        await self.node.run_on_train(lambda x, y: personalise(
            model, x, y, steps=self.options.personal_steps, lr=self.options.inner_lr, batch_size=cfg.batch_size,
            seed=self.node.round_seed, device=self.node.device, task=self.node.task))
        return await self.node.test(model), 0


class PerFedAvgServer(ServerMethod):
    """FedAvg of the participants' MAML updates: one global model (group 0), personalised at each node."""

    name = "perfedavg"
    options_type = PerFedAvgOptions
    client = PerFedAvgClient
