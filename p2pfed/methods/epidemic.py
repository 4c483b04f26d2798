"""Epidemic Learning (de Vos et al. 2023, EL-Local): each round every node trains on its own data, sends its
model to s other members drawn at random that round, and replaces its model with the plain mean of its own and
every model it received,

    x_i ← (x_i + Σ_{j ∈ S_i} x_j) / (1 + |S_i|),

where S_i, the senders that picked i, changes every round: the randomness, not a fixed topology, mixes the
models. Options, ``[methods.epidemic]``: ``fanout`` (s).

Where the paper is silent:
- Every node draws every node's s recipients from the scenario's seed, the sender's name and the round, among
  the learning members it knows of, so a node knows whose models to wait for with no message (EL-Local lets
  each sender draw its own; the draw is the same, only known to all). A member that died or finished keeps
  its place in the draw (a model drawn for it is not sent), so the draws do not shift in mid-round.
- s = 0 (the default) takes ⌈log₂ N⌉ of the members, our choice: it grows as the mesh does.
- Every node sends and averages every round (EL's rounds have no participation); the scenario's participation
  draw decides only who trains in a round (methods/base.py: ``Exchanging``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from p2pfed.config import ConfigError
from p2pfed.learn.train import weighted_average
from p2pfed.methods.base import Exchanging, shared_rng
from p2pfed.methods.options import MethodOptions
from p2pfed.wire import ModelIn


@dataclass(frozen=True)
class EpidemicOptions(MethodOptions):
    """Epidemic Learning's options, the scenario's [methods.epidemic] table."""

    fanout: int = 0  # s, the members each node sends its model to per round; 0: ⌈log₂ N⌉ of the N members

    def validate(self, where: str) -> None:
        if self.fanout < 0:
            raise ConfigError(f"{where}fanout must be >= 0 (0: log2 of the mesh's size; got {self.fanout})")


def recipients(seed: int, sender: str, rnd: int, members: Sequence[str], fanout: int) -> set[str]:
    """The s members sender sends its model to in round rnd (all others when there are fewer): a draw every
    node computes alike."""
    others = [m for m in members if m != sender]
    s = fanout or math.ceil(math.log2(max(len(members), 2)))
    if s >= len(others):
        return set(others)
    picks = shared_rng(seed, "epidemic", sender, rnd).choice(len(others), size=s, replace=False)
    return {others[int(i)] for i in picks}


@functools.lru_cache(maxsize=64)
def draws(seed: int, rnd: int, members: tuple[str, ...], fanout: int) -> dict[str, frozenset[str]]:
    """Every member's recipients in round rnd, drawn once for a process's nodes alike (a node asks on every
    model it is sent); callers only read it."""
    return {m: frozenset(recipients(seed, m, rnd, members, fanout)) for m in members}


class Epidemic(Exchanging):
    """Train, send to s random members, average what came with the own model, equally weighted."""

    name = "epidemic"
    options_type = EpidemicOptions
    options: EpidemicOptions

    def _draws(self, rnd: int) -> dict[str, frozenset[str]]:
        return draws(self.node.seed, rnd, tuple(self.node.members()), self.options.fanout)

    def subscribers(self, rnd: int) -> set[str]:
        # a model drawn for a dead or finished member is not sent
        return set(self._draws(rnd)[self.node.name] & set(self.node.live_peers()))

    def sources(self, rnd: int) -> set[str]:
        return {m for m, sent in self._draws(rnd).items() if self.node.name in sent}

    def aggregate(self, rnd: int, own: ModelIn | None, arrived: dict[str, ModelIn]) -> dict[str, torch.Tensor] | None:
        if not arrived:
            return None
        states = [arrived[p].state for p in sorted(arrived)] + [self.node.current_state()]
        return weighted_average(states, [1.0] * len(states))
