"""What both node kinds share: a node with its data, its model, its device and its records.

A learning node (learner.py, peer to peer) and a node under a coordinator (client.py) differ in who steers
their rounds; the data they train on (given by their launcher: NodeData), the seeded model they start from, a
scripted member's poisoned data, the copy of a model trained on a batch and the look at the validation split
are the same, and live here once.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from p2pfed.learn.checkpoint import SUFFIX
from p2pfed.learn.datasets import Dataset
from p2pfed.learn.export import CARD, ModelCard
from p2pfed.learn.models import build_model
from p2pfed.learn.train import (
    Evaluation,
    distance_penalty,
    evaluate,
    pick_device,
    round_seed,
    state_of,
    train_copy,
    train_epochs,
)
from p2pfed.net.endpoint import Endpoint
from p2pfed.net.progress import Progress
from p2pfed.node.conduct import Conduct
from p2pfed.report.records import append_record
from p2pfed.scenario.config import Scenario

T = TypeVar("T")
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class LocalData:
    """The tensors of one node's shard."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def samples(self) -> int:
        return len(self.y_train)


@dataclass(frozen=True)
class NodeData:
    """What a node is given to learn from, by its launcher: its splits, what they are, and the number its
    training is seeded with. A scenario's node gets its shard of the scenario's dataset (launch/runner.py:
    scenario_node); a node with its own data (``p2pfed node --data``) gets that data, split on its machine."""

    name: str
    index: int  # the number its training is seeded with: its index in a scenario, a hash of its name with own data
    splits: LocalData
    # what its data is: the input shape, the classes, the task and the inputs' standardisation (its model card's)
    dataset: Dataset
    # every node's true cluster, where a scenario knows them (to report); none with own data (nobody knows them)
    true_clusters: Mapping[str, int] = dataclasses.field(default_factory=dict)


class LocalNode:
    """A node with its data (as its conduct has it: honest, or a scripted member's), its model from the
    scenario's seeded weights (the same on every node: the shared initial model averaging needs), its device
    and task, its metrics file and its checkpoint's path. The scenario is its settings (training, model,
    seed); its data is what it was given (NodeData), whether a scenario's shard or its own."""

    def __init__(self, scenario: Scenario, given: NodeData, method: str | None, endpoint: Endpoint, out_dir: Path,
                 state_dir: Path | None = None, *, conduct: Conduct | None = None) -> None:
        self.scenario = scenario
        self.index = given.index
        self.name = given.name
        dataset = given.dataset
        self.endpoint = endpoint
        self.method_name = method
        self.seed = scenario.seed
        self.cfg = scenario.train
        self.device = pick_device(self.cfg.device)
        self.task = dataset.task
        # how it treats its peers: honestly, unless its launcher scripted otherwise (node/conduct.py)
        self.conduct = conduct or Conduct()
        self.data = self.conduct.data(given.splits, dataset.num_classes)
        self.true_clusters = dict(given.true_clusters)
        self.model = build_model(self.cfg.model, dataset.input_shape, dataset.num_classes, seed=scenario.seed)
        self.reference = state_of(self.model)
        self.metrics_path = out_dir / f"{self.name}.jsonl"
        self.checkpoint_path = (state_dir or out_dir) / f"{self.name}{SUFFIX}"
        self.card = ModelCard.of(self.cfg.model, dataset, scenario.data.class_names, node=self.name,
                                 method=method or "")
        self.progress = Progress(method or "")
        endpoint.serve(progress=self.progress.body)  # its status tells its curve and choice (p2pfed dashboard)

    @property
    def round(self) -> int:
        """The round this node is in: what its records carry and what its endpoint advertises to its peers
        (kept once, by the endpoint)."""
        return self.endpoint.round

    @round.setter
    def round(self, rnd: int) -> None:
        self.endpoint.round = rnd

    def current_state(self) -> dict[str, torch.Tensor]:
        """A snapshot of the node's model."""
        return state_of(self.model)

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the node's model's weights."""
        self.model.load_state_dict(state)

    def true_cluster_of(self, name: str) -> int:
        """A node's true cluster in the scenario's partition, -1 if unknown (a node with its own data knows none)."""
        return self.true_clusters.get(name, -1)

    @property
    def samples(self) -> int:
        """The node's training samples: the weight of its model in an average."""
        return self.data.samples

    # -- what every method may use of its node (methods/base.py: NodeContext) -------------------
    async def pick(self, candidates: list[dict[str, torch.Tensor]]) -> int:
        """Index of the candidate with the lowest loss on this node's training data."""
        def losses() -> list[float]:
            out = []
            for state in candidates:
                self.model.load_state_dict(state)
                out.append(evaluate(self.model, self.data.x_train, self.data.y_train, self.device, task=self.task).loss)
            return out

        values = await asyncio.to_thread(losses)
        return min(range(len(values)), key=lambda i: values[i])

    async def train_local(self, start: dict[str, torch.Tensor] | None, penalty_coef: float = 0.0,
                          epochs: int | None = None) -> tuple[dict[str, torch.Tensor], float]:
        """Train from start (None: the node's own model) for the scenario's epochs; return state and loss."""
        if start is not None:
            self.model.load_state_dict(start)
        penalty = distance_penalty(start, penalty_coef, self.device) if start is not None and penalty_coef else None
        loss = await self.fit(self.model, penalty, epochs)
        return state_of(self.model), loss

    def new_model(self, state: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """A fresh model of the scenario's architecture, with state if given."""
        model = copy.deepcopy(self.model)
        if state is not None:
            model.load_state_dict(state)
        return model

    async def fit(self, module: nn.Module, penalty: Callable[[nn.Module], torch.Tensor] | None = None,
                  epochs: int | None = None, loss_fn: LossFn | None = None) -> float:
        """Train any module on this node's training data with the scenario's settings (its local steps τ, or
        epochs; epochs a method asks for, such as a warm-up, are epochs); return the loss."""
        return await asyncio.to_thread(
            train_epochs, module, self.data.x_train, self.data.y_train, epochs=epochs or self.cfg.epochs,
            batch_size=self.cfg.batch_size, lr=self.cfg.lr, momentum=self.cfg.momentum,
            weight_decay=self.cfg.weight_decay, steps=0 if epochs else self.cfg.steps,
            seed=self.round_seed, device=self.device, penalty=penalty, loss_fn=loss_fn, task=self.task)

    @property
    def round_seed(self) -> int:
        """The seed of this node's local training in this round (the same on a rerun)."""
        return round_seed(self.scenario.seed, self.index, self.round)

    @property
    def own(self) -> nn.Module:
        """This node's own model (what methods that personalise the node's model keep across rounds)."""
        return self.model

    async def val_loss(self, module: nn.Module) -> float:
        """Loss of any module on this node's validation split."""
        return (await self._evaluate_on(module, self.data.x_val, self.data.y_val)).loss

    async def run_on_train(self, fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> Any:
        """fn(x_train, y_train) in a worker thread (e.g. per-class statistics of the node's data)."""
        return await asyncio.to_thread(fn, self.data.x_train, self.data.y_train)

    async def train_loss(self, module: nn.Module) -> float:
        """Loss of any module on this node's training data."""
        return (await self._evaluate_on(module, self.data.x_train, self.data.y_train)).loss

    async def test(self, module: nn.Module) -> Evaluation:
        """Test metrics of any module on this node's test shard."""
        return await self._evaluate_on(module, self.data.x_test, self.data.y_test)

    async def evaluate_state(self, state: dict[str, torch.Tensor] | None) -> Evaluation:
        """Test metrics of state (None: the node's own model), which becomes the node's model."""
        if state is not None:
            self.model.load_state_dict(state)
        return await self._evaluate_on(self.model, self.data.x_test, self.data.y_test)

    async def _evaluate_on(self, module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Evaluation:
        return await asyncio.to_thread(evaluate, module, x, y, self.device, task=self.task)

    async def train_copy(self, start: dict[str, torch.Tensor], samples: int, epochs: int, lr: float
                         ) -> dict[str, torch.Tensor]:
        """A copy of start trained on the first samples of this node's shard (already shuffled); the node's
        model is left as it is. Seeded by the scenario's seed and the node's index: the same copy after a
        restart. (Through the node's conduct: a scripted member's may be start, untrained.)"""
        n = min(samples, self.data.samples)
        return await self.conduct.copy(start, lambda: asyncio.to_thread(
            train_copy, self.model, start, self.data.x_train[:n], self.data.y_train[:n], epochs=epochs,
            batch_size=self.cfg.batch_size, lr=lr, seed=self.scenario.seed + self.index, device=self.device,
            task=self.task))

    async def on_validation(self, judge: Callable[..., T]) -> T:
        """judge(model, x_val, y_val, device, task) run in a worker thread: a method's look at how models do
        on this node's validation split (which never leaves the node)."""
        return await asyncio.to_thread(judge, self.model, self.data.x_val, self.data.y_val, self.device, self.task)

    def card_metadata(self, rnd: int) -> dict[str, str]:
        """The model card a checkpoint of round rnd carries, so `p2pfed export` needs nothing but the file."""
        return {CARD: dataclasses.replace(self.card, round=rnd, method=self.method_name or "",
                                          recipe=self.endpoint.recipe).to_json()}

    def record(self, event: str, **fields: Any) -> None:
        append_record(self.metrics_path, event, self.name, self.method_name, self.round, **fields)
        self.progress.note(event, self.round, fields, self.method_name)
