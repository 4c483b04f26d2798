"""FedProx (Li et al., 2020): FedAvg whose local objective adds the proximal term μ/2·||w − w_global||²,
which keeps heterogeneous clients near the global model. Server side it is FedAvg. Options:
``[methods.fedprox]`` ``mu`` (μ, default 0.01)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from p2pfed.config import ConfigError
from p2pfed.methods.baselines import FedAvgServer
from p2pfed.methods.central import MAX_PENALTY, Task
from p2pfed.methods.options import MethodOptions


@dataclass(frozen=True)
class FedProxOptions(MethodOptions):
    """FedProx's options, the scenario's [methods.fedprox] table."""

    mu: float = 0.01  # μ of the proximal term

    def validate(self, where: str) -> None:
        if not 0 <= self.mu <= MAX_PENALTY:
            raise ConfigError(f"{where}mu must be in [0, {MAX_PENALTY:g}] (got {self.mu})")


class FedProxServer(FedAvgServer):
    """FedAvg with μ sent with every train task (the base node side adds the penalty it names)."""

    name = "fedprox"
    options_type = FedProxOptions
    options: FedProxOptions

    def train_task(self, rnd: int, node: str) -> Task:
        task = super().train_task(rnd, node)
        task.instructions = replace(task.instructions, penalty=self.options.mu)
        return task
