"""FedAvgM (a baseline of FedFM, Ye et al. 2023): the server's momentum step on the participants' mean update, its
velocity kept across a coordinator restart, and its own options table [methods.fedavgm]."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from p2pfed.config import ConfigError
from p2pfed.learn.checkpoint import load_own, save_atomic
from p2pfed.methods import load_checked
from p2pfed.methods.baselines import FedAvgServer
from p2pfed.methods.central import ServerMethod, Update
from p2pfed.methods.fedavgm import FedAvgMOptions, FedAvgMServer
from tests.methods.fake import FakeCoordinator, vec
from tests.scenario.test_mesh_learning import shrink, write


def up(*xs: float, samples: int = 1) -> Update:
    return Update(vec(*xs), samples)


def server(momentum: float = 0.9, server_lr: float = 1.0, ctx: FakeCoordinator | None = None) -> FedAvgMServer:
    method = FedAvgMServer(ctx or FakeCoordinator(lambda n, t: None, dim=2),
                           FedAvgMOptions(momentum=momentum, server_lr=server_lr))
    asyncio.run(method.before_round(0, ["a", "b"]))
    return method


ROUNDS = [{"a": up(1, 0), "b": up(3, 2, samples=3)}, {"a": up(4, 1), "b": up(4, 1)}]


def test_the_server_steps_by_momentum_on_the_mean_update() -> None:
    method = server(momentum=0.5, server_lr=2.0)
    method.aggregate(0, ROUNDS[0])
    # mean (2.5, 1.5): Δ = w − mean = (−2.5, −1.5), v = Δ, w = 0 − 2·v
    assert method.models[0]["w"].tolist() == [5.0, 3.0] and method.velocity["w"].tolist() == [-2.5, -1.5]
    method.aggregate(1, ROUNDS[1])
    # Δ = (5, 3) − (4, 1) = (1, 2), v = 0.5·(−2.5, −1.5) + (1, 2) = (−0.25, 1.25), w = (5, 3) − 2·v
    assert method.velocity["w"].tolist() == [-0.25, 1.25] and method.models[0]["w"].tolist() == [5.5, 0.5]


def test_no_momentum_and_a_unit_step_is_fedavg() -> None:
    plain, fedavg = server(momentum=0.0), FedAvgServer(FakeCoordinator(lambda n, t: None, dim=2), None)
    asyncio.run(fedavg.before_round(0, ["a", "b"]))
    for rnd, updates in enumerate(ROUNDS):
        plain.aggregate(rnd, updates)
        fedavg.aggregate(rnd, updates)
        assert torch.allclose(plain.models[0]["w"], fedavg.models[0]["w"])


def test_a_round_without_updates_moves_neither_the_model_nor_the_velocity() -> None:
    method = server()
    method.aggregate(0, ROUNDS[0])
    model, velocity = method.models[0]["w"].clone(), method.velocity["w"].clone()
    method.aggregate(1, {})
    assert torch.equal(method.models[0]["w"], model) and torch.equal(method.velocity["w"], velocity)


class BufferedCoordinator(FakeCoordinator):
    """A model with a parameter "w" and a buffer "stat" (a BatchNorm statistic)."""

    def __init__(self) -> None:
        super().__init__(lambda n, t: None, dim=2)
        self.initial = {"w": torch.zeros(2), "stat": torch.zeros(2)}

    def module(self, state: dict[str, torch.Tensor]) -> nn.Module:
        m = nn.Module()
        m.register_parameter("w", nn.Parameter(state["w"].clone()))
        m.register_buffer("stat", state["stat"].clone())
        return m


def test_momentum_moves_the_parameters_and_a_buffer_takes_the_participants_mean() -> None:
    method = server(momentum=0.5, server_lr=2.0, ctx=BufferedCoordinator())
    both = {"w": torch.tensor([1.0, 1.0]), "stat": torch.tensor([1.0, 1.0])}
    method.aggregate(0, {"a": Update(both, 1)})
    assert list(method.velocity) == ["w"]  # w = 0 − 2·(0 − 1): twice as far as the mean; the statistic is the mean
    assert method.models[0]["w"].tolist() == [2.0, 2.0] and method.models[0]["stat"].tolist() == [1.0, 1.0]


def test_a_restarted_coordinator_resumes_with_the_same_velocity(tmp_path: Path) -> None:
    method = server(momentum=0.5, server_lr=2.0)
    method.aggregate(0, ROUNDS[0])
    data, models = method.state()
    save_atomic({"data": json.dumps(data), "models": models}, tmp_path / "coordinator.safetensors")  # as it does
    ckpt = load_own(tmp_path / "coordinator.safetensors")
    restarted = FedAvgMServer(FakeCoordinator(lambda n, t: None, dim=2), FedAvgMOptions(momentum=0.5, server_lr=2.0))
    restarted.restore(json.loads(ckpt["data"]), ckpt["models"])
    assert torch.equal(restarted.velocity["w"], method.velocity["w"])
    method.aggregate(1, ROUNDS[1])
    restarted.aggregate(1, ROUNDS[1])
    assert restarted.models[0]["w"].tolist() == method.models[0]["w"].tolist() == [5.5, 0.5]
    assert torch.equal(restarted.train_task(2, "a").models[0]["w"], method.models[0]["w"])


def scenario_file(tmp_path: Path, table: str) -> Path:
    path = write(tmp_path, methods='["fedavgm"]')
    shrink(path, nodes=3, clusters=1, rounds=4)
    path.write_text(path.read_text() + f"\n[methods.fedavgm]\n{table}\n")
    return path


@pytest.mark.parametrize(("table", "message"), [
    ("momentum = 1.0", "methods.fedavgm.momentum must be in [0, 1) (got 1.0)"),
    ("momentum = -0.1", "methods.fedavgm.momentum must be in [0, 1) (got -0.1)"),
    ("server_lr = 0", "methods.fedavgm.server_lr must be > 0 (got 0.0)"),
    ("server_lr = nan", "methods.fedavgm.server_lr must be > 0 (got nan)"),
    ("beta = 0.5", "methods.fedavgm.beta is not a known key (known: momentum, server_lr)"),
])
def test_an_option_that_cannot_work_is_named_with_its_file_and_key(tmp_path: Path, table: str, message: str) -> None:
    path = scenario_file(tmp_path, table)
    with pytest.raises(ConfigError) as caught:
        load_checked(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_the_options_come_from_the_methods_own_table(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, "momentum = 0.7")
    assert FedAvgMServer.options_from(load_checked(path)) == FedAvgMOptions(momentum=0.7, server_lr=1.0)
    options = FedAvgMServer.options_from(load_checked(path, ["methods.fedavgm.server_lr=0.5"]))
    assert options == FedAvgMOptions(momentum=0.7, server_lr=0.5)
    assert issubclass(FedAvgMServer, ServerMethod) and FedAvgMServer.client is None  # nodes train as in FedAvg
