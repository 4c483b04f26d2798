"""A scenario's worker processes map one copy of its dataset: share writes it once, mapped gives it back for
the same key only, a process that changes a mapped tensor changes its own copy, and a worker the runner
started (SHARED_DATA in its environment) maps the runner's copy instead of loading its own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from p2pfed.launch import runner
from p2pfed.learn.datasets import load_dataset, mapped, share
from p2pfed.learn.tasks import NEXT_TOKEN
from p2pfed.scenario.config import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_a_shared_dataset_maps_back_equal_for_its_key_only_and_copies_on_write(tmp_path: Path) -> None:
    d = load_dataset("digits")
    again = share(d, tmp_path, "digits|0")
    assert again.mapped_from == tmp_path
    assert mapped(tmp_path, "digits|1") is None and mapped(tmp_path / "x", "k") is None
    other = mapped(tmp_path, "digits|0")
    assert other is not None
    for k in ("x_train", "y_train", "x_test", "y_test", "input_mean", "input_std"):
        assert torch.equal(getattr(other, k), getattr(d, k)), k
    assert (other.name, other.num_classes, other.task, other.pixel_max) == (d.name, d.num_classes, d.task, d.pixel_max)
    other.x_train[0] += 1.0  # this process's own copy of the page
    assert torch.equal(mapped(tmp_path, "digits|0").x_train, d.x_train)  # type: ignore[union-attr]


def test_a_text_dataset_keeps_its_task_groups_and_vocabulary(tmp_path: Path) -> None:
    d = load_dataset("synthetic")
    d.task, d.vocabulary = NEXT_TOKEN, "abc"
    d.groups_train, d.groups_test = np.arange(len(d.y_train)), np.arange(len(d.y_test))
    back = share(d, tmp_path, "k")
    assert back.task is NEXT_TOKEN and back.vocabulary == "abc"
    assert np.array_equal(back.groups_train, d.groups_train) and np.array_equal(back.groups_test, d.groups_test)


def test_a_worker_maps_the_runners_copy_instead_of_loading_its_own(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = load_scenario(ROOT / "scenarios" / "quickstart.toml")
    dataset, partition = runner.prepare_data(scenario, share_to=tmp_path)  # the runner
    assert dataset.mapped_from == tmp_path and json.loads((tmp_path / "dataset.json").read_text())["name"] == "digits"

    def no_loading(*_: object) -> None:
        raise AssertionError("a worker loaded the dataset again")

    monkeypatch.setattr(runner, "load_dataset", no_loading)
    monkeypatch.setenv(runner.SHARED_DATA, str(tmp_path))
    theirs, their_partition = runner.prepare_data(scenario)  # a worker
    assert theirs.mapped_from == tmp_path and torch.equal(theirs.x_train, dataset.x_train)
    assert [s.train.tolist() for s in their_partition.shards] == [s.train.tolist() for s in partition.shards]
    other = load_scenario(ROOT / "scenarios" / "quickstart.toml", ["scenario.seed=1"])  # another key: loads its own
    with pytest.raises(AssertionError, match="loaded the dataset again"):
        runner.prepare_data(other)


def test_a_damaged_shared_folder_is_not_mapped_and_the_worker_loads_its_own(tmp_path: Path) -> None:
    share(load_dataset("digits"), tmp_path, "k")
    manifest = json.loads((tmp_path / "dataset.json").read_text())
    for damage in ({**manifest, "task": "regression"}, {**manifest, "arrays": ["../x_train"]},
                   {k: v for k, v in manifest.items() if k != "num_classes"}, ["k"]):
        (tmp_path / "dataset.json").write_text(json.dumps(damage))
        assert mapped(tmp_path, "k") is None, damage
    (tmp_path / "dataset.json").write_text("{not json")
    assert mapped(tmp_path, "k") is None
    (tmp_path / "dataset.json").write_text(json.dumps(manifest))
    (tmp_path / "x_test.npy").unlink()  # the folder half gone
    assert mapped(tmp_path, "k") is None
