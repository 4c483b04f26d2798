"""FedProto (prototypes, never models) and FedFomo (weigh downloaded models by how much they help):
their rules, and both end to end over real sockets."""

from __future__ import annotations

import asyncio

import torch
from torch import nn

from p2pfed.methods.central import Instructions, Update
from p2pfed.methods.fedfomo import FedFomoClient, FedFomoOptions, FedFomoServer
from p2pfed.methods.fedproto import FedProtoOptions, FedProtoServer, class_prototypes
from tests.methods.fake import FakeCoordinator, vec


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Identity()
        self.head = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def test_prototypes_are_class_means_of_the_head_input_and_the_global_one_is_count_weighted() -> None:
    x = torch.tensor([[1.0, 0], [3, 0], [0, 2], [0, 4]])
    y = torch.tensor([0, 0, 2, 2])
    protos, counts = class_prototypes(Net(), x, y, 3)
    assert torch.equal(protos, torch.tensor([[2.0, 0], [0, 0], [0, 3]])) and counts.tolist() == [2, 0, 2]
    ctx = FakeCoordinator(lambda n, t: None)
    ctx.initial = {"head.weight": torch.zeros(3, 2), "head.bias": torch.zeros(3)}
    server = FedProtoServer(ctx, FedProtoOptions(lam=0.5))
    assert server.train_task(0, "a").aux == {}  # no prototypes yet
    server.aggregate(0, {"a": Update(None, 4, aux={"protos": protos, "counts": counts}),
                         "b": Update(None, 2, aux={"protos": torch.tensor([[4.0, 0], [1, 1], [0, 0]]),
                                                     "counts": torch.tensor([2.0, 1, 0])}),
                         "bad": Update(None, 2, aux={"protos": torch.zeros(2, 2), "counts": torch.ones(2)})})
    task = server.train_task(1, "a")
    assert torch.allclose(task.aux["protos"], torch.tensor([[3.0, 0], [1, 1], [0, 3]]))
    # nothing but the table: λ is the node's own options, the number of classes its model's
    assert task.aux["have"].tolist() == [1, 1, 1] and task.instructions == Instructions()
    assert set(server.protos) == {"a", "b"} and task.models == []  # models never travel


def test_fedfomo_sends_the_most_useful_models_and_learns_affinities() -> None:
    server = FedFomoServer(FakeCoordinator(lambda n, t: None), FedFomoOptions(m=2, epsilon=0.0))
    asyncio.run(server.before_round(0, ["a", "b", "c", "d"]))
    assert server.train_task(0, "a").models == []  # nobody has sent a model yet
    server.aggregate(0, {n: Update(vec(i, 0, 0, 0), 10) for i, n in enumerate("abcd")})
    task = server.train_task(1, "a")
    assert task.names == ["b", "c"] and len(task.models) == 2
    server.aggregate(1, {"a": Update(vec(9, 0, 0, 0), 10, aux={"weights": torch.tensor([0.0, 1.0])})})
    assert server.affinity["a"] == {"b": 0.0, "c": 1.0}
    assert server.train_task(2, "a").names == ["c", "b"]  # c helped: it comes first now


class FakeNode:
    """A ClientContext with a validation loss that is the distance to a target model."""

    def __init__(self, own: nn.Module, target: torch.Tensor) -> None:
        self.own, self.target = own, target
        self.name = "n"

    async def val_loss(self, module: nn.Module) -> float:
        return float((module.weight.detach().flatten() - self.target).norm())

    def new_model(self, state: dict) -> nn.Module:
        m = nn.Linear(2, 1, bias=False)
        m.load_state_dict(state)
        return m

    async def fit(self, module: nn.Module, *args: object, **kw: object) -> float:
        return 0.0


def test_fedfomo_moves_toward_models_that_help_and_ignores_those_that_hurt() -> None:
    own = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        own.weight.copy_(torch.tensor([[0.0, 0.0]]))
    node = FakeNode(own, target=torch.tensor([1.0, 0.0]))
    helps, hurts = {"weight": torch.tensor([[1.0, 0.0]])}, {"weight": torch.tensor([[-1.0, 0.0]])}
    from p2pfed.methods.central import Task
    update, _ = asyncio.run(FedFomoClient(node).train(Task("train", [helps, hurts], names=["x", "y"])))  # type: ignore[arg-type]
    assert update.aux["weights"].tolist() == [1.0, 0.0]
    assert torch.allclose(own.weight, torch.tensor([[1.0, 0.0]]))  # θ_i + 1·(θ_x − θ_i)
