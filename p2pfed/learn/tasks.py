"""Learning tasks: what a model's output is scored against, what it predicts, and the metrics a run reports.

Training, evaluation and lazy influence take the task as a parameter instead of assuming class logits, so
a task of another shape (next-token language modelling, the issue "All of paper 002") is one more class
here. Only ``Classification`` exists today: every shipped dataset is labelled images or vectors.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from sklearn.metrics import f1_score
from torch.nn import functional as F


class LearningTask:
    """The interface: a loss (pure tensor code, so lazy influence can vmap it), predictions, metrics."""

    name: ClassVar[str]

    def loss(self, output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        raise NotImplementedError

    def predict(self, output: torch.Tensor) -> torch.Tensor:
        """What the model says for each sample (compared with the targets by metrics)."""
        raise NotImplementedError

    def metrics(self, predicted: np.ndarray, target: np.ndarray) -> tuple[float, float]:
        """(accuracy, macro-F1) of the predictions: the figures every run reports per node and round."""
        raise NotImplementedError


class Classification(LearningTask):
    """One label per sample, the model's output its class logits: cross-entropy, arg-max, accuracy and
    macro-F1 over the labels present (a node's test split may miss classes under label skew)."""

    name = "classification"

    def loss(self, output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(output, target, reduction=reduction)

    def predict(self, output: torch.Tensor) -> torch.Tensor:
        return output.argmax(1)

    def metrics(self, predicted: np.ndarray, target: np.ndarray) -> tuple[float, float]:
        accuracy = float(np.mean(predicted == target))
        f1 = float(f1_score(target, predicted, average="macro", labels=np.unique(target), zero_division=0))
        return accuracy, f1


CLASSIFICATION = Classification()
TASKS: dict[str, LearningTask] = {CLASSIFICATION.name: CLASSIFICATION}
