"""A method written once and run either way: by a coordinator over its clients, or by each peer over the peers
it exchanges with.

A ``Strategy`` says three things, each with FedAvg's answer by default, in the shape of Flower's Strategy
(configure a round, fit, aggregate):

- ``group``: with whom a node learns (configure): the nodes of one group end every round with one model; None
  puts a node on its own;
- ``train``: what a node does with the model it starts a round from (fit), on its own data, wherever it
  runs: local SGD by default;
- ``aggregate``: one model from the models a group's members sent and their sample counts (aggregate).

A node evaluates its group's model (with a coordinator, the model of the group it is given; peer to peer, the
one it ends the round with). Two forms run a strategy and need nothing else from it:

- ``Coordinated``: the coordinator keeps one model per group, sends it to the group's participants, and
  aggregates what comes back by group; a node on its own gets tasks with no model, trains its own, and
  anything it sends back is ignored. Its node side runs the strategy's ``train`` (``StrategyClient``) where
  the strategy trains its own way, else it is the base node side, which carries out a task's instructions.
- ``Peered``: a node runs the strategy's ``train`` on its own model, sends it to the live peers of its group,
  and aggregates what arrived with its own model, so every member of a group that took part ends the round
  with what a server of that group would have given it.

A form names itself after its strategy (``Peered``: ``NAME-p2p``) and takes its options type and node side
(a form that sets them itself is refused), so a method that runs either way is its strategy and two lines, one
per form (methods/baselines.py, methods/fedprox.py).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import torch

from p2pfed.learn.train import weighted_average
from p2pfed.methods.base import Method, NodeContext, PeerContext, group_average
from p2pfed.methods.central import ClientMethod, ServerContext, ServerMethod, Task, Update
from p2pfed.methods.options import MethodOptions
from p2pfed.wire import ModelIn

State = dict[str, torch.Tensor]


class Knows(Protocol):
    """What a strategy's grouping may ask of whoever runs it, a node or a coordinator."""

    def true_cluster_of(self, name: str) -> int:
        """A node's true cluster (from the scenario's partition), -1 if unknown."""


class Strategy:
    """A method's rule, the same under a coordinator and peer to peer. Base: FedAvg, everyone in one group."""

    name: ClassVar[str] = "base"
    options_type: ClassVar[type[MethodOptions] | None] = None  # its own options, the [methods.NAME] table
    serves_one_model: ClassVar[bool] = False  # every node gets the same model (a server test set can test it)

    def __init__(self, options: Any = None) -> None:
        self.options = options

    def group(self, ctx: Knows, node: str) -> int | None:
        """The group node learns with; None: it is on its own (no model leaves it, none comes to it)."""
        return 0

    async def train(self, node: NodeContext, start: State | None) -> tuple[State, float]:
        """Train from start (None: the node's own model), on the node's data, into the node's model; return the
        trained state and the training loss. Default: the scenario's local SGD."""
        return await node.train_local(start)

    def aggregate(self, states: list[State], samples: list[float]) -> State:
        """One model from a group's models and their sample counts. Default: the sample-weighted average."""
        return weighted_average(states, samples)


def named(form: type, *given_by_strategy: str) -> None:
    """Refuse a form that sets what its strategy gives it (its name, options, node side), and a strategy with no
    name of its own: either would register a method under a name, or with options, its author did not mean."""
    clash = [attr for attr in given_by_strategy if attr in form.__dict__]
    if clash:
        raise TypeError(f"{form.__name__} sets {', '.join(clash)}, which its strategy gives it: set them there")
    strategy = form.__dict__["strategy"]
    if "name" not in strategy.__dict__:
        raise TypeError(f"{form.__name__}: its strategy {strategy.__name__} names no method (name = ...)")


class StrategyClient(ClientMethod):
    """A coordinated strategy's node side: the best-fitting candidate (with one, that one), trained by the
    strategy; with no candidate the node trains its own model and sends nothing back (a node on its own)."""

    strategy: ClassVar[type[Strategy]] = Strategy

    def __init__(self, node: NodeContext, options: Any = None) -> None:
        super().__init__(node, options)
        self.rule = self.strategy(options)

    async def train(self, task: Task) -> tuple[Update, int]:
        choice = await self.node.pick(task.candidates) if len(task.candidates) > 1 else 0
        start = task.candidates[choice] if task.candidates else None
        state, loss = await self.rule.train(self.node, start)
        return Update(state if task.candidates else None, choice=choice, train_loss=loss), choice


class Coordinated(ServerMethod):
    """A strategy run by a coordinator: one model per group, FedAvg's rounds, the strategy's aggregate."""

    strategy: ClassVar[type[Strategy]] = Strategy

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "strategy" in cls.__dict__:  # a form of a strategy (a method built on one names itself)
            named(cls, "name", "options_type", "client")
            cls.name, cls.options_type = cls.strategy.name, cls.strategy.options_type
            # A strategy that trains as FedAvg does leaves its node side the base one, which carries out what a
            # task's instructions ask (a method built on this form may send a penalty or epochs).
            trains = cls.strategy.train is not Strategy.train
            cls.client = type(f"{cls.strategy.__name__}Client", (StrategyClient,), {"strategy": cls.strategy}) \
                if trains else None

    def __init__(self, ctx: ServerContext, options: Any) -> None:
        super().__init__(ctx, options)
        self.rule = self.strategy(options)
        self.alone: set[str] = set()  # the nodes on their own

    def knows(self, node: str) -> bool:
        return node in self.groups or node in self.alone

    def admit(self, node: str) -> None:
        group = self.rule.group(self.ctx, node)
        if group is None:
            self.alone.add(node)
            return
        self.groups[node] = group
        self.models.setdefault(group, dict(self.ctx.initial))

    def train_task(self, rnd: int, node: str) -> Task:
        return Task("train") if node in self.alone else super().train_task(rnd, node)

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        """The strategy's aggregate of each group's updates; what a node on its own sent is ignored."""
        self.aggregate_groups({n: up for n, up in updates.items() if n not in self.alone}, self.rule.aggregate)

    def eval_task(self, node: str) -> Task:
        return Task("eval") if node in self.alone else super().eval_task(node)

    def state(self) -> tuple[dict[str, Any], dict[str, State]]:
        data, models = super().state()
        return {**data, "alone": sorted(self.alone)}, models

    def restore(self, data: dict[str, Any], models: dict[str, State]) -> None:
        super().restore(data, models)
        self.alone = set(data.get("alone", []))

    def served_model(self) -> State | None:
        return self.models.get(0) if self.rule.serves_one_model else None


class Peered(Method):
    """A strategy run peer to peer: a node learns with the live peers of its group."""

    strategy: ClassVar[type[Strategy]] = Strategy

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "strategy" in cls.__dict__:
            named(cls, "name", "options_type")
            cls.name, cls.options_type = f"{cls.strategy.name}-p2p", cls.strategy.options_type

    def __init__(self, node: PeerContext, options: Any = None) -> None:
        super().__init__(node, options)
        self.rule = self.strategy(options)

    def sources(self, rnd: int) -> set[str]:
        mine = self.rule.group(self.node, self.node.name)
        if mine is None:
            return set()
        return {p for p in self.node.live_peers() if self.rule.group(self.node, p) == mine}

    async def train(self, rnd: int) -> float | None:
        state, loss = await self.rule.train(self.node, None)
        self.node.load_state(state)  # what it trained is what it sends, as a coordinated node does
        return loss

    def aggregate(self, rnd: int, own: ModelIn | None, arrived: dict[str, ModelIn]) -> State | None:
        """The strategy's aggregate of the models that arrived and the node's own (if it sent one)."""
        return group_average(own, arrived, self.rule.aggregate)
