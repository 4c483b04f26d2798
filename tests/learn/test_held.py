"""What a coordinator holds of the data: drawn by its launcher with the scenario's seed, the same on every rerun."""

from __future__ import annotations

import numpy as np
import torch

from p2pfed.learn.datasets import Dataset
from p2pfed.learn.held import server_data
from p2pfed.learn.partition import server_samples


def dataset() -> Dataset:
    y = torch.arange(60) % 3
    x = torch.arange(60, dtype=torch.float32)[:, None]  # each input is its index in the training split
    return Dataset("toy", x, y, -torch.arange(20, dtype=torch.float32)[:, None], torch.arange(20) % 3, 3)


def test_set_aside_samples_are_the_first_of_each_class_in_split_order() -> None:
    data = server_data(dataset(), seed=4, set_aside=5)
    kept = server_samples(np.arange(60) % 3, 5, 4)
    assert data.set_aside and data.x[:, 0].long().tolist() == kept.tolist()  # all it holds, dealt to no node
    picked = data.samples(2)[:, 0].long().tolist()
    assert picked == sorted(picked) and len(picked) == 6
    assert picked == sorted(i for c in range(3) for i in [k for k in kept.tolist() if k % 3 == c][:2])


def test_without_samples_set_aside_a_method_draws_from_the_whole_split_and_the_test_set_is_seeded() -> None:
    data = server_data(dataset(), seed=4, test=8)
    assert not data.set_aside and len(data.x) == 60
    assert data.samples(2)[:, 0].long().tolist() == server_samples(np.arange(60) % 3, 2, 4).tolist()
    assert data.test is not None and len(data.test[1]) == 8
    again = server_data(dataset(), seed=4, test=8).test
    assert again is not None and torch.equal(again[0], data.test[0])
    assert server_data(dataset(), seed=4, test=100).test[1].tolist() == (torch.arange(20) % 3).tolist()  # type: ignore[index]
    assert server_data(dataset(), seed=4).test is None
