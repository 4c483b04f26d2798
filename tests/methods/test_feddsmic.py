"""FedDSMIC (paper 000): KL clustering on indicator samples, first-order MAML, one-step personalisation;
and both FedDSMIC and FedDS end to end over real sockets."""

from __future__ import annotations

import torch
from torch import nn

from p2pfed.learn.train import maml_first_order, one_step, state_of, train_epochs
from p2pfed.methods.feddsmic import kl_to_centers

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
