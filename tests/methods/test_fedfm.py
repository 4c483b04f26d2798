"""FedFM (paper 004): the matching losses, anchor aggregation (weighted and uniform), FedFM-Lite's
model-every-a-rounds schedule, and the three forms end to end over real sockets."""

from __future__ import annotations

import asyncio

import torch

from p2pfed.methods.central import Task, Update
from p2pfed.methods.fedfm import FedFMLiteOptions, FedFMLiteServer, FedFMOptions, FedFMServer, matching_loss
from tests.methods.fake import FakeCoordinator, vec

ANCHORS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
HAVE = torch.tensor([True, True, False])


def test_contrastive_guiding_prefers_the_own_anchor_and_l2_measures_the_distance() -> None:
    y = torch.tensor([0, 1])
    right = torch.tensor([[2.0, 0.0], [0.0, 3.0]])  # on their anchors (after normalising)
    wrong = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    for kind in ("cg", "l2"):
        near, far = (float(matching_loss(f, y, ANCHORS, HAVE, kind, 0.1)) for f in (right, wrong))
        assert near < far
    assert float(matching_loss(right, y, ANCHORS, HAVE, "l2", 0.1)) == 0.0
    # a class without an anchor adds nothing
    assert float(matching_loss(right, torch.tensor([2, 2]), ANCHORS, HAVE, "cg", 0.1)) == 0.0


def test_matching_uses_anchor_directions_and_skips_features_with_no_direction() -> None:
    y = torch.tensor([0, 1])
    short = ANCHORS * 0.3  # means of normalised features are shorter than 1: only their direction counts
    right = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    assert float(matching_loss(right, y, short, HAVE, "l2", 0.1)) == 0.0
    feats = torch.tensor([[0.0, 0.0], [0.0, 3.0]], requires_grad=True)  # the first: every ReLU off
    for kind in ("cg", "l2"):
        loss = matching_loss(feats, y, ANCHORS, HAVE, kind, 0.1)
        (grad,) = torch.autograd.grad(loss, feats)
        assert torch.isfinite(loss) and torch.isfinite(grad).all() and float(grad[0].abs().sum()) == 0.0


def fedfm_ctx() -> FakeCoordinator:
    ctx = FakeCoordinator(lambda n, t: None)
    ctx.initial = {"head.weight": torch.zeros(3, 2), "head.bias": torch.zeros(3)}
    return ctx


def anchors_update(a: list[list[float]], c: list[float]) -> Update:
    return Update(None, 1, {}, aux={"anchors": torch.tensor(a), "counts": torch.tensor(c)})


def test_global_anchors_are_count_weighted_or_uniform() -> None:
    ups = {"a": anchors_update([[1, 0], [0, 0], [0, 0]], [3, 0, 0]),
           "b": anchors_update([[0, 1], [0, 1], [0, 0]], [1, 2, 0])}
    weighted = FedFMServer(fedfm_ctx(), FedFMOptions())
    weighted.aggregate_anchors(ups)
    assert weighted.anchors is not None and weighted.have is not None
    assert torch.allclose(weighted.anchors[0], torch.tensor([0.75, 0.25])) and weighted.have.tolist() == [1, 1, 0]
    uniform = FedFMServer(fedfm_ctx(), FedFMOptions(uniform=True))
    uniform.aggregate_anchors(ups)
    assert uniform.anchors is not None and torch.allclose(uniform.anchors[0], torch.tensor([0.5, 0.5]))


def test_fedfm_asks_for_anchors_before_training_and_lite_sends_models_every_a_rounds() -> None:
    asked: list[str] = []

    def answer(node: str, task: Task) -> Update:
        asked.append(task.kind)
        return anchors_update([[1, 0], [0, 1], [0, 0]], [1, 1, 0])

    ctx = fedfm_ctx()
    ctx.answer = answer
    server = FedFMServer(ctx, FedFMOptions(start=1))
    asyncio.run(server.before_round(0, ["a"]))
    assert asked == [] and "fm" not in server.train_task(0, "a").meta  # FedAvg before T_s
    asyncio.run(server.before_round(1, ["a"]))
    assert asked == ["compute"] and server.train_task(1, "a").aux["have"].tolist() == [1, 1, 0]
    assert server.train_task(1, "a").models == [] and len(server.train_task(1, "b").models) == 1  # a holds it
    lite = FedFMLiteServer(fedfm_ctx(), FedFMLiteOptions(start=2, every=3))
    plan = [len(lite.train_task(r, "a").models) for r in range(2, 9)]
    assert plan == [1, 0, 0, 1, 0, 0, 1]  # the model travels in rounds T_s, T_s + a, ...
    lite.aggregate(3, {"a": Update(None, 5, {}, aux={"anchors": ANCHORS, "counts": torch.tensor([1.0, 1, 0])})})
    assert lite.anchors is not None and torch.equal(lite.global_model["head.weight"], torch.zeros(3, 2))
    lite.aggregate(4, {"a": Update(vec(1, 1, 1, 1) | {"head.weight": torch.ones(3, 2), "head.bias": torch.ones(3)},
                                   5, {})})
    assert torch.equal(lite.global_model["head.weight"], torch.ones(3, 2))
