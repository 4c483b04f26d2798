"""Reading samples and labels from a machine's own files: an ``.npz`` of ``x`` and ``y``, an ImageFolder
(class folders named by class number, or by a name of the given class names), a CSV of number columns and a
label column. Below datasets.py (a scenario's dataset may be such a file) and own.py (a node's own data)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch


class OwnDataError(ValueError):
    """Own data that cannot be read, or does not fit the recipe; the message names the file and what is wrong."""


def read_own(path: Path, channels: int = 3, class_names: list[str] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The samples and labels at path, and the value of a white pixel in their units (0: not images). Images
    are read with channels channels (1: grey); an ImageFolder's class folders are class numbers, or names
    of class_names."""
    if not path.exists():
        raise OwnDataError(f"{path}: no such file or folder")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as f:
                if "x" not in f or "y" not in f:
                    raise OwnDataError(f"{path}: an .npz of own data needs arrays 'x' (samples) and 'y' (labels); "
                                       f"it has {', '.join(f.files) or 'none'}")
                x, y = f["x"], f["y"]
        except (OSError, ValueError) as exc:
            if isinstance(exc, OwnDataError):
                raise
            raise OwnDataError(f"{path}: not a readable .npz ({exc})") from None
        if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1:
            raise OwnDataError(f"{path}: labels 'y' must be one integer per sample, not {y.dtype} of shape {y.shape}")
        xt = torch.as_tensor(x, dtype=torch.float32)
        return xt, torch.as_tensor(y, dtype=torch.int64), 0.0
    if path.suffix == ".csv":
        return *_read_csv(path), 0.0
    if path.is_dir():
        return *_read_image_folder(path, channels, class_names or []), 1.0  # ToTensor: pixels in 0..1
    raise OwnDataError(f"{path}: own data must be an .npz (x, y), a .csv (features and a 'label' column) or an "
                       "ImageFolder directory")


def _read_image_folder(path: Path, channels: int, class_names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    import torchvision
    from PIL import Image

    def load(file: str) -> Image.Image:
        with Image.open(file) as img:
            return img.convert("L" if channels == 1 else "RGB")

    try:
        folder = torchvision.datasets.ImageFolder(str(path), loader=load, transform=torchvision.transforms.ToTensor())
    except (FileNotFoundError, OSError) as exc:
        raise OwnDataError(f"{path}: not an ImageFolder (one sub-folder of images per class): {exc}") from None
    number = {}
    for name in folder.classes:  # the folder's own numbering depends on which classes it has: not ours
        if name in class_names:
            number[name] = class_names.index(name)
        elif name.isdigit():
            number[name] = int(name)
        else:
            raise OwnDataError(f"{path}: class folder {name!r} is neither a class number nor one of the recipe's "
                               "data.class_names; name folders 0, 1, ... (or list the names in data.class_names) "
                               "so that every machine numbers classes alike")
    images = [folder[i][0] for i in range(len(folder))]
    if len({tuple(img.shape) for img in images}) > 1:
        sizes = sorted({"x".join(map(str, img.shape[1:])) for img in images})
        raise OwnDataError(f"{path}: images of different sizes ({', '.join(sizes)}); give every image the recipe's "
                           "size")
    labels = [number[folder.classes[t]] for t in folder.targets]
    return torch.stack(images), torch.tensor(labels, dtype=torch.int64)


def _read_csv(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Feature columns and the label column ('label', else the last) of a CSV with a header row."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise OwnDataError(f"{path}: a CSV of own data needs a header row and samples")
    header, body = rows[0], rows[1:]
    label = header.index("label") if "label" in header else len(header) - 1
    try:
        values = np.array([[float(v) for v in row] for row in body if row], dtype=np.float32)
    except ValueError as exc:
        raise OwnDataError(f"{path}: every value must be a number ({exc})") from None
    if values.ndim != 2 or values.shape[1] != len(header):
        raise OwnDataError(f"{path}: every row must have the header's {len(header)} columns")
    labels = values[:, label]
    if not np.all(labels == np.round(labels)):
        raise OwnDataError(f"{path}: the label column {header[label]!r} must hold whole class numbers")
    features = np.delete(values, label, axis=1)
    return torch.as_tensor(features), torch.as_tensor(labels.astype(np.int64))


