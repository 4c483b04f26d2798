"""The learning-task layer: classification as before, and training, evaluation and lazy influence going
through whatever task they are given (nothing outside learn/tasks.py assumes class logits)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from p2pfed.influence.lazy_influence import score_peers, score_peers_one_by_one
from p2pfed.learn.datasets import load_digits
from p2pfed.learn.tasks import CLASSIFICATION, TASKS, LearningTask
from p2pfed.learn.train import evaluate, one_step, state_of, train_copy, train_epochs

CPU = torch.device("cpu")


class Regression(LearningTask):
    """A task of another shape: one real number per sample, squared error, 'accurate' within 0.5."""

    name = "regression"

    def loss(self, output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.mse_loss(output.squeeze(1), target, reduction=reduction)

    def predict(self, output: torch.Tensor) -> torch.Tensor:
        return output.squeeze(1)

    def metrics(self, predicted: np.ndarray, target: np.ndarray) -> tuple[float, float]:
        return float(np.mean(np.abs(predicted - target) < 0.5)), float("nan")


def line(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen)
    return x, x @ torch.tensor([2.0, -1.0, 0.5])


def test_classification_is_cross_entropy_arg_max_accuracy_and_macro_f1_over_the_labels_present() -> None:
    logits = torch.tensor([[2.0, 0.1, 0.0], [0.0, 3.0, 0.2], [0.1, 0.0, 1.0], [1.0, 0.0, 0.0]])
    target = torch.tensor([0, 1, 1, 0])
    assert torch.equal(CLASSIFICATION.loss(logits, target), F.cross_entropy(logits, target))
    assert torch.equal(CLASSIFICATION.loss(logits, target, "sum"), F.cross_entropy(logits, target, reduction="sum"))
    predicted = CLASSIFICATION.predict(logits)
    assert predicted.tolist() == [0, 1, 2, 0]
    accuracy, f1 = CLASSIFICATION.metrics(predicted.numpy(), target.numpy())
    assert accuracy == 0.75
    assert math.isclose(f1, (1.0 + 2 / 3) / 2)  # labels 0 and 1 only: class 2 is absent from the target
    assert TASKS["classification"] is CLASSIFICATION and load_digits().task is CLASSIFICATION


def test_training_and_evaluation_go_through_the_task_they_are_given() -> None:
    task = Regression()
    x, y = line()
    model = nn.Linear(3, 1)
    before = evaluate(model, x, y, CPU, task=task)
    loss = train_epochs(model, x, y, epochs=30, batch_size=16, lr=0.05, seed=0, device=CPU, task=task)
    after = evaluate(model, x, y, CPU, task=task)
    assert after.loss < 0.01 < before.loss and math.isclose(loss, after.loss, abs_tol=0.01)
    assert after.accuracy == 1.0 and math.isnan(after.macro_f1) and after.samples == 64
    with torch.no_grad():
        expected = F.mse_loss(model(x).squeeze(1), y).item()
    assert math.isclose(after.loss, expected, rel_tol=1e-5)
    stepped = nn.Linear(3, 1)
    start = state_of(stepped)
    one_step(stepped, x, y, lr=0.1, batch_size=8, seed=0, device=CPU, task=task)
    assert not torch.equal(state_of(stepped)["weight"], start["weight"])


def test_lazy_influence_scores_with_the_tasks_loss() -> None:
    task = Regression()
    x, y = line(seed=1)
    x_val, y_val = line(32, seed=2)
    model = nn.Linear(3, 1)
    w0 = state_of(model)
    helpful = train_copy(model, w0, x, y, epochs=20, batch_size=16, lr=0.05, seed=0, device=CPU, task=task)
    harmful = train_copy(model, w0, x, -y, epochs=20, batch_size=16, lr=0.05, seed=0, device=CPU, task=task)
    one_by_one = score_peers_one_by_one(model, w0, [helpful, harmful], x_val, y_val, CPU, task)
    batched = score_peers(model, w0, [helpful, harmful], x_val, y_val, CPU, batched=True, task=task)
    assert one_by_one[0] > 0 > one_by_one[1]  # eq. 1: loss(w0) − loss(partial), here squared errors
    assert np.allclose(batched, one_by_one, rtol=1e-4)
    with torch.no_grad():
        model.load_state_dict(w0)
        base = F.mse_loss(model(x_val).squeeze(1), y_val).item()
        model.load_state_dict(helpful)
        assert math.isclose(one_by_one[0], base - F.mse_loss(model(x_val).squeeze(1), y_val).item(), rel_tol=1e-4)
