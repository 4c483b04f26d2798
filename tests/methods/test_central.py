"""The task format, its typed instructions and the FedAvg-per-group base every coordinated method builds on."""

from __future__ import annotations

import asyncio
from dataclasses import fields
from typing import Any

import pytest
import torch

from p2pfed.methods import CENTRAL
from p2pfed.methods.central import (
    ClientMethod,
    Instructions,
    ServerMethod,
    Task,
    Update,
    pack,
    participates,
    unpack,
)
from p2pfed.methods.feddsmic import MAMLInstructions
from p2pfed.methods.fedfm import FMInstructions
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
    method.aggregate(0, {"a": Update(vec(1, 1, 1, 1), 10), "b": Update(vec(4, 4, 4, 4), 30)})
    assert torch.allclose(method.models[0]["w"], torch.full((4,), 3.25))
    assert torch.equal(method.models[1]["w"], torch.full((4,), 5.0))
    assert method.train_task(1, "c").models[0] is method.models[1]
    unplaced = method.eval_task("stranger")  # a node never placed chooses among every group's model
    assert isinstance(unplaced, Task) and unplaced.groups == [0, 1] and len(unplaced.models) == 2


def _types() -> set[type[Instructions]]:
    return {(server.client or ClientMethod).instructions for server in CENTRAL.values()}


def test_every_methods_instructions_have_a_bound_for_each_field_and_travel_unchanged() -> None:
    assert {FMInstructions, MAMLInstructions, Instructions} <= _types()
    for kind in _types():
        assert set(kind.SPEC) == {f.name for f in fields(kind)}, kind.__name__
        assert kind.read(kind().wire()) == kind() and kind().wire() == {}  # defaults do not travel
    sent = FMInstructions(penalty=0.5, epochs=3, matching=True, loss="l2", send_model=False)
    assert FMInstructions.read(sent.wire()) == sent
    assert Instructions.read({"penalty": 1}).penalty == 1.0 and isinstance(Instructions.read({"penalty": 1}).penalty,
                                                                            float)


@pytest.mark.parametrize(("meta", "reason"), [
    ({"penalty": 1e300}, r"penalty must be in \[0, 1e\+06\]"),  # a coordinator's number is bounded
    ({"penalty": -1.0}, "penalty must be in"),
    ({"epochs": 10**9}, "epochs must be an integer in"),  # no task keeps a node training for ever
    ({"epochs": 2.5}, "epochs must be an integer"),
    ({"validate": 1}, "validate must be a boolean"),
    ({"matching": True}, "unexpected \\['matching'\\]"),  # another method's instruction
    ({"x" * 100: 1}, "unexpected"),
])
def test_instructions_a_node_does_not_know_or_out_of_bounds_are_refused(meta: dict[str, Any], reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        Instructions.read(meta)


def test_a_method_reads_its_own_instructions_and_refuses_a_value_outside_them() -> None:
    assert FMInstructions.of(Instructions(penalty=0.5)) == FMInstructions(penalty=0.5)  # a base task in process
    kept = MAMLInstructions(maml=True)
    assert MAMLInstructions.of(kept) is kept
    with pytest.raises(WireError, match="loss must be one of cg, l2"):
        FMInstructions.read({"loss": "mse"})
    with pytest.raises(WireError, match="personalise must be an integer in"):
        MAMLInstructions.read({"personalise": 5000})
