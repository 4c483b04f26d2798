"""A stand-in coordinator for testing server-side methods without sockets: answers come from a function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from p2pfed.methods.central import Task


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
