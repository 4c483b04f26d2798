"""What a node's validation split says about a model, sample by sample, and how sure it is.

Lazy influence (eq. 1 of Rokvic et al. 2025) is a mean over the validation split of one loss difference per
sample. With the 5 to 22 validation samples a node with little data holds, that mean is mostly noise, and the
paper is silent on it. Here every difference is kept, so that a peer is chosen, kept, dropped or added only
when its effect is positive (or negative) beyond its uncertainty: a one-sided paired t-test over the
validation samples, at a documented level (``[methods.pfedlia-p2p] confidence``). Paired, because every
model is scored on the same samples: what varies from sample to sample (a hard digit, an easy one) cancels.

The per-sample losses come from lazy_influence.sample_losses (batched on CUDA as the influence scores are).
A verdict drawn over several rounds (``Window``) first averages each sample's differences over the rounds,
then tests those averages: the rounds' models are scored on the same samples, so samples, not
(sample, round) pairs, are the independent units.

A window also keeps, where it is given them, the differences in errors (a sample misclassified by one model
and not the other), and says the mean of them beside the loss's estimate (``Estimate.accuracy``): a test of
the loss on 5 samples reads a model that is surer of the same answers as better, and that is what a model
trained alone on few samples is, beside an average of models (see PFedLIAP2P.harmful).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Estimate:
    """A mean effect over the validation samples and its one-sided bounds at the level it was tested at:
    ``lower > 0``: it helps beyond its uncertainty; ``upper < 0``: it hurts beyond it."""

    mean: float
    lower: float
    upper: float
    samples: int
    accuracy: float | None = None  # the mean gain in accuracy on the same samples, where errors were kept

    @property
    def helps(self) -> bool:
        return self.lower > 0

    @property
    def hurts(self) -> bool:
        return self.upper < 0


ROUNDING = 1e-5  # relative: loss differences below it are float32 rounding, not evidence


def paired_differences(base: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per-sample base − other, each loss difference within rounding of the losses set to 0: a model that scores
    as another does up to rounding (a free-rider's untouched copy of w0, scored in a batch beside w0 itself) is
    no evidence either way, where its differences of ±1e-8 would look sure of a sign."""
    base, other = np.asarray(base, dtype=np.float64), np.asarray(other, dtype=np.float64)
    d = base - other
    d[np.abs(d) <= ROUNDING * np.maximum(np.abs(base), np.abs(other))] = 0.0
    return d


def estimate(differences: np.ndarray, confidence: float) -> Estimate:
    """The mean of per-sample differences and its one-sided t bounds at confidence (0: the mean alone, the
    bounds equal to it: a point estimate). Fewer than two samples, or a constant difference, say nothing
    beyond the mean when asked for a level above 0: no variance can be estimated from one sample, and a
    constant difference on a handful of samples (all zero) is no proof."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    d = d[np.isfinite(d)]
    if not d.size:
        return Estimate(0.0, -math.inf, math.inf, 0)
    mean = float(d.mean())
    if confidence <= 0:
        return Estimate(mean, mean, mean, int(d.size))
    if d.size < 2:
        return Estimate(mean, -math.inf, math.inf, int(d.size))
    se = float(d.std(ddof=1)) / math.sqrt(d.size)
    if se == 0.0:
        return Estimate(mean, -math.inf, math.inf, int(d.size)) if mean == 0 else Estimate(mean, mean, mean, d.size)
    margin = float(stats.t.ppf(confidence, d.size - 1)) * se
    return Estimate(mean, mean - margin, mean + margin, int(d.size))


class Window:
    """The last ``rounds`` rounds of per-sample differences of one comparison (with a peer, without it), and
    the estimate over them once the window is full."""

    def __init__(self, rounds: int) -> None:
        self.rounds: deque[np.ndarray] = deque(maxlen=rounds)
        self.errors: deque[np.ndarray] = deque(maxlen=rounds)  # each round's error differences, where given

    def add(self, differences: np.ndarray, errors: np.ndarray | None = None) -> None:
        """One round's per-sample loss differences, and error differences (1: only the other model erred
        there; −1: only this one; 0: both or neither) if known (positive: the side the window is for helps)."""
        if errors is not None and len(errors) != len(differences):
            raise ValueError(f"{len(errors)} error differences for {len(differences)} loss differences")
        if self.rounds and len(differences) != len(self.rounds[-1]):
            self.rounds.clear()  # another validation split (cannot happen within a run): start over
            self.errors.clear()
        if errors is None:
            self.errors.clear()  # a window's accuracy is over all of its rounds or none
        self.rounds.append(np.asarray(differences, dtype=np.float64))
        if errors is not None:
            self.errors.append(np.asarray(errors, dtype=np.float64))

    @property
    def full(self) -> bool:
        return len(self.rounds) == self.rounds.maxlen

    def __len__(self) -> int:
        return len(self.rounds)

    def estimate(self, confidence: float) -> Estimate:
        """Each sample's mean difference over the window's rounds, tested over the samples."""
        if not self.rounds:
            return Estimate(0.0, -math.inf, math.inf, 0)
        e = estimate(np.mean(np.stack(list(self.rounds)), axis=0), confidence)
        if len(self.errors) != len(self.rounds):
            return e
        return replace(e, accuracy=float(np.mean(np.stack(list(self.errors)))))
