"""pFedLIA-central: OPTICS finds the blocks of an influence matrix without being told how many; noise
points and late joiners go where their own scores say they gain most."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from p2pfed.methods.central import Task, Update
from p2pfed.methods.pfedlia.central import (
    PFedLIACentralPaperServer,
    PFedLIACentralServer,
    best_cluster,
    optics_clusters,
)
from p2pfed.methods.pfedlia.options import CentralOptions, PaperCentralOptions
from tests.methods.fake import FakeCoordinator

TRUE = [0] * 4 + [1] * 4 + [2] * 4
NAMES = [f"n{i:02d}" for i in range(12)]


def influence(i: int, j: int, rng: np.random.Generator) -> float:
    """Peers of one's own cluster help (positive), the others hurt; each node has its own loss scale."""
    scale = 0.5 + i / 10
    return scale * ((1.0 if TRUE[i] == TRUE[j] else -0.6) + 0.1 * rng.standard_normal())


def test_optics_recovers_the_blocks_of_the_influence_matrix() -> None:
    for seed in range(30):  # clusters of 4 and of 3 (the last row left out), each node its own loss scale
        rng = np.random.default_rng(seed)
        for n in (12, 11):
            matrix = np.array([[influence(i, j, rng) for j in range(12)] for i in range(n)])
            labels = optics_clusters(matrix, CentralOptions().optics_min_samples, CentralOptions().optics_xi)
            assert adjusted_rand_score(TRUE[:n], labels) == 1.0, (seed, n, labels)


def test_best_cluster_is_the_one_that_helps_most_and_none_if_none_helps() -> None:
    groups = {"a": 0, "b": 0, "c": 1}
    assert best_cluster({"a": 0.2, "b": 0.4, "c": 0.5}, groups) == 1
    assert best_cluster({"a": -0.2, "b": -0.4, "c": -0.1}, groups) is None


def test_the_influence_phase_through_tasks_and_a_late_joiner() -> None:
    rng = np.random.default_rng(1)

    def answer(node: str, task: Task) -> object:
        i = int(node[1:])
        if task.kind == "compute":
            return Update({"w": torch.full((4,), float(i))}, 10)
        assert task.kind == "note" and len(task.models) == len(task.names) + 1
        return {name: influence(i, int(name[1:]), rng) for name in task.names}

    ctx = FakeCoordinator(answer)
    method = PFedLIACentralServer(ctx, CentralOptions(warmup_rounds=2))
    asyncio.run(method.before_round(0, NAMES[:-1]))  # warm-up: one FedAvg group
    assert set(method.clusters().values()) == {0}
    asyncio.run(method.before_round(2, NAMES[:-1]))  # round W: partial models, scores, OPTICS
    found = method.clusters()
    assert adjusted_rand_score(TRUE[:-1], [found[n] for n in NAMES[:-1]]) == 1.0
    asyncio.run(method.before_round(3, NAMES))  # n11 joins: it scores the kept partial models
    assert method.clusters()["n11"] == found["n08"]
    assert ("n11", "compute") not in ctx.asked and ("n11", "note") in ctx.asked


def test_a_pair_too_small_for_optics_still_ends_up_together() -> None:
    """Clusters of 3, 3 and 2 (fewer than min_samples): the pair only helps each other."""
    true = [0, 0, 0, 1, 1, 1, 2, 2]
    rows = {f"n{i}": {f"n{j}": (1.5 if true[i] == true[j] else -4.0) + 0.01 * ((i * 7 + j * 3) % 5)
                      for j in range(8)} for i in range(8)}

    def answer(node: str, task: Task) -> object:
        if task.kind == "compute":
            return Update({"w": torch.zeros(4)}, 10)
        return rows[node]

    method = PFedLIACentralServer(FakeCoordinator(answer), CentralOptions(warmup_rounds=0))
    asyncio.run(method.before_round(0, sorted(rows)))
    found = method.clusters()
    assert adjusted_rand_score(true, [found[f"n{i}"] for i in range(8)]) == 1.0
    assert sorted(method.models) == sorted(set(found.values()))


def phase(rows: dict[str, dict[str, float]], method: type[PFedLIACentralServer], options: CentralOptions
          ) -> dict[str, int]:
    """The clusters method finds from the influence matrix rows (node -> its score of each node)."""

    def answer(node: str, task: Task) -> object:
        if task.kind == "compute":
            return Update({"w": torch.zeros(4)}, 10)
        return rows[node]

    server = method(FakeCoordinator(answer), options)
    asyncio.run(server.before_round(0, sorted(rows)))
    assert sorted(server.models) == sorted(set(server.clusters().values()))  # one model per cluster, no more
    return server.clusters()


def test_the_papers_rule_leaves_noise_points_alone_where_ours_places_them() -> None:
    true = [0, 0, 0, 1, 1, 1, 2, 2]  # the pair is smaller than min_samples: OPTICS calls it noise
    rows = {f"n{i}": {f"n{j}": (1.5 if true[i] == true[j] else -4.0) + 0.01 * ((i * 7 + j * 3) % 5)
                      for j in range(8)} for i in range(8)}
    paper = phase(rows, PFedLIACentralPaperServer, PaperCentralOptions(warmup_rounds=0))
    assert paper["n0"] == paper["n1"] == paper["n2"] != paper["n3"] == paper["n4"] == paper["n5"]
    assert len({paper["n6"], paper["n7"], paper["n0"], paper["n3"]}) == 4  # each of the pair on its own
    ours = phase(rows, PFedLIACentralServer, CentralOptions(warmup_rounds=0))
    assert adjusted_rand_score(true, [ours[f"n{i}"] for i in range(8)]) == 1.0
    # the option, not the method's name, decides: pfedlia-central told optics = "paper" does the same
    assert phase(rows, PFedLIACentralServer, CentralOptions(warmup_rounds=0, optics="paper")) == paper


def test_the_papers_rule_clusters_raw_rows_so_a_node_with_a_large_loss_scale_stands_apart() -> None:
    true = [0] * 4 + [1] * 4 + [2] * 4
    scale = [1.0] * 11 + [100.0]  # n11's validation loss is 100 times the others' (the same pattern)
    rows = {f"n{i:02d}": {f"n{j:02d}": scale[i] * ((1.0 if true[i] == true[j] else -1.0) + 0.01 * ((i * 7 + j * 3) % 5))
                          for j in range(12)} for i in range(12)}
    ours = phase(rows, PFedLIACentralServer, CentralOptions(warmup_rounds=0))
    assert adjusted_rand_score(true, [ours[n] for n in sorted(rows)]) == 1.0
    paper = phase(rows, PFedLIACentralPaperServer, PaperCentralOptions(warmup_rounds=0))
    assert paper["n08"] == paper["n09"] == paper["n10"] and paper["n11"] not in (paper["n00"], paper["n04"],
                                                                                  paper["n08"])
    matrix = np.array([[rows[a][b] for b in sorted(rows)] for a in sorted(rows)])
    assert list(optics_clusters(matrix, 3, 0.05, standardise=False)).count(-1) == 1  # n11: noise


def test_a_node_that_answers_the_partial_step_with_other_than_one_model_is_left_out_of_the_phase(
        caplog: pytest.LogCaptureFixture) -> None:
    true = [0, 0, 0, 1, 1, 1]
    rows = {f"n{i:02d}": {f"n{j:02d}": (1.5 if true[i] == true[j] else -4.0) + 0.01 * ((i * 7 + j * 3) % 5)
                          for j in range(6)} for i in range(6)}

    def answer(node: str, task: Task) -> object:
        if task.kind == "compute":
            state = {"w": torch.zeros(4)}
            return Update(state, 10, extra=[state]) if node == "n05" else Update(state, 10)
        return {name: rows[node][name] for name in task.names}

    ctx = FakeCoordinator(answer)
    method = PFedLIACentralServer(ctx, CentralOptions(warmup_rounds=0))
    with caplog.at_level(logging.WARNING, logger="p2pfed.methods.pfedlia.central"):
        asyncio.run(method.before_round(0, sorted(rows)))
    assert sorted(method.partials) == ["n00", "n01", "n02", "n03", "n04"]
    assert all("n05" not in row for row in method.matrix.values())  # nobody scored a model it did not give
    found = method.clusters()  # it is placed as a late joiner is, by its own scores of the others' models
    assert found["n05"] == found["n03"] == found["n04"] != found["n00"]
    assert "pfedlia-central: n05 answered with 2 models, not its partial model; left out" in caplog.messages
