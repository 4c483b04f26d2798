"""CIFAR-100's superclasses without the download: the fixed map checked by name against the dataset's
documentation, and the pathological and noisy partitions of Rokvic et al. 2025 built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from p2pfed.config import ConfigError
from p2pfed.learn.labels import CIFAR100_SUPERCLASS, label_groups
from p2pfed.learn.partition import PARTITIONS, make_partition

# CIFAR-100's fine labels as the dataset numbers them (alphabetical), and its superclasses with their members
# as https://www.cs.toronto.edu/~kriz/cifar.html lists them.
FINE = [
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle", "bowl",
    "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle", "chair",
    "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin",
    "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp",
    "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck",
    "pine_tree", "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket",
    "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider", "squirrel",
    "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor",
    "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
]
SUPERCLASSES = {
    "aquatic mammals": "beaver dolphin otter seal whale",
    "fish": "aquarium_fish flatfish ray shark trout",
    "flowers": "orchid poppy rose sunflower tulip",
    "food containers": "bottle bowl can cup plate",
    "fruit and vegetables": "apple mushroom orange pear sweet_pepper",
    "household electrical devices": "clock keyboard lamp telephone television",
    "household furniture": "bed chair couch table wardrobe",
    "insects": "bee beetle butterfly caterpillar cockroach",
    "large carnivores": "bear leopard lion tiger wolf",
    "large man-made outdoor things": "bridge castle house road skyscraper",
    "large natural outdoor scenes": "cloud forest mountain plain sea",
    "large omnivores and herbivores": "camel cattle chimpanzee elephant kangaroo",
    "medium-sized mammals": "fox porcupine possum raccoon skunk",
    "non-insect invertebrates": "crab lobster snail spider worm",
    "people": "baby boy girl man woman",
    "reptiles": "crocodile dinosaur lizard snake turtle",
    "small mammals": "hamster mouse rabbit shrew squirrel",
    "trees": "maple_tree oak_tree palm_tree pine_tree willow_tree",
    "vehicles 1": "bicycle bus motorcycle pickup_truck train",
    "vehicles 2": "lawn_mower rocket streetcar tank tractor",
}
Y_TRAIN = np.repeat(np.arange(100), 30)
Y_TEST = np.repeat(np.arange(100), 6)


def test_the_map_puts_every_fine_label_in_its_documented_superclass() -> None:
    assert len(FINE) == 100 and sorted(FINE) == FINE
    groups = label_groups("cifar100-superclasses", 100)
    assert [sorted(FINE[i] for i in g) for g in groups] == [m.split() for m in SUPERCLASSES.values()]
    assert len(CIFAR100_SUPERCLASS) == 100


def test_pathological_deals_four_superclasses_to_each_of_five_clusters() -> None:
    p = make_partition("pathological", Y_TRAIN, Y_TEST, 20, seed=0, clusters=5, label_groups="cifar100-superclasses")
    held = {}
    for shard, cluster in zip(p.shards, p.true_cluster, strict=True):
        held.setdefault(cluster, set(shard.labels))
        assert set(shard.labels) == held[cluster] and set(Y_TEST[shard.test]) == held[cluster]
    assert sorted(held) == [0, 1, 2, 3, 4]
    for cluster, labels in held.items():  # superclasses 4c .. 4c+3, whole
        assert {CIFAR100_SUPERCLASS[lab] for lab in labels} == set(range(4 * cluster, 4 * cluster + 4))
        assert len(labels) == 20


def test_noisy_adds_five_fine_labels_from_outside_the_cluster() -> None:
    p = make_partition("noisy", Y_TRAIN, Y_TEST, 40, seed=1, clusters=5, extra_labels=5, extra_prob=0.5,
                       label_groups="cifar100-superclasses")
    extras = [len(s.labels) - 20 for s in p.shards]
    assert set(extras) == {0, 5} and 10 <= sum(e > 0 for e in extras) <= 30
    for shard, cluster in zip(p.shards, p.true_cluster, strict=True):
        outside = [lab for lab in shard.labels if CIFAR100_SUPERCLASS[lab] // 4 != cluster]
        assert len(outside) == len(shard.labels) - 20


def test_a_grouping_is_refused_where_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="for a dataset of 100 classes; this one has 10"):
        make_partition("pathological", np.repeat(np.arange(10), 5), np.arange(10), 5, seed=0, clusters=5,
                       label_groups="cifar100-superclasses")
    with pytest.raises(ValueError, match="between 1 and min"):
        make_partition("pathological", Y_TRAIN, Y_TEST, 30, seed=0, clusters=21, label_groups="cifar100-superclasses")
    with pytest.raises(ValueError) as caught:  # known when the scenario loads, before any data
        PARTITIONS["pathological"](clusters=21, label_groups="cifar100-superclasses").validate("p.", 30)
    assert str(caught.value) == "p.clusters (21) must not exceed the 20 groups of cifar100-superclasses"
    with pytest.raises(ValueError) as caught:
        PARTITIONS["noisy"](label_groups="cifar-superclasses").validate("p.", 8)
    assert str(caught.value) == "p.label_groups must be none or one of cifar100-superclasses (got 'cifar-superclasses')"


def test_a_scenario_with_another_dataset_is_refused_when_it_loads(tmp_path: Path) -> None:
    from p2pfed.scenario.config import load_scenario

    path = tmp_path / "s.toml"
    path.write_text('[scenario]\nnodes = 10\n[data]\ndataset = "fmnist"\n[data.partition]\nkind = "pathological"\n'
                    'label_groups = "cifar100-superclasses"\n')
    with pytest.raises(ConfigError, match="groups the labels of cifar100, not of fmnist"):
        load_scenario(path)


def test_cifar100_on_disk_is_not_downloaded_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision

    from p2pfed.learn import datasets

    asked: list[bool] = []

    class Fake:
        def __init__(self, root: str, train: bool, download: bool) -> None:
            asked.append(download)
            self.data = np.zeros((2, 32, 32, 3), np.uint8)
            self.targets = [0, 99]

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", Fake)
    (tmp_path / "cifar-100-python").mkdir()
    data: Any = datasets._load_cifar("cifar100", tmp_path)
    assert asked == [False, False] and data.num_classes == 100
