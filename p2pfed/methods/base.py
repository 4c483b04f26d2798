"""The interface every method implements, and what a method may ask of its node.

A method answers three questions each round (Flower's Strategy has the same shape): which peers' models
do I average (``sources``), to whom do I send mine (``subscribers``), and is there anything to do before
the round (``before_round``: pFedLIA's influence phase). The node's round loop asks these and nothing
else, so adding a method touches no node code.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class NodeContext(Protocol):
    """What a method may use of its node."""

    name: str
    round: int

    def live_peers(self) -> list[str]:
        """Names of the learning peers currently alive."""

    def true_cluster_of(self, name: str) -> int:
        """A peer's true cluster (from the shared scenario), -1 if unknown."""

    async def train_partial(self) -> dict[str, torch.Tensor]:
        """Train a copy of the current model on a batch of local data (pFedLIA's partial model)."""

    async def send_model(self, to: set[str], kind: str, state: dict[str, torch.Tensor],
                         meta: dict[str, Any] | None = None) -> int:
        """Send a model to peers, acknowledged; return how many acknowledged it."""

    async def collect(self, kind: str, rnd: int, expected: set[str], timeout: float
                      ) -> dict[str, dict[str, Any]]:
        """Wait for models of a kind from expected peers (dead ones excused) until timeout."""

    async def score(self, partials: dict[str, dict[str, torch.Tensor]]) -> dict[str, float]:
        """Lazy influence of each partial model on this node's validation split."""

    async def announce_choices(self, chosen: dict[str, float], to: list[str] | None = None) -> None:
        """Tell every live peer (or those in to) which peers this node chose (and their scores)."""

    async def fetch(self, peer: str, kind: str) -> dict[str, torch.Tensor] | None:
        """Ask a peer for a model it keeps ('w0', 'partial'); None if it has none or does not answer."""

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the current model's weights."""

    def current_state(self) -> dict[str, torch.Tensor]:
        """A snapshot of the current model."""

    def record(self, event: str, **fields: Any) -> None:
        """Write a metrics record."""


class Method:
    """Base: FedAvg among all live peers. Subclasses override what differs."""

    name = "base"

    def __init__(self, node: NodeContext, options: Any = None) -> None:
        self.node = node
        self.options = options

    def sources(self, rnd: int) -> set[str]:
        """Peers whose models this node averages in round rnd."""
        return set(self.node.live_peers())

    def subscribers(self, rnd: int) -> set[str]:
        """Peers this node sends its model to in round rnd."""
        return self.sources(rnd)

    def accepts(self, kind: str, sender: str, rnd: int) -> bool:
        """Whether this node takes a model of kind pushed by sender for round rnd: by default the round's
        models of the peers it averages with (anything else is refused, so nobody can fill its inbox)."""
        return kind == "model" and sender in self.sources(rnd)

    def must_participate(self, rnd: int) -> bool:
        """True when this node trains in rnd whatever the participation sampling says."""
        return False

    async def before_round(self, rnd: int) -> None:
        """Work before the round's training (e.g. pFedLIA's influence phase)."""

    def state(self) -> dict[str, Any]:
        """What the method must keep across a restart (stored in the node's checkpoint)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what state() returned."""
