"""FedDSMIC (Li et al. 2022): KL clustering on indicator samples, first-order MAML, one-step personalisation;
and both FedDSMIC and FedDS end to end over real sockets."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from torch import nn

from p2pfed.config import ConfigError
from p2pfed.learn.held import ServerData
from p2pfed.learn.tasks import CLASSIFICATION
from p2pfed.learn.train import maml_first_order, one_step, state_of, train_epochs
from p2pfed.methods.central import Update
from p2pfed.methods.feddsmic import FedDSMICOptions, FedDSMICServer, MAMLInstructions, kl_to_centers
from tests.methods.fake import FakeCoordinator

CPU = torch.device("cpu")


def test_kl_picks_the_center_that_predicts_like_the_node() -> None:
    node = torch.tensor([[0.9, 0.1], [0.8, 0.2]])
    centers = torch.stack([torch.tensor([[0.1, 0.9], [0.2, 0.8]]), torch.tensor([[0.85, 0.15], [0.8, 0.2]])])
    d = kl_to_centers(node, centers)
    assert int(d.argmin()) == 1 and float(d[1]) >= 0 and float(kl_to_centers(node, node[None])[0]) == 0.0


def test_first_order_maml_is_sgd_when_the_inner_step_is_zero_and_differs_otherwise() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 4, generator=gen), torch.randint(0, 3, (32,), generator=gen)
    torch.manual_seed(0)
    start = state_of(nn.Linear(4, 3))
    runs = {}
    for name, inner in [("sgd", None), ("maml0", 0.0), ("maml", 0.5)]:
        model = nn.Linear(4, 3)
        model.load_state_dict(start)
        if inner is None:
            train_epochs(model, x, y, epochs=2, batch_size=8, lr=0.1, seed=3, device=CPU)
        else:
            maml_first_order(model, x, y, epochs=2, batch_size=8, inner_lr=inner, outer_lr=0.1, seed=3, device=CPU)
        runs[name] = state_of(model)
    assert all(torch.allclose(runs["sgd"][k], runs["maml0"][k], atol=1e-6) for k in start)
    assert not torch.allclose(runs["sgd"]["weight"], runs["maml"]["weight"])
    model = nn.Linear(4, 3)
    model.load_state_dict(start)
    one_step(model, x, y, lr=0.1, batch_size=8, seed=1, device=CPU)
    assert not torch.allclose(state_of(model)["weight"], start["weight"])


class LinearCoordinator(FakeCoordinator):
    """A fake coordinator whose models are a 4-in, 3-class linear layer, with indicator samples."""

    def __init__(self) -> None:
        super().__init__(lambda n, t: None, clusters=2)
        self.initial = self.build(0)

    def build(self, seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return state_of(nn.Linear(4, 3))

    def module(self, state: dict[str, torch.Tensor]) -> nn.Module:
        m = nn.Linear(4, 3)
        m.load_state_dict(state)
        return m

    @property
    def data(self) -> ServerData:  # 3 classes of 10 random inputs
        x = torch.randn(30, 4, generator=torch.Generator().manual_seed(1))
        return ServerData((4,), 3, CLASSIFICATION, x, np.arange(30) % 3, seed=0, set_aside=True)


def test_random_initial_centers_place_each_node_by_kl_after_it_trains_its_own_first_model() -> None:
    ctx = LinearCoordinator()
    server = FedDSMICServer(ctx, FedDSMICOptions(init="random"))
    assert sorted(server.models) == [0, 1] and not torch.equal(server.models[0]["weight"], server.models[1]["weight"])
    asyncio.run(server.before_round(0, ["a", "b"]))
    assert ctx.asked == []  # no k-means round: the centers are there
    task = server.train_task(0, "a")
    assert len(task.candidates) == 1 and torch.equal(task.candidates[0]["weight"], ctx.initial["weight"])
    near = {g: {k: v + 0.01 for k, v in server.models[g].items()} for g in (0, 1)}  # a model like center g's
    server.aggregate(0, {"a": Update(near[1], 5), "b": Update(near[0], 5)})
    assert server.groups == {"a": 1, "b": 0}  # Eq. 6-7 against the random centers
    assert torch.equal(server.models[1]["weight"], near[1]["weight"])  # Eq. 17: the mean of its members
    assert len(server.train_task(1, "a").candidates) == 1 and server.train_task(1, "a").groups == [1]
    server.admit("late")  # after the first placement, a node is a newcomer (§4.3), with warm-up epochs
    assert server.train_task(1, "late").instructions == MAMLInstructions(epochs=5)
    with pytest.raises(ConfigError, match="init must be kmeans or random"):
        FedDSMICOptions(init="paper").validate("")
