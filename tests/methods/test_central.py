"""The task format and the FedAvg-per-group base every coordinated method builds on."""

from __future__ import annotations

import asyncio

import pytest
import torch

from p2pfed.methods.central import ServerMethod, Task, Update, pack, participates, unpack
from p2pfed.wire import WireError
from tests.methods.fake import FakeCoordinator, vec


def test_packed_models_come_back_checked_against_the_local_model() -> None:
    ref = {"a": torch.zeros(2), "b": torch.zeros(3)}
    models = [{"a": torch.ones(2), "b": torch.ones(3)}, {"a": torch.zeros(2), "b": torch.full((3,), 2.0)}]
    back = unpack(pack(models), ref)
    assert len(back) == 2 and torch.equal(back[1]["b"], models[1]["b"])
    assert unpack({}, ref) == []
    with pytest.raises(WireError, match="index"):
        unpack({"a": torch.ones(2)}, ref)
    with pytest.raises(WireError, match="numbered"):
        unpack({f"1/{k}": v for k, v in models[0].items()}, ref)
    with pytest.raises(WireError, match="local model"):
        unpack({"0/a": torch.ones(2)}, ref)  # a model with a parameter missing


def test_participation_is_the_fraction_and_the_same_everywhere() -> None:
    drawn = [participates(7, f"n{i:02d}", r, 0.1) for i in range(100) for r in range(50)]
    assert 0.08 < sum(drawn) / len(drawn) < 0.12
    assert drawn == [participates(7, f"n{i:02d}", r, 0.1) for i in range(100) for r in range(50)]


def test_groups_average_their_own_updates_by_samples_and_untouched_groups_keep_their_model() -> None:
    ctx = FakeCoordinator(lambda n, t: None)
    method = ServerMethod(ctx, None)
    asyncio.run(method.before_round(0, ["a", "b", "c"]))
    method.models[1] = vec(5, 5, 5, 5)
    method.place("c", 1)
    method.aggregate(0, {"a": Update(vec(1, 1, 1, 1), 10, {}), "b": Update(vec(4, 4, 4, 4), 30, {})})
    assert torch.allclose(method.models[0]["w"], torch.full((4,), 3.25))
    assert torch.equal(method.models[1]["w"], torch.full((4,), 5.0))
    assert method.train_task(1, "c").models[0] is method.models[1]
    unplaced = method.eval_task("stranger")  # a node never placed chooses among every group's model
    assert isinstance(unplaced, Task) and unplaced.groups == [0, 1] and len(unplaced.models) == 2
