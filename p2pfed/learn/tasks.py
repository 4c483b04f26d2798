"""Learning tasks: what a model's output is scored against, what it predicts, and the metrics a run reports.

Training, evaluation and lazy influence take the task as a parameter instead of assuming class logits.
``Classification``: labelled images or vectors. ``NextToken``: next-token language modelling (the motivating
experiment of Rokvic et al. 2025), one target per position of a sequence, the padding left out of loss and
metrics.
Lazy influence needs nothing else: it scores a peer by the drop in the task's validation loss ("applicable
to any task with a well-defined loss").
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

    def scored(self, target: torch.Tensor) -> torch.Tensor:
        """Which of the flat targets a loss scores (a mask): every sample; for sequences, every token but padding."""
        return torch.ones(target.numel(), dtype=torch.bool, device=target.device)

    def unit_losses(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss of each scored unit, flat: what the mean loss averages (a sample; a token of a sequence)."""
        return self.loss(output, target, reduction="none").reshape(-1)[self.scored(target)]

    def metrics(self, predicted: np.ndarray, target: np.ndarray) -> tuple[float, float]:
        """(accuracy, macro-F1) of the predictions: the figures every run reports per node and round."""
        raise NotImplementedError

    def count(self, target: torch.Tensor) -> int:
        """How many targets a summed loss over target adds up (its mean divides by this): one per sample."""
        return len(target)


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


PAD = -100  # a target position that is padding: no loss, no metric (cross-entropy's ignore_index)


class NextToken(LearningTask):
    """Next-token prediction: the model's output is (batch, positions, vocabulary) logits, the target the
    next token at each position (PAD past a sequence's end). Loss: mean cross-entropy per token (its exp is
    the perplexity); accuracy: the share of positions whose next token is the arg-max; macro-F1 over the
    tokens present."""

    name = "next-token"

    def loss(self, output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, -2), target.flatten(), ignore_index=PAD, reduction=reduction)

    def scored(self, target: torch.Tensor) -> torch.Tensor:
        return target.flatten() != PAD

    def predict(self, output: torch.Tensor) -> torch.Tensor:
        return output.argmax(-1)

    def metrics(self, predicted: np.ndarray, target: np.ndarray) -> tuple[float, float]:
        scored = target != PAD
        predicted, target = predicted[scored], target[scored]
        if not target.size:
            return float("nan"), float("nan")
        accuracy = float(np.mean(predicted == target))
        f1 = float(f1_score(target, predicted, average="macro", labels=np.unique(target), zero_division=0))
        return accuracy, f1

    def count(self, target: torch.Tensor) -> int:
        return int((target != PAD).sum())


CLASSIFICATION = Classification()
NEXT_TOKEN = NextToken()
TASKS: dict[str, LearningTask] = {task.name: task for task in (CLASSIFICATION, NEXT_TOKEN)}
