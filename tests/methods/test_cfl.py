"""CFL splits a cluster whose members' updates disagree, by their names, and places the rest later."""

from __future__ import annotations

import asyncio

import torch

from p2pfed.methods.central import Update
from p2pfed.methods.cfl import CFLOptions, CFLServer, bipartition
from tests.methods.fake import FakeCoordinator

OPTIONS = CFLOptions(eps1=0.5, eps2=1.0, warmup=0, min_size=2)
E = torch.eye(4)


def train(method: CFLServer, rnd: int, directions: dict[str, torch.Tensor]) -> None:
    """Each named node trains from its cluster's model and moves it by 2·direction."""
    updates = {}
    for node, d in directions.items():
        start = method.train_task(rnd, node).models[0]
        updates[node] = Update({"w": start["w"] + 2 * d}, 10)
    method.aggregate(rnd, updates)


def test_bipartition_returns_names_not_positions_in_the_sub_matrix() -> None:
    names = ["n07", "n02", "n11", "n05"]
    left, right = bipartition(names, [E[0], -E[0], E[0] + 0.1 * E[1], -E[0]])
    assert {frozenset(left), frozenset(right)} == {frozenset({"n07", "n11"}), frozenset({"n02", "n05"})}


def test_a_second_split_moves_the_members_of_the_cluster_it_splits_and_nobody_else() -> None:
    ctx = FakeCoordinator(lambda n, t: None)
    method = CFLServer(ctx, OPTIONS)
    nodes = [f"a{i}" for i in range(8)]
    asyncio.run(method.before_round(0, nodes))
    # round 0: a0-a3 pull one way, a4-a7 the other: the mean is ~0, every update is large → split
    train(method, 0, {n: (E[0] if i < 4 else -E[0]) for i, n in enumerate(nodes)})
    first = method.clusters()
    assert len(set(first.values())) == 2
    assert len({first[n] for n in nodes[:4]}) == 1 and len({first[n] for n in nodes[4:]}) == 1
    # round 1: inside the second cluster, a4, a5 and a6, a7 disagree; the first cluster agrees
    train(method, 1, {**{n: E[2] for n in nodes[:4]}, "a4": E[1], "a5": E[1], "a6": -E[1], "a7": -E[1]})
    second = method.clusters()
    assert {second[n] for n in nodes[:4]} == {first["a0"]}  # the reference code's bug would move a0, a1
    assert second["a4"] == second["a5"] and second["a6"] == second["a7"] and second["a4"] != second["a6"]
    assert len(set(second.values())) == 3 and [s["round"] for s in method.splits] == [0, 1]


def test_members_absent_at_a_split_wait_until_the_halves_differ_then_take_the_best_fit() -> None:
    ctx = FakeCoordinator(lambda n, t: None)
    method = CFLServer(ctx, OPTIONS)
    nodes = [f"a{i}" for i in range(6)]
    asyncio.run(method.before_round(0, nodes))
    train(method, 0, {"a0": E[0], "a1": E[0], "a2": -E[0], "a3": -E[0]})  # a4, a5 did not train
    assert method.clusters()["a4"] == -1 and "a4" in method.pending
    task = method.eval_task("a4")
    assert len(task.models) == 1 and task.groups == []  # both halves are still the parent's copies
    train(method, 1, {"a0": E[0], "a2": -E[0], "a4": E[0]})  # a4's update is not averaged into either half
    task = method.eval_task("a4")
    assert len(task.models) == 2 and sorted(task.groups) == sorted(set(method.groups.values()))
    method.place("a4", task.groups[1])
    assert "a4" not in method.pending and method.clusters()["a4"] == task.groups[1]


def test_no_split_before_the_warm_up_or_while_the_cluster_still_learns() -> None:
    method = CFLServer(FakeCoordinator(lambda n, t: None), CFLOptions(eps1=0.5, eps2=1.0, warmup=3))
    nodes = [f"a{i}" for i in range(4)]
    asyncio.run(method.before_round(0, nodes))
    train(method, 0, {n: (E[0] if i < 2 else -E[0]) for i, n in enumerate(nodes)})
    assert len(set(method.clusters().values())) == 1  # round 0 < warm-up 3
    train(method, 3, {n: E[0] for n in nodes})  # all agree: the mean is large, FedAvg still works for all
    assert len(set(method.clusters().values())) == 1
