"""FeSEM: k-means over the first local models, then E-step by distance and M-step means each round."""

from __future__ import annotations

import asyncio

import pytest
import torch

from p2pfed.config import ConfigError
from p2pfed.methods.central import Task, Update, participates
from p2pfed.methods.fesem import FeSEMOptions, FeSEMServer
from tests.methods.fake import FakeCoordinator, vec

FIRST = {"n0": vec(1, 1, 0, 0), "n1": vec(1.2, 0.9, 0, 0), "n2": vec(0.9, 1.1, 0, 0),
         "n3": vec(-1, -1, 0, 0), "n4": vec(-1.1, -0.8, 0, 0), "n5": vec(-0.9, -1.2, 0, 0)}


def first_local_models(node: str, task: Task) -> Update:
    assert task.kind == "train" and torch.equal(task.models[0]["w"], torch.zeros(4))  # from the shared start
    return Update(FIRST[node], 10)


def test_initial_centers_by_kmeans_then_nodes_move_to_the_nearest_center() -> None:
    ctx = FakeCoordinator(first_local_models, clusters=2)
    method = FeSEMServer(ctx, FeSEMOptions(penalty=0.05))
    asyncio.run(method.before_round(0, sorted(FIRST)))
    groups = method.clusters()
    assert groups["n0"] == groups["n1"] == groups["n2"] != groups["n3"] == groups["n4"] == groups["n5"]
    a, b = groups["n0"], groups["n3"]
    assert torch.allclose(method.models[a]["w"], torch.tensor([1.0333, 1.0, 0, 0]), atol=1e-3)  # Eq. 9: plain mean
    task = method.train_task(1, "n0")
    assert task.models[0] is method.models[a] and task.instructions.penalty == 0.1  # λ·||W − W̃||² = (2λ)/2·||·||²
    # n0's new local model lands next to the other center: the E-step moves it, the M-step follows
    method.aggregate(1, {"n0": Update(vec(-1, -1, 0, 0), 10)})
    assert method.clusters()["n0"] == b
    assert torch.allclose(method.models[a]["w"], torch.tensor([1.05, 1.0, 0, 0]), atol=1e-3)
    assert torch.allclose(method.models[b]["w"], torch.tensor([-1.0, -1.0, 0, 0]), atol=1e-3)
    assert ctx.asked.count(("n0", "train")) == 1  # the initial round asked everyone once


def test_a_node_that_joins_later_chooses_the_center_that_fits_it_until_it_has_a_local_model() -> None:
    ctx = FakeCoordinator(first_local_models, clusters=2)
    method = FeSEMServer(ctx, FeSEMOptions())
    asyncio.run(method.before_round(0, sorted(FIRST)))
    asyncio.run(method.before_round(1, [*sorted(FIRST), "late"]))
    task = method.train_task(1, "late")
    assert len(task.models) == 2 and sorted(task.groups) == [0, 1]
    state, data = method.state()[1], method.state()[0]
    again = FeSEMServer(ctx, FeSEMOptions())
    again.restore(data, state)
    assert again.clusters() == method.clusters() and set(again.local) == set(FIRST)


def test_fesem_trains_the_scenarios_share_of_nodes_unless_its_own_participation_says_every_node() -> None:
    ctx = FakeCoordinator(first_local_models, clusters=2)
    ctx.fraction = 0.3
    live = [f"n{i}" for i in range(40)]
    scenario_share = FeSEMServer(ctx, FeSEMOptions())
    drawn = [len(scenario_share.participants(rnd, live)) for rnd in range(5)]
    assert all(4 <= d <= 20 for d in drawn)  # ~12 of 40 by the shared hash, as every other method trains
    assert scenario_share.participants(3, live) == [n for n in live if participates(0, n, 3, 0.3)]
    paper = FeSEMServer(ctx, FeSEMOptions(participation=1.0))  # Long et al. 2023: every client, every round
    assert all(paper.participants(rnd, live) == live for rnd in range(5))
    half = FeSEMServer(ctx, FeSEMOptions(participation=0.5))
    assert half.participants(2, live) == [n for n in live if participates(0, n, 2, 0.5)]
    with pytest.raises(ConfigError, match=r"participation must be in \[0, 1\]"):
        FeSEMOptions(participation=1.5).validate("methods.fesem.")
