"""Scripted adversaries (a scenario's ``[[adversaries]]``): nodes that poison their data or their models,
so a scenario measures what each method does against them (a method that scores its peers on its own
validation data gives a peer whose model raises its validation loss a negative score, and leaves it out).
Each is a conduct (node/conduct.py) the launcher hands the node it scripts; the node's code knows none.

- ``label-flip``: trains on flipped labels (y → C − 1 − y): data poisoning with well-formed models;
- ``noise-model``: every model it sends (round models, a method's own kinds, what it keeps for peers, a
  coordinated method's updates) is Gaussian noise with each tensor's own scale: model poisoning;
- ``free-rider``: trains nothing and sends back the models it was given, untouched (each method's node side
  says which those are, ``ClientMethod.given_back``: a coordinated task's chosen model and shared ones, or the
  node's own model where a method trains that): it takes without contributing. What it sends besides models
  (a method's statistics: control variates, anchors, prototypes) is left as the method computed it: the
  free-rider lies about its work, not about its data.

An adversary is an ordinary member in every other respect (it follows the protocol); its own accuracy is
not counted with the honest nodes'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

import torch

from p2pfed.methods.base import NodeContext
from p2pfed.methods.central import ClientMethod, Task, Update
from p2pfed.node.conduct import Conduct, State
from p2pfed.node.local import LocalData
from p2pfed.scenario.config import Scenario

T = TypeVar("T")


def flip_labels(y: torch.Tensor, classes: int) -> torch.Tensor:
    """Labels mapped y → classes − 1 − y (every sample mislabelled when classes is even)."""
    return (classes - 1) - y


def noise_like(state: State, seed: int) -> State:
    """A model of Gaussian noise: each floating tensor replaced by N(0, s²), s its own standard deviation
    (a poisoned model a naive average cannot tell from a real one by its scale); other tensors kept."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        if t.is_floating_point() and t.numel():
            scale = float(t.float().std()) if t.numel() > 1 else float(t.float().abs().max())
            out[name] = (torch.randn(t.shape, generator=gen) * max(scale, 1e-3)).to(t.dtype)
        else:
            out[name] = t.clone()
    return out


class LabelFlip(Conduct):
    """Trains and validates on flipped labels; everything else honest."""

    def data(self, data: LocalData, classes: int) -> LocalData:
        return dataclasses.replace(data, y_train=flip_labels(data.y_train, classes),
                                   y_val=flip_labels(data.y_val, classes))


class NoiseModel(Conduct):
    """Every model that leaves it is noise, seeded by its round."""

    def outgoing(self, state: State, seed: int) -> State:
        return noise_like(state, seed)

    async def answer(self, node: NodeContext, client: ClientMethod, task: Task) -> tuple[Update, int]:
        update, choice = await client.train(task)
        if update.state is None:
            return update, choice
        return dataclasses.replace(update, state=self.outgoing(update.state, node.round_seed),
                                   extra=[self.outgoing(m, node.round_seed + 1) for m in update.extra]), choice


class FreeRider(Conduct):
    """Trains nothing it sends: its round's training is skipped, a copy for a peer is the model it was given,
    and a coordinator's train task is answered with the models the task gave it (the node keeps nothing of the
    training its method did)."""

    async def train(self, work: Callable[[], Awaitable[T]]) -> T | None:
        return None

    async def copy(self, start: State, work: Callable[[], Awaitable[State]]) -> State:
        return {k: v.clone() for k, v in start.items()}

    async def answer(self, node: NodeContext, client: ClientMethod, task: Task) -> tuple[Update, int]:
        before = node.current_state()
        update, choice = await client.train(task)
        if update.state is None:  # a method that keeps models local sends none back: nothing to fake
            return update, choice
        given = client.given_back(task, choice, before)  # each model back as it came
        node.load_state(before)  # and it keeps nothing of the training it pretends to have done
        return dataclasses.replace(update, state=given[0], extra=given[1:]), choice


KINDS: dict[str, type[Conduct]] = {"label-flip": LabelFlip, "noise-model": NoiseModel, "free-rider": FreeRider}


def conduct_of(scenario: Scenario, index: int) -> Conduct | None:
    """The conduct of a scenario's node index: its scripted adversary's, None for an honest node."""
    kind = scenario.adversary_of(index)
    return KINDS[kind]() if kind is not None else None
