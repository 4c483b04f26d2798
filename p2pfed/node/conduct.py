"""How a node treats its peers: honestly, unless whoever built it scripted otherwise.

A node's own data, its training, the copies of models it trains for peers, the updates it answers a
coordinator with, and every model that leaves it pass through its conduct. The honest conduct (this base)
changes nothing. A launcher that scripts dishonest members for an experiment hands a node another (the
launch package), so the node's round loop has no branch for any of them, and a node started by hand is
honest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import torch

if TYPE_CHECKING:
    from p2pfed.methods.base import NodeContext
    from p2pfed.methods.central import ClientMethod, Task, Update
    from p2pfed.node.local import LocalData

T = TypeVar("T")
State = dict[str, torch.Tensor]


class Conduct:
    """The honest conduct: each hook returns what it is given, or does the work it is handed."""

    def data(self, data: LocalData, classes: int) -> LocalData:
        """The data the node trains and validates on, from its shard."""
        return data

    async def train(self, work: Callable[[], Awaitable[T]]) -> T | None:
        """The node's local training in a round (work does it; None: no training was done)."""
        return await work()

    async def copy(self, start: State, work: Callable[[], Awaitable[State]]) -> State:
        """A copy of start trained for a peer (work trains it)."""
        return await work()

    def outgoing(self, state: State, seed: int) -> State:
        """A model as it leaves the node, sent or served (seed: the node's round seed, + 1 for a second one)."""
        return state

    async def answer(self, node: NodeContext, client: ClientMethod, task: Task) -> tuple[Update, int]:
        """The update a node under a coordinator answers a train task with, and the candidate it trained."""
        return await client.train(task)
