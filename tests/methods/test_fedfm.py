"""FedFM (Ye et al. 2023): the matching losses, anchor aggregation (weighted and uniform), FedFM-Lite's
model-every-a-rounds schedule (a node's own model kept between model rounds), and the three forms end to
end over real sockets."""

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
    return Update(None, 1, aux={"anchors": torch.tensor(a), "counts": torch.tensor(c)})


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
    assert asked == [] and not server.train_task(0, "a").instructions.wire()  # FedAvg before T_s
    asyncio.run(server.before_round(1, ["a"]))
    assert asked == ["compute"] and server.train_task(1, "a").aux["have"].tolist() == [1, 1, 0]
    assert server.train_task(1, "a").models == [] and len(server.train_task(1, "b").models) == 1  # a holds it
    lite = FedFMLiteServer(fedfm_ctx(), FedFMLiteOptions(start=2, every=3))
    lite.aggregate(3, {"a": Update(None, 5, aux={"anchors": ANCHORS, "counts": torch.tensor([1.0, 1, 0])})})
    assert lite.anchors is not None and torch.equal(lite.global_model["head.weight"], torch.zeros(3, 2))
    lite.aggregate(4, {"a": Update(vec(1, 1, 1, 1) | {"head.weight": torch.ones(3, 2), "head.bias": torch.ones(3)},
                                   5, {})})
    assert torch.equal(lite.global_model["head.weight"], torch.ones(3, 2))


def model(value: float) -> dict[str, torch.Tensor]:
    return {"head.weight": torch.full((3, 2), value), "head.bias": torch.full((3,), value)}


def test_fedfm_lite_nodes_keep_training_their_own_model_between_model_rounds() -> None:
    lite = FedFMLiteServer(fedfm_ctx(), FedFMLiteOptions(start=2, every=3))
    down, up = [], []
    for rnd in range(2, 10):  # node a takes part in every round; b only in round 7
        nodes = ["a", "b"] if rnd == 7 else ["a"]
        tasks = {n: lite.train_task(rnd, n) for n in nodes}
        down.append(len(tasks["a"].models))
        up.append(int(tasks["a"].instructions.send_model))
        if rnd == 7:
            assert len(tasks["b"].models) == 1  # b has not trained from the current global model: it gets it
        lite.aggregate(rnd, {n: Update(model(rnd) if t.instructions.send_model else None, 5) for n, t in tasks.items()})
    # Models go up in rounds T_s, T_s + a, ... (a node sends the model it kept training), and the new global
    # model comes down once, in the round after it changed; in the rounds between, a node trains its own.
    assert up == [1, 0, 0, 1, 0, 0, 1, 0]
    assert down == [1, 1, 0, 0, 1, 0, 0, 1]
    restored = FedFMLiteServer(fedfm_ctx(), FedFMLiteOptions(start=2, every=3))
    restored.restore(*lite.state())
    assert (restored.version, restored.held) == (lite.version, lite.held) == (3, {"a": 3, "b": 2})
    assert restored.train_task(10, "a").models == [] and len(restored.train_task(10, "c").models) == 1
