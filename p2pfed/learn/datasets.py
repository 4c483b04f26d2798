"""Datasets as in-memory tensors: images (N, C, H, W) float32 in [0, 1] normalised, labels int64; or, for
next-token prediction, character sequences (N, T) int64 with their next tokens (learn/text.py).

scikit-learn's bundled digits needs no download and is the embedded default. Fashion-MNIST is looked up
in a local root first (Debian's ``dataset-fashion-mnist`` installs it under
/usr/share/datasets/fashion-mnist), then torchvision's download. ``scandinavian`` is words of bokmål,
nynorsk, Swedish and Danish from Debian's word lists (wnorwegian, wswedish, wdanish); ``words:DIR`` the
words of each text file in DIR, a file per group. A node's own data is an .npz with x and y, or an
ImageFolder.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from p2pfed.learn.files import read_own
from p2pfed.learn.tasks import CLASSIFICATION, NEXT_TOKEN, TASKS, LearningTask
from p2pfed.learn.text import SCANDINAVIAN, load_words

log = logging.getLogger(__name__)

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_ROOT = Path.home() / ".cache" / "p2pfed" / "data"


class DatasetUnavailable(FileNotFoundError):
    """A dataset is not on this machine and could not be fetched; the message says how to get it."""


@dataclass
class Dataset:
    """A train and a test split, with the class count, a display name and the task its labels are for."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int  # classes, or the vocabulary's size for next-token prediction
    task: LearningTask = field(default=CLASSIFICATION)
    # each sample's group (a text's language), where the partition deals groups rather than labels
    groups_train: np.ndarray | None = None
    groups_test: np.ndarray | None = None
    vocabulary: str = ""
    # the per-channel standardisation applied to the inputs (None: inputs as loaded), which an exported model
    # applies to what it is asked to predict
    input_mean: torch.Tensor | None = None
    input_std: torch.Tensor | None = None
    pixel_max: float = 0.0  # a white pixel in the raw inputs' units (255, or 16 for digits); 0: not images
    mapped_from: Path | None = None  # the folder its arrays are memory-mapped from (share), None: in memory

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, e.g. (1, 28, 28), or (T,) for sequences."""
        return tuple(self.x_train.shape[1:])

    @functools.cached_property
    def input_range(self) -> list[float]:
        """[lowest, highest] value of the training inputs in raw units (undoing the standardisation), what a model
        card tells; [] for text, whose inputs are token numbers. Computed once (the inputs are not changed after
        loading): every node of a process writes a card, and a pass over Fashion-MNIST's 47 million values took
        40 ms a node."""
        x = self.x_train
        if self.task.name == NEXT_TOKEN.name or not x.numel():
            return []
        # per input element over the samples, then undone: a sample's worth of memory, not the dataset's again
        low, high = x.amin(dim=0).float(), x.amax(dim=0).float()
        if self.input_mean is not None and self.input_std is not None:  # std > 0: the order is kept
            low, high = low * self.input_std + self.input_mean, high * self.input_std + self.input_mean
        lo, hi = float(low.min()), float(high.max())
        # float error of the round trip (16.000002 for digits' 16) cut at a millionth of the span, for the reader
        digits = 6 - math.floor(math.log10(hi - lo)) if hi > lo else 6
        return [round(lo, digits) + 0.0, round(hi, digits) + 0.0]  # + 0.0: no -0.0

    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        """What a partition deals out over the nodes, train and test: the labels, or the groups where the
        samples have them (each cluster of a pathological partition then holds its own languages)."""
        if self.groups_train is not None and self.groups_test is not None:
            return self.groups_train, self.groups_test
        return self.y_train.numpy(), self.y_test.numpy()


def normalised(name: str, x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor,
               y_test: torch.Tensor, classes: int, scale: float = 1.0, pixel_max: float | None = None,
               stats_of: int | None = None) -> Dataset:
    """A Dataset of inputs standardised per channel with the training samples' statistics (the usual
    torchvision transform; the first stats_of samples of x_train when the rest are held out for validation).
    It records them for an exported model in the units of the raw inputs, which the loader divided by scale
    first (digits' 0-16 pixels by 16), so a model is asked about raw data; pixel_max is a white pixel in those
    units (default scale; 0 for inputs that are not images)."""
    dims = [0, 2, 3] if x_train.dim() == 4 else [0]
    fit = x_train[:stats_of] if stats_of is not None else x_train
    mean = fit.mean(dim=dims, keepdim=True)
    std = fit.std(dim=dims, keepdim=True).nan_to_num(1.0).clamp_min(1e-6)
    return Dataset(name, (x_train - mean) / std, y_train, (x_test - mean) / std, y_test, classes,
                   input_mean=mean[0] * scale, input_std=std[0] * scale,
                   pixel_max=scale if pixel_max is None else pixel_max)


def load_digits(seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes), split 75/25 stratified by label."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    data = sk_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=0.25, random_state=seed, stratify=y)
    return normalised("digits", x[idx_train], y[idx_train], x[idx_test], y[idx_test], 10, scale=16.0)


def load_synthetic(seed: int = 0, num_classes: int = 10, per_class: int = 120, dim: int = 16) -> Dataset:
    """Gaussian blobs, one per class, as 1x4x4 'images': learnable in a second, for tests."""
    gen = torch.Generator().manual_seed(seed)
    side = int(dim**0.5)
    centers = torch.randn(num_classes, dim, generator=gen) * 2.0
    xs, ys = [], []
    for c in range(num_classes):
        xs.append(centers[c] + torch.randn(per_class, dim, generator=gen))
        ys.append(torch.full((per_class,), c, dtype=torch.int64))
    x = torch.cat(xs).reshape(-1, 1, side, side)
    y = torch.cat(ys)
    perm = torch.randperm(len(y), generator=gen)
    x, y = x[perm], y[perm]
    cut = int(0.75 * len(y))
    return Dataset("synthetic", x[:cut], y[:cut], x[cut:], y[cut:], num_classes)


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find_idx(root: Path, stem: str) -> Path | None:
    for candidate in [*root.rglob(f"{stem}"), *root.rglob(f"{stem}.gz")]:
        return candidate
    return None


def _load_mnist_like(name: str, root: Path | None) -> Dataset:
    import torchvision

    classes = {"fmnist": 10, "mnist": 10, "emnist": 47}[name]
    roots = [r for r in [root, DEBIAN_FMNIST if name == "fmnist" else None, DEFAULT_ROOT] if r is not None]
    for r in roots:
        files = [_find_idx(r, f"{split}-{kind}-idx{n}-ubyte") if r.exists() else None
                 for split, kind, n in [("train", "images", 3), ("train", "labels", 1),
                                        ("t10k", "images", 3), ("t10k", "labels", 1)]]
        if all(files) and (name == "fmnist" or name in str(files[0]).lower()):
            xtr, ytr, xte, yte = (_read_idx(f) for f in files if f is not None)
            log.info("%s from %s", name, r)
            return _from_arrays(name, xtr, ytr, xte, yte, classes)
    cls = {"fmnist": torchvision.datasets.FashionMNIST, "mnist": torchvision.datasets.MNIST}.get(name)
    target = root or DEFAULT_ROOT
    try:
        if name == "emnist":
            train = torchvision.datasets.EMNIST(str(target), split="balanced", train=True, download=True)
            test = torchvision.datasets.EMNIST(str(target), split="balanced", train=False, download=True)
        else:
            assert cls is not None
            train = cls(str(target), train=True, download=True)
            test = cls(str(target), train=False, download=True)
    except Exception as exc:
        hint = " or: apt-get install dataset-fashion-mnist" if name == "fmnist" else ""
        raise DatasetUnavailable(
            f"{name} is not in {', '.join(map(str, roots))} and could not be downloaded ({exc}). "
            f"Put the idx files under one of those folders{hint}, or pass data.root"
        ) from None
    return _from_arrays(name, train.data.numpy(), train.targets.numpy(), test.data.numpy(),
                        test.targets.numpy(), classes)


def _from_arrays(name: str, xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray,
                 classes: int) -> Dataset:
    x_train = torch.tensor(xtr, dtype=torch.float32).unsqueeze(1) / 255.0
    x_test = torch.tensor(xte, dtype=torch.float32).unsqueeze(1) / 255.0
    return normalised(name, x_train, torch.tensor(ytr, dtype=torch.int64), x_test,
                       torch.tensor(yte, dtype=torch.int64), classes, scale=255.0)


CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}  # as torchvision unpacks them


def _load_cifar(name: str, root: Path | None) -> Dataset:
    import torchvision

    cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    target = root or DEFAULT_ROOT
    try:
        train = cls(str(target), train=True, download=not (target / CIFAR_FOLDERS[name]).exists())
        test = cls(str(target), train=False, download=False)
    except Exception as exc:
        raise DatasetUnavailable(f"{name} not found under {target} and could not be downloaded ({exc}); "
                                 "download it with torchvision on a connected machine and pass data.root") from None
    xtr = torch.tensor(train.data, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0
    xte = torch.tensor(test.data, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0
    classes = 10 if name == "cifar10" else 100
    return normalised(name, xtr, torch.tensor(train.targets), xte, torch.tensor(test.targets), classes,
                       scale=255.0)


def load_own(path: Path, seed: int = 0) -> Dataset:
    """Own data as a scenario's dataset (data.dataset = a path: learn/own.py's formats), split 75/25."""
    x, y, pixel_max = read_own(path)
    if x.dim() == 3:
        x = x.unsqueeze(1)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.75 * len(y))
    return normalised(path.stem, x[perm[:cut]], y[perm[:cut]], x[perm[cut:]], y[perm[cut:]], int(y.max()) + 1,
                      pixel_max=pixel_max)


WORDS_PER_GROUP = 6000  # words drawn from each language's list: ~1100 training words per node of 4 per language
MAX_WORD = 16  # longer words are left out (a few percent of each list): shorter sequences, faster training


def load_text(name: str, files: dict[str, Path], seed: int, words_per_sample: int = 1) -> Dataset:
    """Words (or sequences of words_per_sample words) per group (learn/text.py), 75% of each group's for training
    and 25% for testing."""
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        hint = "apt-get install wnorwegian wswedish wdanish, or pass data.root: a folder holding them" \
            if name == "scandinavian" else "give a folder of text files, one per group"
        raise DatasetUnavailable(f"{name}: {', '.join(missing)} not found ({hint})")
    try:
        words = load_words(files, WORDS_PER_GROUP, MAX_WORD, seed, words_per_sample)
    except (OSError, ValueError) as exc:
        raise DatasetUnavailable(f"{name}: {exc}") from None
    rng = np.random.default_rng(seed)
    test = np.zeros(len(words.groups), dtype=bool)
    for g in range(len(words.group_names)):
        members = np.flatnonzero(words.groups == g)
        test[rng.choice(members, size=len(members) // 4, replace=False)] = True
    train_idx, test_idx = np.flatnonzero(~test), np.flatnonzero(test)
    log.info("%s: %d samples (words or word sequences) of %s, a vocabulary of %d", name, len(words.groups),
             ", ".join(words.group_names), len(words.vocabulary))
    return Dataset(name, words.x[train_idx], words.y[train_idx], words.x[test_idx], words.y[test_idx],
                   len(words.vocabulary), NEXT_TOKEN, words.groups[train_idx], words.groups[test_idx],
                   words.vocabulary)


def is_text(name: str) -> bool:
    """Whether dataset name is text for next-token prediction (its samples are token sequences)."""
    return name == "scandinavian" or name.startswith("words:")


def task_of(name: str) -> str:
    """The name of dataset name's learning task (learn/tasks.py), known without loading it."""
    return NEXT_TOKEN.name if is_text(name) else CLASSIFICATION.name


def text_files(name: str, root: Path | None) -> dict[str, Path]:
    """The files of a text dataset by group: Debian's word lists (under root when given), or words:DIR's
    text files (*.txt, else every file), sorted by name."""
    if name == "scandinavian":
        return {lang: (root / path.name if root else path) for lang, path in SCANDINAVIAN.items()}
    folder = Path(name.removeprefix("words:")).expanduser()
    if not folder.is_dir():
        raise DatasetUnavailable(f"{name}: {folder} is not a folder (words:DIR takes a folder of text files, "
                                 "one per group)")
    files = sorted(folder.glob("*.txt")) or sorted(
        p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))  # not .DS_Store and the like
    if len(files) < 1:
        raise DatasetUnavailable(f"{name}: {folder} holds no text file")
    return {f.stem: f for f in files}


DATASETS = ("digits", "synthetic", "fmnist", "mnist", "emnist", "cifar10", "cifar100", "scandinavian", "words:DIR")


# A scenario's worker processes map one copy of its dataset (share, mapped) instead of each loading its own
# (launch/runner.py writes it and names the folder to its children).
TENSORS = ("x_train", "y_train", "x_test", "y_test", "input_mean", "input_std")
ARRAYS = ("groups_train", "groups_test")
MANIFEST = "dataset.json"


def share(d: Dataset, folder: Path, key: str) -> Dataset:
    """d written once to folder (each array an .npy file, the rest in dataset.json, written last), and d again
    with its arrays memory-mapped from there (mapped): processes that map the same files hold one copy of their
    pages between them. key names what d was loaded as; mapped gives it only to a caller asking for that key."""
    arrays = {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for k in (*TENSORS, *ARRAYS):
            value = getattr(d, k)
            if value is not None:
                np.save(folder / f"{k}.npy", value.numpy() if isinstance(value, torch.Tensor) else value)
                arrays[k] = True
    except OSError as exc:  # a full disk: each process then loads its own copy, as before there was sharing
        log.warning("the dataset could not be written to %s for the worker processes to share (%s): each "
                    "loads its own", folder, exc)
        return d
    (folder / MANIFEST).write_text(json.dumps({"key": key, "name": d.name, "num_classes": d.num_classes,
                                               "task": d.task.name, "vocabulary": d.vocabulary,
                                               "pixel_max": d.pixel_max, "arrays": sorted(arrays)}))
    again = mapped(folder, key)
    assert again is not None
    return again


def mapped(folder: Path, key: str) -> Dataset | None:
    """The dataset share wrote to folder for key, its arrays memory-mapped copy-on-write (a process that changes
    one changes its own copy of those pages); None if folder holds none, or one loaded as another key."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if not isinstance(manifest, dict) or manifest.get("key") != key:
            return None
        loaded: dict[str, object] = {}
        for k in manifest["arrays"]:
            if k not in (*TENSORS, *ARRAYS):
                return None
            array = np.load(folder / f"{k}.npy", mmap_mode="c", allow_pickle=False)
            loaded[k] = torch.from_numpy(array) if k in TENSORS else array
        return Dataset(str(manifest["name"]), num_classes=int(manifest["num_classes"]),
                       task=TASKS[manifest["task"]], vocabulary=str(manifest["vocabulary"]),
                       pixel_max=float(manifest["pixel_max"]), mapped_from=folder, **loaded)  # type: ignore[arg-type]
    except (OSError, ValueError, KeyError, TypeError):  # gone as the run ends, or damaged: the caller loads its own
        return None


def load_dataset(name: str, root: str | Path | None = None, seed: int = 0, words_per_sample: int = 1) -> Dataset:
    """Load a dataset by name (see DATASETS), or a path to a node's own .npz / ImageFolder; a text dataset's
    samples are words, or sequences of words_per_sample words (learn/text.py)."""
    root_path = Path(root).expanduser() if root else None
    if name == "digits":
        return load_digits(seed)
    if name == "synthetic":
        return load_synthetic(seed)
    if name in ("fmnist", "mnist", "emnist"):
        return _load_mnist_like(name, root_path)
    if name in ("cifar10", "cifar100"):
        return _load_cifar(name, root_path)
    if is_text(name):
        return load_text(name, text_files(name, root_path), seed, words_per_sample)
    if name.endswith((".npz", ".csv")) or Path(name).is_dir():
        return load_own(Path(name), seed)
    raise DatasetUnavailable(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)} or a path")
