"""A stand-in coordinator for testing server-side methods without sockets: answers come from a function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from p2pfed.learn.tasks import CLASSIFICATION
from p2pfed.learn.train import Evaluation, evaluate, train_epochs
from p2pfed.methods.central import Task
from p2pfed.wire import ModelIn

CPU = torch.device("cpu")


class FakeCoordinator:
    """Implements ServerContext; ask() calls answer(node, task) for each node."""

    def __init__(self, answer: Callable[[str, Task], Any], dim: int = 4, clusters: int = 2) -> None:
        self.seed = 0
        self.fraction = 1.0
        self.clusters_hint = clusters
        self.initial = {"w": torch.zeros(dim)}
        self.answer = answer
        self.asked: list[tuple[str, str]] = []

    def build(self, seed: int) -> dict[str, torch.Tensor]:
        return {"w": torch.randn(len(self.initial["w"]), generator=torch.Generator().manual_seed(seed))}

    def true_cluster_of(self, name: str) -> int:
        return -1

    def module(self, state: dict[str, torch.Tensor]) -> nn.Module:
        """A module whose state is state (no linear layer: methods that pick layers take all of it)."""
        m = nn.Module()
        for k, v in state.items():
            m.register_parameter(k, nn.Parameter(v.clone()))
        return m

    async def ask(self, nodes: list[str], tasks: dict[str, Task], timeout: float | None = None) -> dict[str, Any]:
        self.asked += [(n, tasks[n].kind) for n in nodes]
        return {n: self.answer(n, tasks[n]) for n in nodes}


def vec(*xs: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(xs, dtype=torch.float32)}


class Net(nn.Module):
    """A two-layer classifier of 2 inputs into 3 classes, with a head (methods that match features use it)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(2, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


class FakeNode:
    """A node side's node with 20 random samples of 3 classes, trained and tested by the real loops (epochs
    of batches of 4 at lr 0.1); it counts its fits."""

    def __init__(self, epochs: int = 2) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(20, 2, generator=gen), torch.randint(0, 3, (20,), generator=gen)
        self.device, self.task, self.epochs, self.fits = CPU, CLASSIFICATION, epochs, 0
        torch.manual_seed(0)
        self.model = Net()

    @property
    def own(self) -> nn.Module:
        return self.model

    async def fit(self, module: nn.Module, penalty: Any = None, epochs: Any = None, loss_fn: Any = None) -> float:
        self.fits += 1
        return train_epochs(module, self.x, self.y, epochs=self.epochs, batch_size=4, lr=0.1, seed=0, device=CPU,
                            penalty=penalty, loss_fn=loss_fn)

    def new_model(self, state: dict[str, torch.Tensor] | None = None) -> nn.Module:
        model = Net()
        model.load_state_dict(state if state is not None else self.model.state_dict())
        return model

    async def test(self, module: nn.Module) -> Evaluation:
        return evaluate(module, self.x, self.y, CPU)

    async def run_on_train(self, fn: Any) -> Any:
        return fn(self.x, self.y)


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The squared distance between two models."""
    return float(sum(((a[k] - b[k]) ** 2).sum() for k in a))


class FakePeers:
    """A peer-to-peer node's view for a method that only chooses whom it mixes with: its name, the members it
    knows of, which of them are live, the scenario's seed and its own model (a scalar per model, "w")."""

    def __init__(self, name: str, members: list[str], *, live: list[str] | None = None, seed: int = 0,
                 own: float = 0.0, out: frozenset[str] = frozenset()) -> None:
        self.name, self.seed, self.round, self.out = name, seed, 0, out  # out: the members drawn out of every round
        self.known = sorted({name, *members})
        self.live = sorted(live if live is not None else [m for m in self.known if m != name])
        self.state = vec(own)

    def members(self) -> list[str]:
        return self.known

    def live_peers(self) -> list[str]:
        return self.live

    def current_state(self) -> dict[str, torch.Tensor]:
        return self.state

    def drawn(self, name: str, rnd: int) -> bool:
        return name not in self.out

    def mine(self) -> ModelIn:
        """This node's model as the round loop hands it to aggregate when the node took part."""
        return ModelIn(self.name, self.state, 1)


def models(**values: float) -> dict[str, ModelIn]:
    """Arrived models by sender: a scalar model each, one sample."""
    return {name: ModelIn(name, vec(v), 1) for name, v in values.items()}
