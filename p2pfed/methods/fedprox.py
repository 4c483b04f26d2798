"""FedProx (Li et al., 2020): FedAvg whose local objective adds the proximal term μ/2·||w − w_start||², which
keeps heterogeneous nodes near the model they start a round from. One strategy, run either way: ``fedprox``
with a coordinator (w_start: the global model the node is sent) and ``fedprox-p2p`` peer to peer (w_start: the
model the node holds as the round starts, the average it took at the end of the last round, or its own trained
model when nothing arrived then; our choice where the paper, which has a server, is silent: it is the model
the node's group gave it, as the global model is at a server). Options: ``[methods.fedprox]`` and
``[methods.fedprox-p2p]`` ``mu`` (μ, default 0.01)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from p2pfed.config import ConfigError
from p2pfed.methods.base import NodeContext
from p2pfed.methods.central import MAX_PENALTY, ServerMethod, Task
from p2pfed.methods.options import MethodOptions
from p2pfed.methods.strategy import Coordinated, Peered, State, Strategy


@dataclass(frozen=True)
class FedProxOptions(MethodOptions):
    """FedProx's options, the scenario's [methods.fedprox] (or [methods.fedprox-p2p]) table."""

    mu: float = 0.01  # μ of the proximal term

    def validate(self, where: str) -> None:
        if not 0 <= self.mu <= MAX_PENALTY:
            raise ConfigError(f"{where}mu must be in [0, {MAX_PENALTY:g}] (got {self.mu})")


class FedProx(Strategy):
    """FedAvg with the proximal term in local training: one group, the sample-weighted average."""

    name, serves_one_model, options_type = "fedprox", True, FedProxOptions
    options: FedProxOptions

    async def train(self, node: NodeContext, start: State | None) -> tuple[State, float]:
        return await node.train_local(start if start is not None else node.current_state(), self.options.mu)


class FedProxServer(Coordinated):
    strategy = FedProx


class FedProxPeer(Peered):
    strategy = FedProx


class ProxTasks(ServerMethod):
    """A method with FedProx's μ whose node side is its own (FedProx+ and FedProx + FM): every train task carries
    μ as the instructions' penalty, which that node side adds."""

    options: FedProxOptions

    def train_task(self, rnd: int, node: str) -> Task:
        task = super().train_task(rnd, node)
        task.instructions = replace(task.instructions, penalty=self.options.mu)
        return task
