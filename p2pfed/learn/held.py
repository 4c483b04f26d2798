"""What a coordinator holds of the data itself, handed to it by its launcher.

A coordinator knows no dataset and no partition. Some methods' servers hold a few samples of their own: FedDSMIC's
indicator samples (Li et al. 2022 draw 10 per class "before partitioning the client data"). Some protocols test
the one model a method serves on a test set the server holds (Ye et al. 2023; ``data.server_test``). The launcher
draws both from the scenario's dataset with the scenario's seed, the same draw on every machine and rerun, and
hands the coordinator one ``ServerData``: those samples, the shape of an input and the learning task.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from p2pfed.learn.datasets import Dataset
from p2pfed.learn.partition import server_samples
from p2pfed.learn.tasks import LearningTask


@dataclass(frozen=True, eq=False)  # it holds tensors: compared by identity, never by value
class ServerData:
    """The data a coordinator holds: labelled training samples a method's server may use, and a test set."""

    input_shape: tuple[int, ...]
    num_classes: int  # classes, or the vocabulary's size for next-token prediction
    task: LearningTask
    x: torch.Tensor  # training inputs the coordinator may draw from
    y: np.ndarray  # and their labels
    seed: int
    set_aside: bool  # x and y were dealt to no node (data.server_per_class): they are all it holds
    test: tuple[torch.Tensor, torch.Tensor] | None = None  # its test set (data.server_test), None without one

    def samples(self, per_class: int) -> torch.Tensor:
        """per_class training inputs of every class, in the order of the training split. Set aside: the first
        per_class of each class the coordinator holds (the protocol of Li et al. 2022). Else a draw with the
        scenario's seed from the whole training split, which may also be in some node's shard."""
        if not self.set_aside:
            return self.x[server_samples(self.y, per_class, self.seed)]
        picks = [np.flatnonzero(self.y == c)[:per_class] for c in np.unique(self.y)]
        return self.x[np.sort(np.concatenate(picks))]


def server_data(dataset: Dataset, seed: int, set_aside: int = 0, test: int = 0) -> ServerData:
    """What the coordinator of a scenario holds: set_aside samples of each class that the partition deals to no
    node (data.server_per_class; 0: none, and a method's server draws from the whole training split), and a test
    set of test samples (data.server_test; all of the test split with more; 0: none).

    The test set is a seeded draw from the test split. Node test shards are drawn from the same split; the
    server's set is only ever tested on, so sharing samples with them leaks nothing into training."""
    y = dataset.y_train.numpy()
    x = dataset.x_train
    if set_aside:
        kept = server_samples(y, set_aside, seed)
        x, y = x[kept], y[kept]
    held = None
    if test:
        n = len(dataset.y_test)
        picks = np.sort(np.random.default_rng(seed + 104729).permutation(n)[:test]) if test < n else np.arange(n)
        held = (dataset.x_test[picks], dataset.y_test[picks])
    return ServerData(dataset.input_shape, dataset.num_classes, dataset.task, x, y, seed, bool(set_aside), held)
