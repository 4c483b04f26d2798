"""Fixed groupings of a dataset's labels, for partitions that deal groups of labels to clusters.

``cifar100-superclasses``: CIFAR-100's 100 fine labels (alphabetical, as the dataset numbers them) in its 20
superclasses (also alphabetical: 0 aquatic mammals, 1 fish, 2 flowers, ..., 18 vehicles 1, 19 vehicles 2), the
grouping the dataset ships with. Rokvic et al. 2025 build their CIFAR-100 clusters from it: "we group classes
into their superclasses and then assign four super classes per cluster". The test checks every superclass's
five members by name against the dataset's documentation, so the map can be trusted without downloading the
dataset.
"""

from __future__ import annotations

CIFAR100_SUPERCLASS: tuple[int, ...] = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)

LABEL_GROUPS: dict[str, tuple[int, ...]] = {"cifar100-superclasses": CIFAR100_SUPERCLASS}
DATASET_OF: dict[str, str] = {"cifar100-superclasses": "cifar100"}  # the built-in dataset each grouping is of


def group_count(name: str) -> int:
    """How many groups the named grouping has (known without the data)."""
    return max(LABEL_GROUPS[name]) + 1


def label_groups(name: str, num_classes: int) -> list[list[int]]:
    """The labels of each group of the named grouping ("none": each label a group of its own), checked
    against the dataset's number of classes."""
    if name == "none":
        return [[label] for label in range(num_classes)]
    if name not in LABEL_GROUPS:
        raise ValueError(f"unknown label grouping {name[:40]!r}; choose none or {', '.join(LABEL_GROUPS)}")
    group_of = LABEL_GROUPS[name]
    if len(group_of) != num_classes:
        raise ValueError(f"label grouping {name} is for a dataset of {len(group_of)} classes; this one has "
                         f"{num_classes}")
    return [[label for label, g in enumerate(group_of) if g == group] for group in range(max(group_of) + 1)]
