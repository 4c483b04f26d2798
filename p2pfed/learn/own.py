"""A node's own private data (``p2pfed node --data PATH``): read from the machine's disk, split there into
training, validation and test samples, and checked against what the mesh's recipe trains. Nothing of it
ever leaves the node; only models do.

Formats: an ``.npz`` of ``x`` (N, ...) and ``y`` (N,); an ImageFolder (one sub-folder of images per class,
named by its class number, 0 to classes-1, or by a name of the recipe's data.class_names, so that every
machine numbers classes alike whatever classes it lacks); a CSV of feature columns and a label column (for a
model of images, a row's C·H·W values fill a sample row by row, as an image flattened by NumPy does); for
next-token prediction, a text file whose words (whitespace-separated) are the samples, spelt with the
recipe's vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from p2pfed.learn.datasets import MAX_WORD, Dataset, normalised
from p2pfed.learn.files import OwnDataError, read_own
from p2pfed.learn.tasks import NEXT_TOKEN
from p2pfed.learn.text import encode_words, read_text, sample_length, sequences_of

# The input shape and class count of the named datasets, so that a recipe naming one (data.dataset) fixes what
# every member's own data must look like without loading that dataset here.
KNOWN_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "digits": ((1, 8, 8), 10), "synthetic": ((1, 4, 4), 10), "fmnist": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10), "emnist": ((1, 28, 28), 47), "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
}
MIN_SAMPLES = 10  # fewer cannot give a training, a validation and a test sample each a fair share


@dataclass(frozen=True)
class Split:
    """Fractions of a node's own samples held out for validation and for testing (the rest trains)."""

    val: float = 0.2
    test: float = 0.2

    def check(self) -> None:
        if not (0 < self.val < 1 and 0 < self.test < 1 and self.val + self.test < 1):
            raise OwnDataError(f"validation ({self.val}) and test ({self.test}) fractions must each be in (0, 1) "
                               "and leave samples to train on")


def load_own_text(path: Path, vocabulary: str, split: Split, seed: int, words_per_sample: int = 1
                  ) -> tuple[Dataset, np.ndarray, np.ndarray, np.ndarray]:
    """This node's words (or sequences of words_per_sample words) at path for next-token prediction, in the
    recipe's vocabulary (samples spelt with other letters are left out, and named if that is most of them),
    split as load_own_data splits."""
    split.check()
    if not path.is_file() or path.suffix not in (".txt", ""):
        raise OwnDataError(f"{path}: own text must be a text file (.txt) of words")
    what = "words" if words_per_sample <= 1 else f"sequences of {words_per_sample} words"
    try:
        words = sequences_of(read_text(path), words_per_sample, MAX_WORD, seed)
    except (OSError, ValueError) as exc:
        raise OwnDataError(f"{path}: {exc}") from None
    letters = set(vocabulary)
    usable = [w for w in words if set(w) <= letters]
    if len(usable) < max(MIN_SAMPLES, len(words) // 2):
        strange = sorted({c for w in words for c in w} - letters)[:20]
        raise OwnDataError(f"{path}: {len(usable)} of {len(words)} {what} (of words of at most {MAX_WORD} letters) "
                           f"are spelt with the recipe's vocabulary; letters it lacks: {''.join(strange)!r} "
                           f"(data.vocabulary; at least {MIN_SAMPLES} needed)")
    x, y = encode_words(usable, vocabulary, sample_length(words_per_sample, MAX_WORD))
    trainval, test, n_train = _split(len(usable), split, seed, path)
    dataset = Dataset(path.stem, x[trainval], y[trainval], x[test], y[test], len(vocabulary), NEXT_TOKEN,
                      vocabulary=vocabulary)
    return dataset, *_positions(n_train, len(trainval), len(test))


def expected_shape(dataset: str, input_shape: list[int], classes: int) -> tuple[tuple[int, ...], int]:
    """What the recipe's model takes: data.input_shape and data.classes when given, else those of the dataset
    it names."""
    if input_shape and classes:
        return tuple(input_shape), classes
    if dataset not in KNOWN_SHAPES:
        raise OwnDataError(f"the recipe's data.dataset {dataset!r} does not say what own data looks like: set "
                           "data.input_shape (e.g. [1, 28, 28], or [12] for 12 features) and data.classes")
    shape, known = KNOWN_SHAPES[dataset]
    return (tuple(input_shape) if input_shape else shape), (classes or known)


def load_own_data(path: Path, shape: tuple[int, ...], classes: int, split: Split, seed: int,
                  class_names: list[str] | None = None) -> tuple[Dataset, np.ndarray, np.ndarray, np.ndarray]:
    """This node's data at path, checked against the recipe's input shape and class count, standardised with
    its own training statistics, and split (seeded) into training, validation and test samples. Returns the
    dataset (x_train holding training and validation samples) and the three index arrays."""
    split.check()
    x, y, pixel_max = read_own(path, shape[0] if len(shape) == 3 else 3, class_names)
    if x.dim() == len(shape) and len(shape) == 3 and shape[0] == 1:
        x = x.unsqueeze(1)  # grey images stored without their channel axis: (N, H, W)
    elif x.dim() == 2 and len(shape) > 1:  # flat rows (a CSV's columns) for a model of images: one row a sample
        size = math.prod(shape)
        if x.shape[1] != size:
            what = "feature columns" if path.suffix == ".csv" else "values"
            order = "C, H, W in order" if len(shape) == 3 else "the last axis fastest"
            raise OwnDataError(f"{path}: rows of {x.shape[1]} {what}, but the recipe's model takes samples of shape "
                               f"{shape}, {size} values a row ({order}) (data.input_shape, or that of the recipe's "
                               "data.dataset)")
        x = x.reshape(len(x), *shape)  # row-major: a row holds channel 0's pixels row by row, then channel 1's...
    if tuple(x.shape[1:]) != shape:
        raise OwnDataError(f"{path}: samples of shape {tuple(x.shape[1:])}, but the recipe's model takes {shape} "
                           "(data.input_shape, or that of the recipe's data.dataset)")
    if len(y) != len(x):
        raise OwnDataError(f"{path}: {len(x)} samples but {len(y)} labels")
    if len(y) < MIN_SAMPLES:
        raise OwnDataError(f"{path}: {len(y)} samples; a node needs at least {MIN_SAMPLES} to train, validate and "
                           "test")
    if int(y.min()) < 0 or int(y.max()) >= classes:
        raise OwnDataError(f"{path}: labels run from {int(y.min())} to {int(y.max())}, but the recipe has {classes} "
                           f"classes (0 to {classes - 1}, data.classes)")
    if not torch.isfinite(x).all():
        raise OwnDataError(f"{path}: some samples hold NaN or infinite values")
    trainval, test, n_train = _split(len(y), split, seed, path)
    dataset = normalised(path.stem, x[trainval], y[trainval], x[test], y[test], classes, pixel_max=pixel_max,
                         stats_of=n_train)
    return dataset, *_positions(n_train, len(trainval), len(test))


def _split(n: int, split: Split, seed: int, path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """n samples shuffled (seeded) into training then validation samples, and test samples; and how many train."""
    perm = np.random.default_rng(seed).permutation(n)
    n_test, n_val = max(1, round(split.test * n)), max(1, round(split.val * n))
    n_train = n - n_test - n_val
    if n_train < 1:
        raise OwnDataError(f"{path}: {n} samples leave none to train on after {n_val} for validation and "
                           f"{n_test} for testing (data.val_fraction, data.test_fraction)")
    return np.concatenate([perm[n_test + n_val:], perm[n_test:n_test + n_val]]), perm[:n_test], n_train


def _positions(n_train: int, n_trainval: int, n_test: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the training, validation and test samples are in the dataset's splits (train first in x_train)."""
    return np.arange(n_train), np.arange(n_train, n_trainval), np.arange(n_test)

