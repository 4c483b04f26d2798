"""Write the worked example's private data: three .npz files of scikit-learn's bundled digits, as three
machines might hold them. a.npz and b.npz hold digits 0-4 (different images), c.npz digits 5-9, 60 images
each: little enough that a machine gains from the right peer.

    python3 node/example_data.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits


def write_example(out: Path, per_machine: int = 60) -> list[Path]:
    """Write a.npz, b.npz and c.npz into out and return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    low = np.flatnonzero(digits.target < 5)
    high = np.flatnonzero(digits.target >= 5)
    parts = {"a": low[:per_machine], "b": low[per_machine:2 * per_machine], "c": high[:per_machine]}
    paths = []
    for name, keep in parts.items():
        path = out / f"{name}.npz"
        np.savez(path, x=digits.images[keep], y=digits.target[keep])  # raw 0-16 pixels, labels 0-9
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_example(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print(written)
