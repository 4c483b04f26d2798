"""The interface of the methods a coordinator runs, server side and node side (what every node offers its
method, ``NodeContext``, is in methods/base.py), and their common base.

A round at the coordinator (coordinator/server.py) asks its method, in this order: anything before the
round (``before_round``: pFedLIA-central's influence phase, FeSEM's initial clustering), who trains
(``participants``), what each of them gets (``train_task``), and what to make of the updates that came
back in time (``aggregate``). Evaluation asks ``eval_task``: the personalised model of a node. Flower's
Strategy has the same shape (configure_fit / aggregate_fit / configure_evaluate).

A task travels as one ``task`` message: its kind, zero or more candidate models (tensors named
``"<k>/<parameter>"``), the group of each candidate and a small meta map. The node answers with a
``model`` message (kind ``update``) or, for a ``note`` task, a ``note``: one number per name the task
lists (pFedLIA-central's lazy influence of each partial model). With several candidates
the node takes the one with the lowest loss on its own training data (IFCA's rule, also how CFL and
FeSEM place a node they know nothing of yet). What the node does with a task is its ClientMethod: the
base covers plain local training with an optional distance penalty; methods that change local training
subclass it.

The base ``ServerMethod`` is the classic FedAvg server for some grouping of the nodes: FedAvg is one group,
Oracle the true clusters, pFedLIA-central the OPTICS clusters, FeSEM/IFCA/CFL groups that move. Subclasses
override only what differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar

import torch
from torch import nn

from p2pfed.learn.held import ServerData
from p2pfed.learn.train import Evaluation, weighted_average
from p2pfed.methods.base import Combine, NodeContext, shared_number
from p2pfed.methods.options import MethodOptions, options_of
from p2pfed.wire import WireError, check_tensors
from p2pfed.wire.messages import Int, Num, Opt, SchemaError, check_value

if TYPE_CHECKING:
    from p2pfed.scenario.config import Scenario

T = TypeVar("T")


# What a task may ask of a node, and so what a method's options may set that travels in one (checked with the
# options, so a scenario that loads never has its tasks refused by every node)
MAX_PENALTY = 1e6
MAX_EPOCHS = 10_000


@dataclass(frozen=True)
class Instructions:
    """How a node carries out a task, typed. The fields travel as the task's meta map; the node reads them back
    with its method's type (``ClientMethod.instructions``), which refuses a key it does not know and a value
    outside its field's bounds (``SPEC``: a wire spec per field, every field has one). A method that needs more
    subclasses it (FedFM's feature matching, FedDSMIC's MAML steps)."""

    penalty: float = 0.0  # coef/2·||w − start||² added to the local loss (FedProx's μ, FeSEM's 2λ, CAM's λ)
    epochs: int = 0  # local epochs of this task; 0: the round's (a method's warm-up may ask for more)
    validate: bool = False  # eval: the model's accuracy on the node's validation split too (val_accuracy)

    SPEC: ClassVar[dict[str, Any]] = {"penalty": Num(0.0, MAX_PENALTY), "epochs": Int(0, MAX_EPOCHS), "validate": bool}

    def wire(self) -> dict[str, Any]:
        """The fields that differ from their defaults: the task's meta map."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    @classmethod
    def read(cls, meta: dict[str, Any]) -> Self:
        """The instructions a task's meta map carries; WireError for an unknown key or a value out of bounds."""
        try:
            check_value(meta, {key: Opt(spec) for key, spec in cls.SPEC.items()}, "task.meta")
        except SchemaError as exc:
            raise WireError(str(exc)) from None
        values: dict[str, Any] = {k: float(v) if isinstance(cls.SPEC[k], Num) else v for k, v in meta.items()}
        return cls(**values)

    @classmethod
    def of(cls, how: Instructions) -> Self:
        """how as this type: itself if it is one (what a node read with its method's type), else its fields read
        as this type's (a task built in process with the base type, say); WireError for a field it lacks."""
        return how if isinstance(how, cls) else cls.read(how.wire())


@dataclass
class Task:
    """What the coordinator asks of a node."""

    kind: str  # train | eval | finish | compute (a method's own step, tensors back) | note (a number per name)
    models: list[dict[str, torch.Tensor]] = field(default_factory=list)
    instructions: Instructions = field(default_factory=Instructions)
    groups: list[int] = field(default_factory=list)  # the group of each candidate model
    names: list[str] = field(default_factory=list)  # note tasks: what the numbers are for (e.g. the node of each model)
    shared: int = 0  # how many leading models are not candidates but shared by all (CAM's global model)
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # tensors that are not models (prototypes)

    @property
    def candidates(self) -> list[dict[str, torch.Tensor]]:
        """The models the node chooses among (groups names their groups)."""
        return self.models[self.shared:]


@dataclass
class Update:
    """A node's answer to a train (or compute) task."""

    state: dict[str, torch.Tensor] | None  # None: the node keeps its model (local-only)
    samples: int = 0  # the node's training samples (the node fills them in as it answers)
    choice: int = 0  # the index of the candidate it trained
    train_loss: float = math.nan  # its mean training loss (nan: it trained nothing, or did not say)
    extra: list[dict[str, torch.Tensor]] = field(default_factory=list)  # more models (CAM: the global part)
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # tensors that are not models (prototypes)


def pack(models: list[dict[str, torch.Tensor]], aux: dict[str, torch.Tensor] | None = None
         ) -> dict[str, torch.Tensor]:
    """Several models as one message's tensors: parameter names prefixed with the model's index; other
    tensors (a method's prototypes, anchors) prefixed with "aux/"."""
    out = {f"{k}/{name}": t for k, state in enumerate(models) for name, t in state.items()}
    out.update({f"aux/{name}": t for name, t in (aux or {}).items()})
    return out


def aux_of(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The non-model tensors of a packed message (their method checks their shapes)."""
    return {key[4:]: t for key, t in tensors.items() if key.startswith("aux/")}


def unpack(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The models of a packed message, each checked against the local model; WireError if malformed."""
    groups: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        if key.startswith("aux/"):
            continue
        index, sep, name = key.partition("/")
        if not sep or not index.isdigit():
            raise WireError(f"tensor {key!r} is not named <model index>/<parameter>")
        groups.setdefault(int(index), {})[name] = t
    if sorted(groups) != list(range(len(groups))):
        raise WireError("packed models are not numbered 0..n-1")
    for state in groups.values():
        check_tensors(state, reference)
    return [groups[k] for k in range(len(groups))]


def participates(seed: int, name: str, rnd: int, fraction: float) -> bool:
    """Whether node name trains in round rnd: a hash every machine computes alike.

    The decentralized methods and the coordinator use the same draw, so every method of a scenario trains
    the same nodes in the same rounds.
    """
    if fraction >= 1.0:
        return True
    return shared_number(seed, name, rnd) / 2**64 < fraction


class ServerContext(Protocol):
    """What a server-side method may use of its coordinator."""

    seed: int
    fraction: float
    initial: dict[str, torch.Tensor]  # the shared seeded initial model
    clusters_hint: int  # the scenario's number of clusters, for methods that must be given K
    data: ServerData  # what it holds of the data itself: samples a method's server may use, a test set

    def build(self, seed: int) -> dict[str, torch.Tensor]:
        """A freshly initialised model of the scenario's architecture."""

    def module(self, state: dict[str, torch.Tensor]) -> nn.Module:
        """The scenario's architecture with state loaded, in eval mode (server-side inference)."""

    def true_cluster_of(self, name: str) -> int:
        """A node's true cluster (from the scenario's partition), -1 if unknown."""

    async def ask(self, nodes: list[str], tasks: dict[str, Task], timeout: float | None = None
                  ) -> dict[str, Any]:
        """Send each node its task; return the replies that came in time (an Update, or a note task's numbers as
        a dict of name → number)."""


class ServerMethod:
    """Base: FedAvg per group. ``groups`` maps a node to its group, ``models`` a group to its model."""

    name = "base"
    options_type: type[MethodOptions] | None = None  # its own options, the [methods.NAME] table (methods/options.py)
    client: type[ClientMethod] | None = None  # its node side, if not the base ClientMethod
    tasks: frozenset[str] | None = None  # the learning tasks (learn/tasks.py) it can run; None: any

    def __init__(self, ctx: ServerContext, options: Any) -> None:
        self.ctx = ctx
        self.options = options
        self.groups: dict[str, int] = {}
        self.models: dict[int, dict[str, torch.Tensor]] = {}

    @classmethod
    def options_from(cls, scenario: Scenario) -> Any:
        """This method's options, for its server side and its node side alike: its [methods.NAME] table if it
        declares an options type (None: it has none)."""
        return options_of(cls.options_type, scenario, cls.name) if cls.options_type is not None else None

    # -- the round --------------------------------------------------------------------------------
    async def before_round(self, rnd: int, live: list[str]) -> None:
        """Work before the round (place nodes never seen before; a method's one-off phases)."""
        for node in live:
            if not self.knows(node):
                self.admit(node)

    def knows(self, node: str) -> bool:
        """Whether the method has placed node (or decided how it will be placed)."""
        return node in self.groups

    def admit(self, node: str) -> None:
        """Place a node the method has not seen (default: group 0)."""
        self.groups[node] = 0
        self.models.setdefault(0, dict(self.ctx.initial))

    def participants(self, rnd: int, live: list[str]) -> list[str]:
        """Who trains in round rnd: the scenario's fraction, drawn by the shared hash."""
        return [n for n in live if participates(self.ctx.seed, n, rnd, self.ctx.fraction)]

    def place(self, node: str, group: int) -> None:
        """A node took the candidate model of group (lowest loss on its data): it is in that group now."""
        self.groups[node] = group

    def train_task(self, rnd: int, node: str) -> Task:
        """The model(s) a participant starts from, and how it should train."""
        return self._task("train", node)

    def _task(self, kind: str, node: str) -> Task:
        group = self.groups.get(node)
        if group is None or group not in self.models:
            # A node this method has not placed yet: it takes the group whose model fits its data best.
            groups = sorted(self.models)
            return Task(kind, [self.models[g] for g in groups], groups=groups)
        return Task(kind, [self.models[group]], groups=[group])

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        """FedAvg by sample count of each group's updates; a group nobody updated keeps its model."""
        self.aggregate_groups(updates, weighted_average)

    def aggregate_groups(self, updates: dict[str, Update], combine: Combine) -> None:
        """Each group's model: combine of its members' updates (in the order they came) and their sample counts;
        a group nobody updated keeps its model."""
        by_group: dict[int, tuple[list[dict[str, torch.Tensor]], list[float]]] = {}
        for node, up in updates.items():
            if up.state is not None:
                states, samples = by_group.setdefault(self.groups[node], ([], []))
                states.append(up.state)
                samples.append(float(up.samples))
        for g, (states, samples) in by_group.items():
            self.models[g] = combine(states, samples)

    def eval_task(self, node: str) -> Task:
        """The node's personalised model, to evaluate (and keep, at the end)."""
        return self._task("eval", node)

    def clusters(self) -> dict[str, int]:
        """Each node's current group, for the record (cluster sizes over rounds, ARI)."""
        return dict(self.groups)

    def served_model(self) -> dict[str, torch.Tensor] | None:
        """The one model the method serves every node, which a server-held test set can test (the protocol
        of Ye et al. 2023, data.server_test); None for a method that personalises (clusters, local models,
        ensembles)."""
        return None

    # -- crash safety -----------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        """What the coordinator's checkpoint keeps: plain data, and named models."""
        return {"groups": self.groups}, {f"group{g}": m for g, m in self.models.items()}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        """Take back what state() returned."""
        self.groups = {k: int(v) for k, v in data["groups"].items()}
        self.models = {int(k.removeprefix("group")): m for k, m in models.items() if k.startswith("group")}


class ClientMethod:
    """Node side of a coordinated method: what a node does with a train task.

    The base takes the best-fitting candidate, trains it, and returns it; the instructions' ``penalty`` adds
    coef/2·||w − start||² to the loss (FedProx's μ, FeSEM's 2λ). With no candidate the node trains its own
    model and sends nothing back (local-only).
    """

    instructions: ClassVar[type[Instructions]] = Instructions  # what its tasks' meta maps are read as

    def __init__(self, node: NodeContext, options: Any = None) -> None:
        self.node = node
        self.options = options  # the method's options, the same object its server side has

    async def train(self, task: Task) -> tuple[Update, int]:
        """Answer a train task: the update and the index of the candidate trained."""
        choice = await self.node.pick(task.candidates) if len(task.candidates) > 1 else 0
        start = task.candidates[choice] if task.candidates else None
        how = task.instructions
        state, loss = await self.node.train_local(start, how.penalty, how.epochs or None)
        return Update(state if task.candidates else None, choice=choice, train_loss=loss), choice

    async def compute(self, task: Task) -> Update:
        """Answer a compute task: a method's own step that trains nothing (FedFM's local anchors)."""
        raise WireError(f"{type(self).__name__} takes no compute tasks")

    async def note(self, task: Task) -> dict[str, float]:
        """Answer a note task: a finite number for each name in task.names (pFedLIA-central's scores)."""
        raise WireError(f"{type(self).__name__} takes no note tasks")

    async def evaluate(self, task: Task) -> tuple[Evaluation, int]:
        """Answer an eval task: test metrics of the personalised model, and the candidate it is."""
        choice = await self.node.pick(task.candidates) if len(task.candidates) > 1 else 0
        return await self.node.evaluate_state(task.candidates[choice] if task.candidates else None), choice

    def given_back(self, task: Task, choice: int, before: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """The models a train task's update is trained from, untouched and in the update's order (what a scripted
        free-rider sends instead): the candidate chosen, then the models every node shares (a global part, an
        ensemble's members); with no model in the task, the model the node held before (before)."""
        return [*task.candidates[choice:choice + 1], *task.models[:task.shared]] or [before]

    # -- crash safety -----------------------------------------------------------------------------
    def state(self) -> dict[str, torch.Tensor]:
        """What the node side keeps across rounds besides the node's model (SCAFFOLD's own control variate),
        as named tensors: the node saves them in its checkpoint after every train task. Default: nothing."""
        return {}

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        """Take back what state() returned, from the node's own checkpoint."""


def keyed(prefix: str, states: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    """Per-node models for a checkpoint, named "<prefix>:<node>" (see unkeyed)."""
    return {f"{prefix}:{node}": state for node, state in states.items()}


def unkeyed(prefix: str, models: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    """The per-node models that keyed(prefix, ...) stored, by node."""
    return {k.removeprefix(f"{prefix}:"): m for k, m in models.items() if k.startswith(f"{prefix}:")}


def kmeans_groups(points: dict[str, torch.Tensor], k: int, seed: int) -> dict[str, int]:
    """k-means with 20 random restarts, keeping the least intra-cluster distance (the initial
    centers of Long et al. 2023; also FeSEM-CAM's and FedDSMIC's first clusters): a group per node."""
    from sklearn.cluster import KMeans

    names = sorted(points)
    labels = KMeans(n_clusters=k, n_init=20, random_state=seed).fit(
        torch.stack([points[n] for n in names]).numpy()).labels_
    return {n: int(g) for n, g in zip(names, labels, strict=True)}


def nearest_groups(points: dict[str, torch.Tensor], centers: dict[int, torch.Tensor]) -> dict[str, int]:
    """Each node's nearest center by Euclidean distance (FeSEM's E-step, Eq. 8; FeSEM-CAM's Eq. 11)."""
    names, groups = sorted(points), sorted(centers)
    nearest = torch.cdist(torch.stack([points[n] for n in names]),
                          torch.stack([centers[g] for g in groups])).argmin(dim=1).tolist()
    return {n: groups[i] for n, i in zip(names, nearest, strict=True)}


def trainable_names(ctx: ServerContext) -> list[str]:
    """The names of the scenario model's trainable parameters, its buffers left out: what a server-side
    optimiser moves (FedAvgM's momentum, SCAFFOLD's step and control variates)."""
    return [name for name, p in ctx.module(dict(ctx.initial)).named_parameters() if p.requires_grad]


def flatten(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The floating-point parameters of a model as one vector (for distances between models)."""
    return torch.cat([t.detach().reshape(-1).float() for t in state.values() if t.is_floating_point()])
