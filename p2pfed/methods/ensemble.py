"""FedAvg+ and FedProx+, the "Ensemble FL" baselines of CAM (Ma et al. 2023): "We train FedAvg and FedProx K
times and then learn an ensemble model via soft voting to serve all clients". Named ``fedavg-ensemble`` and
``fedprox-ensemble`` here: a method's name also names its mesh, whose names allow letters, digits, '-', '_'
and '.' only (wire/messages.py), and a TOML table key has no '+' unquoted.

K global models travel together. Each round every participant gets all K, trains each of them from its
current state (FedProx+: with the proximal term μ/2·||w − w_k||² to the member it started from) and sends
all K back; the coordinator averages each member separately over the participants, by sample count, as
FedAvg does. Every node is evaluated with the soft vote of the K members: the mean of their softmax
outputs, the class with the highest mean probability (the loss reported is the cross-entropy of that
mean probability).

Choices where the paper is silent:
- The K runs share the participant sampling: one draw a round (the shared hash every method uses, so all
  methods train the same nodes in the same rounds), and a participant trains all K members. K separate
  runs would each draw their own; sharing it keeps the comparison with every other method's rounds, and
  the members still differ, by their start (below).
- Member k starts from the initial model of a run seeded seed + k: member 0 is the FedAvg (FedProx) run of
  the scenario itself. A node trains every member with its own local training of the round (node.fit: the
  scenario's epochs or steps τ, its shuffles), so the members differ by their start, as IFCA's K models do;
  K separate runs would also shuffle differently, which would take a second way to train past node.fit.
- The cost is K runs' cost, in the same rounds: K models per participant each way (bytes_sent shows it)
  and K times the local training. Rounds are not divided by K.
- "Learn an ensemble via soft voting": equal weights, nothing learned; the ensemble is the K current
  global models, so every evaluation round (not only the last) reports it.
- K (``k``) defaults to the partition's number of clusters, as the paper's tables set K (and as the
  other methods with K models take it); a partition without clusters needs ``k``.
- A node keeps no model of its own under this method: it trains copies, and its own model is left as it was.
- An update that does not hold K models is left out whole, so the K members move on the same participants.

Options: ``[methods.fedavg-ensemble]`` ``k``; ``[methods.fedprox-ensemble]`` ``k`` and ``mu`` (FedProx's).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from p2pfed.learn.train import Evaluation, distance_penalty, state_of, weighted_average
from p2pfed.methods.baselines import FedAvgServer
from p2pfed.methods.central import ClientMethod, ServerContext, Task, Update
from p2pfed.methods.fedprox import FedProxOptions, ProxTasks
from p2pfed.methods.options import ClusteredOptions
from p2pfed.wire import WireError

log = logging.getLogger(__name__)


class SoftVote(nn.Module):
    """The ensemble of members: log of the mean of their softmax outputs over the last dimension (classes, or
    a sequence's vocabulary), so arg-max is the soft vote and cross-entropy the loss of the mean probability."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_probs = torch.stack([F.log_softmax(m(x), dim=-1) for m in self.members])
        return torch.logsumexp(log_probs, dim=0) - math.log(len(self.members))


def members_of(task: Task, method: str) -> list[dict[str, torch.Tensor]]:
    """The K member models of a task (all of them shared, none a candidate); WireError if there are none."""
    if not task.models or task.shared != len(task.models):
        raise WireError(f"{method}: a task carries the K ensemble members, all shared (got {len(task.models)} "
                        f"models, {task.shared} shared)")
    return task.models


class EnsembleClient(ClientMethod):
    """Train each member from the state it came with, by the node's own local training; evaluate their soft
    vote."""

    async def train(self, task: Task) -> tuple[Update, int]:
        members = members_of(task, "ensemble")
        coef = task.instructions.penalty  # FedProx+'s μ, to the member's own start
        trained, losses = [], []
        for start in members:
            model = self.node.new_model(start)
            losses.append(await self.node.fit(model, distance_penalty(start, coef, self.node.device) if coef else None))
            trained.append(state_of(model))
        loss = sum(losses) / len(losses)
        return Update(trained[0], train_loss=loss, extra=trained[1:]), 0

    async def evaluate(self, task: Task) -> tuple[Evaluation, int]:
        members = members_of(task, "ensemble")
        return await self.node.test(SoftVote([self.node.new_model(s) for s in members])), 0


@dataclass(frozen=True)
class EnsembleOptions(ClusteredOptions):
    """FedAvg+'s options, the scenario's [methods.fedavg-ensemble] table: K, the number of runs."""



@dataclass(frozen=True)
class FedProxEnsembleOptions(EnsembleOptions, FedProxOptions):
    """FedProx+'s options, the scenario's [methods.fedprox-ensemble] table: K and FedProx's μ."""


    def validate(self, where: str) -> None:
        EnsembleOptions.validate(self, where)
        FedProxOptions.validate(self, where)


class FedAvgEnsembleServer(FedAvgServer):
    """FedAvg+: K FedAvg runs side by side (members 0..K-1 in ``models``), evaluated by their soft vote."""

    name = "fedavg-ensemble"
    options_type: type[EnsembleOptions] = EnsembleOptions
    options: EnsembleOptions
    client = EnsembleClient

    def __init__(self, ctx: ServerContext, options: Any) -> None:
        super().__init__(ctx, options)
        k = int(self.options.k or ctx.clusters_hint)
        self.models = {m: dict(ctx.initial) if m == 0 else ctx.build(ctx.seed + m) for m in range(k)}

    def admit(self, node: str) -> None:
        self.groups[node] = -1  # every node is served by the one ensemble

    def _members(self) -> list[dict[str, torch.Tensor]]:
        return [self.models[m] for m in sorted(self.models)]

    def train_task(self, rnd: int, node: str) -> Task:
        members = self._members()
        return Task("train", members, shared=len(members))

    def eval_task(self, node: str) -> Task:
        members = self._members()
        return Task("eval", members, shared=len(members))

    def aggregate(self, rnd: int, updates: dict[str, Update]) -> None:
        """Each member: the sample-weighted mean of the participants' copies of it."""
        k = len(self.models)
        full: list[tuple[list[dict[str, torch.Tensor]], float]] = []
        for node, up in updates.items():
            if up.state is None or len(up.extra) != k - 1:
                log.warning("%s: round %d: %s sent %d models, not the %d members; left out", self.name, rnd, node,
                            len(up.extra) + (up.state is not None), k)
                continue
            full.append(([up.state, *up.extra], float(up.samples)))
        if not full:
            return
        weights = [n for _, n in full]
        for m, member in enumerate(sorted(self.models)):
            self.models[member] = weighted_average([states[m] for states, _ in full], weights)

    def clusters(self) -> dict[str, int]:
        return {}

    def served_model(self) -> dict[str, torch.Tensor] | None:
        return None  # what it serves is the soft vote of K models, not one model a server could test alone


class FedProxEnsembleServer(ProxTasks, FedAvgEnsembleServer):
    """FedProx+: FedAvg+ whose train tasks carry FedProx's μ (to each of the K members' own start)."""

    name = "fedprox-ensemble"
    options_type = FedProxEnsembleOptions
    options: FedProxEnsembleOptions
