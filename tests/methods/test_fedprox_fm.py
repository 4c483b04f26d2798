"""FedProx + FM (Ye et al. 2023, Fig. 8a): FedFM's rounds whose train tasks all carry FedProx's μ, the proximal term
to the global model a node trains from (sent, or kept from the anchor step), and the options."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from p2pfed.config import ConfigError
from p2pfed.learn.train import state_of
from p2pfed.methods import load_checked
from p2pfed.methods.central import Task, Update
from p2pfed.methods.fedfm import FedFMClient, FedFMOptions, FMInstructions
from p2pfed.methods.fedprox_fm import FedProxFMOptions, FedProxFMServer
from tests.methods.fake import FakeCoordinator, FakeNode, Net, distance
from tests.scenario.test_mesh_learning import shrink, write


def ctx() -> FakeCoordinator:
    def answer(node: str, task: Task) -> Update:
        return Update(None, 1, aux={"anchors": torch.eye(3, 2), "counts": torch.ones(3)})

    coordinator = FakeCoordinator(answer)
    coordinator.initial = {"head.weight": torch.zeros(3, 2), "head.bias": torch.zeros(3)}
    return coordinator


def test_every_train_task_carries_mu_before_and_after_feature_matching_starts() -> None:
    server = FedProxFMServer(ctx(), FedProxFMOptions(start=1, mu=0.2))
    assert FedProxFMServer.client is FedFMClient and FedProxFMServer.tasks == frozenset({"classification"})
    asyncio.run(server.before_round(0, ["a"]))
    before = server.train_task(0, "a")
    assert before.instructions.wire() == {"penalty": 0.2} and len(before.models) == 1  # FedProx before T_s
    asyncio.run(server.before_round(1, ["a"]))
    after = server.train_task(1, "a")
    assert after.instructions == FMInstructions(matching=True, penalty=0.2) and "anchors" in after.aux
    assert after.models == [] and len(server.train_task(1, "b").models) == 1  # a holds the global model
    assert server.eval_task("a").instructions.penalty == 0


def test_the_proximal_term_pulls_towards_the_global_model_sent_or_kept_from_the_anchor_step() -> None:
    torch.manual_seed(1)  # a fixed global model: the test must not depend on what ran before it
    global_model = state_of(Net())
    anchors = {"anchors": torch.eye(3, 4), "have": torch.ones(3, dtype=torch.uint8)}
    how = FMInstructions(matching=True)

    def train(task: Task, compute_first: bool = False) -> dict[str, torch.Tensor]:
        client = FedFMClient(FakeNode(epochs=3), FedFMOptions())  # type: ignore[arg-type]
        if compute_first:  # the anchor step loads the global model; the train task then sends none
            asyncio.run(client.compute(Task("compute", [global_model])))
        update, _ = asyncio.run(client.train(task))
        assert update.state is not None
        return update.state

    fm = train(Task("train", [global_model], how, aux=anchors))
    prox = train(Task("train", [global_model], replace(how, penalty=2.0), aux=anchors))
    kept = train(Task("train", [], replace(how, penalty=2.0), aux=anchors), compute_first=True)
    assert distance(prox, global_model) < 0.5 * distance(fm, global_model)
    assert all(torch.allclose(kept[k], prox[k]) for k in prox)


def scenario_file(tmp_path: Path, table: str) -> Path:
    path = write(tmp_path, methods='["fedprox-fm"]')
    shrink(path, nodes=4, clusters=2, rounds=4)
    path.write_text(path.read_text() + f"\n[methods.fedprox-fm]\n{table}\n")
    return path


@pytest.mark.parametrize(("table", "message"), [
    ("mu = -1", "methods.fedprox-fm.mu must be in [0, 1e+06] (got -1.0)"),
    ("lam = -1", "methods.fedprox-fm.lam and start must be >= 0 and temperature > 0"),
    ("every = 2", "methods.fedprox-fm.every is not a known key (known: lam, mu, start, temperature, uniform)"),
])
def test_an_option_that_cannot_work_is_named_with_its_file_and_key(tmp_path: Path, table: str, message: str) -> None:
    path = scenario_file(tmp_path, table)
    with pytest.raises(ConfigError) as caught:
        load_checked(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_the_options_are_fedfms_and_fedprox_mu_from_the_methods_own_table(tmp_path: Path) -> None:
    options = FedProxFMServer.options_from(load_checked(scenario_file(tmp_path, "mu = 0.5\nstart = 2")))
    assert options == FedProxFMOptions(mu=0.5, start=2)
