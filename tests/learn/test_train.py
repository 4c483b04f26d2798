"""Local training and FedAvg: seeded training, the distance penalty (FedProx's μ, FeSEM's λ), sample weights."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from p2pfed.learn.train import distance_penalty, evaluate, state_of, train_epochs, weighted_average


def test_a_larger_penalty_keeps_the_trained_model_closer_to_its_start() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 5, generator=gen), torch.randint(0, 3, (64,), generator=gen)
    distances = []
    for coef in (0.0, 0.5, 5.0):  # lr·coef < 2, or the penalty itself diverges
        torch.manual_seed(0)
        model = nn.Linear(5, 3)
        start = state_of(model)
        penalty = distance_penalty(start, coef, torch.device("cpu")) if coef else None
        train_epochs(model, x, y, epochs=5, batch_size=16, lr=0.1, seed=1, device=torch.device("cpu"),
                     penalty=penalty)
        end = state_of(model)
        distances.append(sum(float((end[k] - start[k]).norm() ** 2) for k in start))
    assert distances[0] > distances[1] > distances[2] > 0
    model = nn.Linear(5, 3)
    anchor = {k: v + 1.0 for k, v in state_of(model).items()}
    assert float(distance_penalty(anchor, 2.0, torch.device("cpu"))(model).detach()) == 18.0  # 2/2 · (15 + 3) · 1²


def test_fedavg_weights_each_model_by_its_sample_count() -> None:
    states = [{"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(3)},
              {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(5)}]
    avg = weighted_average(states, [10.0, 30.0])
    assert torch.allclose(avg["w"], torch.tensor([3.25, 6.0]))  # (10·1 + 30·4) / 40, (30·8) / 40
    assert avg["n"].item() == 3 and avg["n"].dtype == torch.int64  # integer buffers: the first model's
    half = {"w": torch.tensor([1.0, 2.0], dtype=torch.float16)}
    assert weighted_average([half, half], [1.0, 3.0])["w"].dtype == torch.float16
    for bad in ([], [0.0, 0.0]):
        with pytest.raises(ValueError, match="nothing to average"):
            weighted_average(states if bad else [], bad)


def test_training_is_seeded_and_the_loss_is_the_last_epochs_mean() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 5, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(0)
        model = nn.Linear(5, 3)
        loss = train_epochs(model, x, y, epochs=3, batch_size=8, lr=0.1, seed=seed, device=torch.device("cpu"))
        runs.append((loss, state_of(model)["weight"]))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])  # the same seed, the same model
    assert not torch.equal(runs[0][1], runs[2][1])  # another shuffle, another model
    ev = evaluate(model, x, y, torch.device("cpu"))
    assert ev.samples == 40 and 0 <= ev.accuracy <= 1 and math.isclose(
        ev.loss, float(torch.nn.functional.cross_entropy(model(x), y).detach()), rel_tol=1e-5)
    assert math.isnan(train_epochs(model, x[:0], y[:0], epochs=1, batch_size=8, lr=0.1, seed=0,
                                   device=torch.device("cpu")))
