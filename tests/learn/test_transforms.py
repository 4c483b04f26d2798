"""Input transforms of feature-space clusters: each step does what its name says, the same on every run from
the same seed, and a node's train, validation and test inputs all go through its cluster's transform."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from p2pfed.config import ConfigError
from p2pfed.launch.runner import local_data
from p2pfed.learn.datasets import load_dataset
from p2pfed.learn.partition import make_partition
from p2pfed.learn.transforms import Step, apply, parse
from p2pfed.scenario.config import load_scenario

NOISE_7 = [-0.4101, 0.1978, 0.4495, -0.6942]  # the first row of noise:0.5 drawn with seed 7
X = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).reshape(2, 1, 4, 4) / 31 - 0.5


def test_rotations_by_quarter_turns_are_exact_and_a_full_turn_is_none() -> None:
    assert torch.equal(apply("rotate:90", X, 0), torch.rot90(X, 1, dims=(2, 3)))
    assert torch.equal(apply("rotate:-90", X, 0), torch.rot90(X, 3, dims=(2, 3)))
    assert torch.equal(apply("rotate:360", X, 0), X) and torch.equal(apply("none", X, 0), X)
    assert torch.equal(apply("rotate:90+rotate:90", X, 0), apply("rotate:180", X, 0))  # steps compose


def test_other_angles_interpolate_and_fill_the_corners_with_the_background() -> None:
    x = torch.full((1, 1, 9, 9), -1.0)
    x[0, 0, 4, :] = 1.0  # a horizontal bar on a dark background
    out = apply("rotate:45", x, 0)
    assert out.shape == x.shape and out[0, 0, 0, 0] == -1.0 and out[0, 0, 4, 4] == pytest.approx(1.0)
    assert out[0, 0, 2, 6] > 0 and out[0, 0, 6, 2] > 0 > out[0, 0, 4, 0]  # the bar now runs along the diagonal


def test_invert_contrast_blur_and_noise() -> None:
    assert torch.equal(apply("invert", X, 0), -X)
    assert torch.allclose(apply("contrast:0.5", X, 0), 0.5 * X)
    blurred = apply("blur:1.0", X, 0)
    assert blurred.std() < X.std() and blurred.shape == X.shape
    noisy = apply("noise:0.5", X, 7)
    assert not torch.equal(noisy, apply("noise:0.5", X, 8))
    # torch's seeded CPU generator: the same noise on every machine (pinned, not compared with itself)
    assert [round(v, 4) for v in (noisy - X)[0, 0, 0].tolist()] == NOISE_7
    assert 0.2 < float((noisy - X).std()) < 0.8
    with pytest.raises(ValueError, match=r"transforms work on images \(N, C, H, W\); these inputs have shape \(3, 4\)"):
        apply("invert", torch.zeros(3, 4), 0)


def test_empty_splits_pass_and_a_quarter_turn_of_a_non_square_image_is_refused() -> None:
    assert apply("rotate:30+noise:0.1", torch.zeros(0, 1, 4, 4), 0).shape == (0, 1, 4, 4)
    with pytest.raises(ValueError, match="a quarter turn of 4x6 images changes their shape"):
        apply("rotate:90", torch.zeros(1, 1, 4, 6), 0)
    assert apply("rotate:180", torch.zeros(1, 1, 4, 6), 0).shape == (1, 1, 4, 6)


def test_a_transform_is_parsed_into_its_steps_and_bad_ones_are_refused() -> None:
    assert parse("rotate:180 + noise:0.3") == [Step("rotate", 180.0), Step("noise", 0.3)]
    for bad in ("", "rotate:90+", "blur:0", "contrast:-1", "rotate:720"):
        with pytest.raises(ValueError):
            parse(bad)


SCENARIO = """
[scenario]
nodes = 4
rounds = 2
methods = ["local-p2p"]
[data]
dataset = "digits"
[data.partition]
kind = "feature"
clusters = 2
transforms = ["none", "invert+noise:0.2"]
"""


def test_a_nodes_train_validation_and_test_inputs_all_go_through_its_clusters_transform(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    scenario = load_scenario(path)
    dataset = load_dataset("digits")
    partition = scenario.data.partition.build(dataset.y_train.numpy(), dataset.y_test.numpy(), 4, scenario.seed, 0.2)
    same = make_partition("feature", dataset.y_train.numpy(), dataset.y_test.numpy(), 4, seed=0, clusters=2,
                          transforms=("none", "invert+noise:0.2"))
    assert [s.transform for s in partition.shards] == [s.transform for s in same.shards] == ["none"] * 2 + [
        "invert+noise:0.2"] * 2
    plain, seen = local_data(scenario, 0, dataset, partition), local_data(scenario, 3, dataset, partition)
    shard = partition.shards[3]
    for x, idx, source in ((seen.x_train, shard.train, dataset.x_train), (seen.x_val, shard.val, dataset.x_train),
                           (seen.x_test, shard.test, dataset.x_test)):
        diff = x + source[idx]  # inverted, then noise of std 0.2
        assert 0.1 < float(diff.std()) < 0.3 and abs(float(diff.mean())) < 0.05
    assert torch.equal(plain.x_test, dataset.x_test[partition.shards[0].test])  # cluster 0 sees them as they are
    again = local_data(scenario, 3, dataset, partition)  # the same noise on a restart, or on another machine
    assert torch.equal(again.x_train, seen.x_train) and torch.equal(again.x_test, seen.x_test)
    assert not torch.equal(seen.x_train[:5], seen.x_val[:5])  # each split draws its own noise


def test_max_train_and_max_val_cap_a_nodes_splits(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace("[data]\n", "[data]\nmax_train = 7\nmax_val = 3\n"))
    scenario = load_scenario(path)
    dataset = load_dataset("digits")
    partition = scenario.data.partition.build(dataset.y_train.numpy(), dataset.y_test.numpy(), 4, scenario.seed, 0.2)
    data, shard = local_data(scenario, 0, dataset, partition), partition.shards[0]
    assert (len(data.y_train), len(data.y_val), len(data.y_test)) == (7, 3, len(shard.test))
    assert torch.equal(data.y_val, dataset.y_train[shard.val[:3]])  # the shard's first validation samples
    path.write_text(SCENARIO.replace("[data]\n", "[data]\nmax_val = -1\n"))
    with pytest.raises(ConfigError, match=re.escape("data.max_train and data.max_val must be >= 0")):
        load_scenario(path)
