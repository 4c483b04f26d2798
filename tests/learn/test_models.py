"""The models' own layers: MaxPool2 is nn.MaxPool2d(2), value for value and gradient for gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from p2pfed.learn.models import MaxPool2, build_model


@pytest.mark.parametrize("shape", [(5, 3, 28, 28), (2, 4, 7, 9), (1, 1, 2, 2), (4, 28, 28)])
def test_the_fast_pool_gives_max_pool2d_s_values_nan_included(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape).relu()  # after a ReLU, as in the models: many tied zeros
    x.view(-1)[::7] = float("nan")
    x.view(-1)[::11] = float("inf")
    with torch.no_grad():
        assert torch.equal(MaxPool2()(x).nan_to_num(7.0), nn.MaxPool2d(2)(x).nan_to_num(7.0))
        assert MaxPool2()(x).shape == nn.MaxPool2d(2)(x).shape


def test_an_input_too_small_for_a_window_is_refused_as_max_pool2d_refuses_it() -> None:
    with torch.no_grad(), pytest.raises(RuntimeError, match="Output size is too small"):
        MaxPool2()(torch.ones(3, 2, 1, 5))


def test_training_takes_max_pool2d_s_own_gradient_ties_included() -> None:
    # torch.maximum splits a tie's gradient in halves; max_pool2d gives it to the first of the tied
    x = torch.tensor([[[[1.0, 1.0], [0.5, 1.0]]]], requires_grad=True)
    y = torch.tensor([[[[1.0, 1.0], [0.5, 1.0]]]], requires_grad=True)
    MaxPool2()(x).sum().backward()
    nn.MaxPool2d(2)(y).sum().backward()
    assert x.grad is not None and torch.equal(x.grad, y.grad)
    assert x.grad.flatten().tolist() == [1.0, 0.0, 0.0, 0.0]


def test_a_model_scores_the_same_with_the_fast_pool_as_with_max_pool2d() -> None:
    model = build_model("cnn", (1, 28, 28), 10, seed=3).eval()
    x = torch.randn(64, 1, 28, 28)
    with torch.no_grad():
        fast = model(x)
        for i, layer in enumerate(model.features):
            if isinstance(layer, MaxPool2):
                model.features[i] = nn.MaxPool2d(2)
        assert torch.equal(fast, model(x))
