"""The interfaces every method implements, and what a method may ask of its node.

A node, whoever steers its rounds, offers every method the same things (``NodeContext``): its name, seed
and round, training and evaluating any model on its own data (which never leaves it), a copy of a model
trained on a batch, and its records. A node under a coordinator (methods/central.py: ``ClientMethod``) is
given those alone; a peer-to-peer node also exchanges models and notes with its peers (``PeerContext``).

A peer-to-peer method (``Method``) steers its node's whole round, as a Flower Strategy steers a server's
(configure, fit, aggregate), each hook with a default that is FedAvg among all live peers:

- ``before_round``: work before the round (pFedLIA's influence phase);
- ``takes_part``: whether this node (or a peer) trains in the round (the scenario's draw);
- ``train``: the node's local training (default: the scenario's SGD on its own data);
- ``sends``, ``outgoing`` and ``subscribers``: whether the node sends (default: when it trained), what, and
  to whom;
- ``sources`` and ``expected``: whose models it takes, and which of them it waits for;
- ``aggregate``: its model after the round from the models that arrived (default: sample-weighted FedAvg);
- ``settle``: awaited work on that model before the round is evaluated and kept (pFedLIA-p2p weighs the round's
  models and takes a harmful one back; default: none).

The node's round loop (node/learner.py) asks these and nothing else, so a new method touches no node code.
What a method says to its peers beyond the round's model travels as models of its own kinds (taken if
``accepts`` says so) and notes of its own kinds (``notes``, handled by ``on_note``); the node routes both and
knows no kind by name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from p2pfed.learn.tasks import LearningTask
from p2pfed.learn.train import Evaluation, weighted_average
from p2pfed.methods.options import MethodOptions, options_of
from p2pfed.wire import ModelIn, NoteIn

if TYPE_CHECKING:
    from p2pfed.scenario.config import Scenario

T = TypeVar("T")
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
# one model from several and their weights (sample counts): FedAvg's weighted average, a strategy's own
Combine = Callable[[list[dict[str, torch.Tensor]], list[float]], dict[str, torch.Tensor]]


class NodeContext(Protocol):
    """What any method may use of its node, peer to peer or under a coordinator. Nothing here names a method."""

    name: str
    round: int
    seed: int  # the scenario's seed: the same on every node (shared draws, topologies)
    device: torch.device
    cfg: Any  # the scenario's [train] settings (epochs, batch_size, lr, ...)
    task: LearningTask  # the loss and metrics of the scenario's data (learn/tasks.py)

    @property
    def samples(self) -> int:
        """The node's training samples: its model's weight in a sample-weighted average."""

    @property
    def round_seed(self) -> int:
        """The seed of the node's local training in this round."""

    @property
    def own(self) -> nn.Module:
        """The node's own model (kept across rounds)."""

    def true_cluster_of(self, name: str) -> int:
        """A node's true cluster (from the shared scenario), -1 if unknown."""

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the current model's weights."""

    def current_state(self) -> dict[str, torch.Tensor]:
        """A snapshot of the current model."""

    async def pick(self, candidates: list[dict[str, torch.Tensor]]) -> int:
        """Index of the candidate with the lowest loss on this node's training data."""

    async def train_local(self, start: dict[str, torch.Tensor] | None, penalty_coef: float = 0.0,
                          epochs: int | None = None) -> tuple[dict[str, torch.Tensor], float]:
        """Train from start (None: from the node's own model), which becomes the node's model; return the new
        state and the training loss."""

    async def evaluate_state(self, state: dict[str, torch.Tensor] | None) -> Evaluation:
        """Test metrics of state (None: the node's own model), which becomes the node's model."""

    def new_model(self, state: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """A fresh model of the scenario's architecture, with state if given."""

    async def fit(self, module: nn.Module, penalty: Callable[[nn.Module], torch.Tensor] | None = None,
                  epochs: int | None = None, loss_fn: LossFn | None = None) -> float:
        """Train any module on the node's training data with the scenario's settings; return the loss.
        loss_fn(model, x, y) replaces the task's loss."""

    async def val_loss(self, module: nn.Module) -> float:
        """Loss of any module on the node's validation split."""

    async def run_on_train(self, fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> Any:
        """fn(x_train, y_train) in a worker thread."""

    async def train_loss(self, module: nn.Module) -> float:
        """Loss of any module on the node's training data."""

    async def test(self, module: nn.Module) -> Evaluation:
        """Test metrics of any module on the node's test shard."""

    async def train_copy(self, start: dict[str, torch.Tensor], samples: int, epochs: int, lr: float
                         ) -> dict[str, torch.Tensor]:
        """A copy of start trained on the first samples of the node's shard (a scripted free-rider's: start,
        untrained); the node's own model is unchanged."""

    async def on_validation(self, judge: Callable[..., T]) -> T:
        """judge(model, x_val, y_val, device, task) in a worker thread, on the node's validation split."""

    def record(self, event: str, **fields: Any) -> None:
        """Write a metrics record."""


class PeerContext(NodeContext, Protocol):
    """What a peer-to-peer method may use of its node besides what every node offers: its peers, and the
    models and notes it exchanges with them."""

    def live_peers(self) -> list[str]:
        """Names of the learning peers currently alive."""

    @property
    def lazy(self) -> bool:
        """Whether this node introduces itself lazily ([mesh] introduce_up_to): it hears directly from about that
        many peers, and knows the rest from news (a request to one introduces it)."""

    def members(self) -> list[str]:
        """Names of every learning member this node has known of, itself included, alive or not, sorted: a set
        that only grows (a member that dies, finishes or is forgotten by the membership table keeps its place),
        to lay a topology over."""

    def gone(self, name: str) -> bool:
        """Whether peer name is dead or gone as far as the membership table knows (forgotten by it too, once
        met); a member not met yet is not gone, nor one dead only because it never answered its introduction (a
        request to it introduces it again)."""

    def peer_round(self, name: str) -> int:
        """The latest round peer name was heard to be at: by the membership, or in its own answer that it keeps no
        model of a kind yet (fetch); 0 if never heard."""

    def drawn(self, name: str, rnd: int) -> bool:
        """Whether the scenario's participation draw has node name train in round rnd (the same on every node)."""

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
                      ) -> dict[str, ModelIn | NoteIn]:
        """Wait for the models (or notes) of a kind for round rnd from expected peers (dead ones excused) until
        timeout (None: the round timeout)."""

    async def fetch(self, peer: str, kind: str) -> dict[str, torch.Tensor] | None:
        """Ask a peer for a model it keeps; None if it has none or does not answer."""



class Method:
    """A peer-to-peer method. Base: FedAvg among all live peers. Subclasses override what differs."""

    name = "base"
    notes: ClassVar[frozenset[str]] = frozenset()  # the kinds of note this method takes from peers
    options_type: ClassVar[type[MethodOptions] | None] = None  # its own options, the [methods.NAME] table
    tasks: ClassVar[frozenset[str] | None] = None  # the learning tasks (learn/tasks.py) it can run; None: any

    def __init__(self, node: PeerContext, options: Any = None) -> None:
        self.node = node
        self.options = options

    @classmethod
    def options_from(cls, scenario: Scenario) -> Any:
        """This method's options: its [methods.NAME] table if it declares an options type (None: it has none)."""
        return options_of(cls.options_type, scenario, cls.name) if cls.options_type is not None else None

    @classmethod
    def introduce_up_to(cls, options: Any, nodes: int) -> int:
        """The live peers a member of this method introduces itself to in a mesh of nodes, when the scenario
        leaves [mesh] introduce_up_to to the method (0); 0: every peer it hears of. Default 0: the peers a
        method works with are among its live peers, and every peer may be one (a subclass that works with
        every live peer needs them all introduced)."""
        return 0

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
        """True when every node trains in rnd whatever the participation sampling says."""
        return False

    def takes_part(self, rnd: int, peer: str | None = None) -> bool:
        """Whether peer (None: this node) trains in round rnd (and, by default, sends its model): the scenario's
        participation draw, which every node computes alike, unless every node must."""
        return self.must_participate(rnd) or self.node.drawn(peer or self.node.name, rnd)

    def sends(self, rnd: int) -> bool:
        """Whether this node sends its model in round rnd: by default when it takes part (trains)."""
        return self.takes_part(rnd)

    def expected(self, rnd: int) -> set[str]:
        """The peers whose round models this node waits for in rnd: the sources that take part."""
        return {p for p in self.sources(rnd) if self.takes_part(rnd, p)}

    async def before_round(self, rnd: int) -> None:
        """Work before the round's training (e.g. pFedLIA's influence phase)."""

    async def train(self, rnd: int) -> float | None:
        """This node's local training in a round it takes part in; return the training loss (None: it did not
        train). Default: the scenario's local SGD on the node's data, from its current model."""
        return await self.node.fit(self.node.own)

    def outgoing(self, rnd: int) -> dict[str, torch.Tensor]:
        """The model this node sends its subscribers after training in round rnd. Default: its current model."""
        return self.node.current_state()

    def aggregate(self, rnd: int, own: ModelIn | None, arrived: dict[str, ModelIn]) -> dict[str, torch.Tensor] | None:
        """The node's model after round rnd, from the sources' models that arrived and its own (None if it sent
        none); None keeps the model it has. Default: the sample-weighted average of the models that arrived
        and its own, so every member of a group ends the round with the group's average (what a server averaging
        the group's models would give); the node's model as it is when none arrived."""
        return group_average(own, arrived)

    async def settle(self, rnd: int) -> None:
        """Work on round rnd's aggregate once the node holds it, before the round's evaluation and checkpoint
        (e.g. pFedLIA-p2p weighs the models that came on its validation split and takes a harmful one back).
        Awaited, unlike aggregate: a forward pass belongs in a worker thread (on_validation). Default: none."""

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


class Exchanging(Method):
    """A method whose nodes all exchange models every round, as decentralized SGD does: the scenario's
    participation draw decides only who trains (every method trains the same nodes in the same rounds), and a
    node drawn out of training still sends its model and takes its sources'. (Were it to sit the round out, it
    would wait for nobody and run rounds ahead of its neighbours.) A dead or finished source is not waited for."""

    def sends(self, rnd: int) -> bool:
        return True

    def subscribers(self, rnd: int) -> set[str]:
        return super().subscribers(rnd) & set(self.node.live_peers())

    def expected(self, rnd: int) -> set[str]:
        return self.sources(rnd)


class Mixing(Exchanging):
    """A method whose node mixes its model with its neighbours' by the weights of a doubly stochastic matrix (a
    row per node, ``weights``), so the mesh's mean model is kept; a neighbour's model that did not come leaves
    its weight with the node's own (the row still sums to 1)."""

    def weights(self, rnd: int) -> dict[str, float]:
        """This node's row of the round's mixing matrix: its neighbours' weights and its own."""
        raise NotImplementedError

    def aggregate(self, rnd: int, own: ModelIn | None, arrived: dict[str, ModelIn]) -> dict[str, torch.Tensor] | None:
        return mixed(self.weights(rnd), own.state if own is not None else self.node.current_state(), arrived)


def group_average(own: ModelIn | None, arrived: dict[str, ModelIn], combine: Combine = weighted_average
                  ) -> dict[str, torch.Tensor] | None:
    """combine (default: the sample-weighted average) of the models that arrived, in their senders' order, and
    the node's own after them (if it sent one); None when nothing arrived: the node's model stays as it is."""
    if not arrived:
        return None
    models = [arrived[p] for p in sorted(arrived)] + ([own] if own is not None else [])
    return combine([m.state for m in models], [float(m.samples) for m in models])


def shared_number(seed: int, *keys: object) -> int:
    """A 64-bit number every machine computes alike from the scenario's seed and keys (a node's name, a round):
    the root of every draw about anyone (who trains in a round, whom a node contacts) made with no message."""
    digest = hashlib.blake2b("/".join(map(str, (seed, *keys))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shared_rng(seed: int, *keys: object) -> np.random.Generator:
    """A random generator every node seeds alike from the scenario's seed and keys (shared_number)."""
    return np.random.default_rng(shared_number(seed, *keys))


def mixed(weights: dict[str, float], own: dict[str, torch.Tensor], arrived: dict[str, ModelIn]
          ) -> dict[str, torch.Tensor] | None:
    """The node's model mixed with its neighbours' by weights (a row of a mixing matrix: the node's own name and
    its neighbours', summing to 1); a neighbour whose model did not arrive leaves its weight with the node's own
    model (the row still sums to 1). None when nothing arrived: the model stays as it is."""
    got = sorted(p for p in arrived if p in weights)
    if not got:
        return None
    kept = 1.0 - sum(weights[p] for p in got)
    return weighted_average([arrived[p].state for p in got] + [own], [weights[p] for p in got] + [kept])
