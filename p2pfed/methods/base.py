"""The interface every method implements, and what a method may ask of its node.

A method answers three questions each round (Flower's Strategy has the same shape): which peers' models
do I average (``sources``), to whom do I send mine (``subscribers``), and is there anything to do before
the round (``before_round``: pFedLIA's influence phase). The node's round loop asks these and nothing
else, so adding a method touches no node code. What a method says to its peers beyond the round's model
travels as models of its own kinds (taken if ``accepts`` says so) and notes of its own kinds (``notes``,
handled by ``on_note``); the node routes both and knows no kind by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch

from p2pfed.methods.options import MethodOptions, options_of

if TYPE_CHECKING:
    from p2pfed.scenario.config import Scenario

T = TypeVar("T")


class NodeContext(Protocol):
    """What a method may use of its node. Nothing here names a method: a method builds its own steps (pFedLIA's
    influence phase) from these."""

    name: str
    round: int

    def live_peers(self) -> list[str]:
        """Names of the learning peers currently alive."""

    def true_cluster_of(self, name: str) -> int:
        """A peer's true cluster (from the shared scenario), -1 if unknown."""

    async def train_copy(self, start: dict[str, torch.Tensor], samples: int, epochs: int, lr: float
                         ) -> dict[str, torch.Tensor]:
        """A copy of start trained on the first samples of the node's shard; the node's model is unchanged. (A
        scripted free-rider's is start; a noise-model adversary's models become noise as they are sent.)"""

    async def on_validation(self, judge: Callable[..., T]) -> T:
        """judge(model, x_val, y_val, device, task) in a worker thread, on the node's validation split."""

    def keep(self, models: dict[str, dict[str, torch.Tensor]]) -> None:
        """Keep models by kind for peers that request them (kept across a restart)."""

    def kept_model(self, kind: str) -> dict[str, torch.Tensor] | None:
        """A model the node keeps, None if none of that kind."""

    async def send_model(self, to: set[str], kind: str, state: dict[str, torch.Tensor],
                         meta: dict[str, Any] | None = None) -> int:
        """Send a model to peers, acknowledged; return how many acknowledged it."""

    async def send_note(self, to: list[str], kind: str, values: dict[str, float]) -> int:
        """Send a note (peer names and a number each, no tensors) to peers; return how many acknowledged it."""

    async def collect(self, kind: str, rnd: int, expected: set[str], timeout: float | None
                      ) -> dict[str, dict[str, Any]]:
        """Wait for the models (or notes) of a kind for round rnd from expected peers (dead ones excused) until
        timeout (None: the round timeout)."""

    async def fetch(self, peer: str, kind: str) -> dict[str, torch.Tensor] | None:
        """Ask a peer for a model it keeps; None if it has none or does not answer."""

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the current model's weights."""

    def current_state(self) -> dict[str, torch.Tensor]:
        """A snapshot of the current model."""

    def record(self, event: str, **fields: Any) -> None:
        """Write a metrics record."""


class Method:
    """Base: FedAvg among all live peers. Subclasses override what differs."""

    name = "base"
    notes: ClassVar[frozenset[str]] = frozenset()  # the kinds of note this method takes from peers
    options_type: ClassVar[type[MethodOptions] | None] = None  # its own options, the [methods.NAME] table
    tasks: ClassVar[frozenset[str] | None] = None  # the learning tasks (learn/tasks.py) it can run; None: any

    def __init__(self, node: NodeContext, options: Any = None) -> None:
        self.node = node
        self.options = options

    @classmethod
    def options_from(cls, scenario: Scenario) -> Any:
        """This method's options: its [methods.NAME] table if it declares an options type (None: it has none)."""
        return options_of(cls.options_type, scenario, cls.name) if cls.options_type is not None else None

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

    def on_note(self, kind: str, sender: str, rnd: int, values: dict[str, float]) -> None:
        """A note of one of the kinds in ``notes`` from a member the node knows, for a round up to the node's
        window ahead (possibly a past one); raise WireError to refuse it. The node also keeps it for
        ``collect(kind, rnd, ...)`` while rnd is still to come."""

    async def on_peer_back(self, peer: str) -> None:
        """A learning peer appeared or came back (e.g. restarted from an older checkpoint)."""

    def report(self) -> dict[str, Any]:
        """What the method adds to the node's final record (e.g. the peers it chose)."""
        return {}

    def state(self) -> dict[str, Any]:
        """What the method must keep across a restart (stored in the node's checkpoint)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what state() returned."""
