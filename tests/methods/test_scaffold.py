"""SCAFFOLD (a baseline of FedFM, Ye et al. 2023): the coordinator's steps on w and c, the node's corrected local
steps and option II's c_i⁺, control variates checked at both ends, c at a coordinator restart and c_i at a node
restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from p2pfed.config import ConfigError
from p2pfed.launch.runner import prepare_data, scenario_node
from p2pfed.learn.checkpoint import load_own, save_atomic
from p2pfed.learn.train import train_epochs
from p2pfed.methods import load_checked
from p2pfed.methods.baselines import FedAvgServer
from p2pfed.methods.central import Task, Update, aux_of, pack, unpack
from p2pfed.methods.scaffold import ScaffoldClient, ScaffoldOptions, ScaffoldServer, moving_steps
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.node.client import CentralNode
from p2pfed.wire import Message, WireError
from tests.methods.fake import FakeCoordinator, vec
from tests.scenario.test_mesh_learning import shrink, write

CPU = torch.device("cpu")


# -- the coordinator ---------------------------------------------------------------------------------
def server(server_lr: float = 1.0, nodes: tuple[str, ...] = ("a", "b", "c", "d")) -> ScaffoldServer:
    method = ScaffoldServer(FakeCoordinator(lambda n, t: None, dim=2), ScaffoldOptions(server_lr=server_lr))
    asyncio.run(method.before_round(0, list(nodes)))
    return method


def up(y: tuple[float, float], dc: tuple[float, float], samples: int = 1) -> Update:
    return Update(vec(*y), samples, aux=vec(*dc))


ROUNDS = [{"a": up((1, 0), (1, 1)), "b": up((3, 2), (3, -1), samples=3)},
          {"a": up((2, 2), (0, 2)), "c": up((0, 0), (2, 0)), "d": up((1, 1), (1, 1))}]


def test_w_steps_by_the_mean_model_change_and_c_by_the_participants_share_of_the_mean_dc() -> None:
    method = server(server_lr=0.5)
    task = method.train_task(0, "a")
    assert task.models == [method.models[0]] and task.aux["w"].tolist() == [0.0, 0.0]  # w and c travel together
    method.aggregate(0, ROUNDS[0])
    # Δy by samples: (2.5, 1.5); w = 0 + 0.5·Δy. Δc plain mean (2, 0), 2 of 4 nodes: c = 0 + 2/4·(2, 0)
    assert method.models[0]["w"].tolist() == [1.25, 0.75] and method.control["w"].tolist() == [1.0, 0.0]
    assert method.train_task(1, "b").aux["w"].tolist() == [1.0, 0.0]
    method.aggregate(1, ROUNDS[1])
    # Δy = (1, 1) − (1.25, 0.75); w += 0.5·Δy. Δc mean (1, 1), 3 of 4: c += 0.75·(1, 1)
    assert method.models[0]["w"].tolist() == [1.125, 0.875] and method.control["w"].tolist() == [1.75, 0.75]


def test_with_a_unit_step_and_no_correction_a_round_is_fedavg() -> None:
    method, fedavg = server(), FedAvgServer(FakeCoordinator(lambda n, t: None, dim=2), None)
    asyncio.run(fedavg.before_round(0, ["a", "b", "c", "d"]))
    for rnd, updates in enumerate(ROUNDS):
        method.aggregate(rnd, updates)
        fedavg.aggregate(rnd, updates)
        assert torch.allclose(method.models[0]["w"], fedavg.models[0]["w"])


@pytest.mark.parametrize("dc", [{"w": torch.tensor([1.0, float("nan")])}, {"w": torch.ones(3)}, {},
                                {"w": torch.ones(2, dtype=torch.float64)}, {"w": torch.ones(2), "v": torch.ones(1)}])
def test_an_update_with_a_malformed_dc_is_left_out_whole(dc: dict[str, torch.Tensor]) -> None:
    method = server()
    method.aggregate(0, {"a": Update(vec(8, 8), 1, aux=dc), "b": up((2, 0), (4, 2))})
    # only b's: w = b's y, c = 1/4 of b's Δc
    assert method.models[0]["w"].tolist() == [2.0, 0.0] and method.control["w"].tolist() == [1.0, 0.5]


def test_a_restarted_coordinator_resumes_with_the_same_c(tmp_path: Path) -> None:
    method = server(server_lr=0.5)
    method.aggregate(0, ROUNDS[0])
    data, models = method.state()
    save_atomic({"data": json.dumps(data), "models": models}, tmp_path / "coordinator.safetensors")  # as it does
    ckpt = load_own(tmp_path / "coordinator.safetensors")
    restarted = ScaffoldServer(FakeCoordinator(lambda n, t: None, dim=2), ScaffoldOptions(server_lr=0.5))
    restarted.restore(json.loads(ckpt["data"]), ckpt["models"])
    assert restarted.train_task(1, "a").aux["w"].tolist() == [1.0, 0.0]
    for m in (method, restarted):
        m.aggregate(1, ROUNDS[1])
    assert restarted.models[0]["w"].tolist() == method.models[0]["w"].tolist() == [1.125, 0.875]
    assert restarted.control["w"].tolist() == method.control["w"].tolist() == [1.75, 0.75]


# -- the node ----------------------------------------------------------------------------------------
class FakeNode:
    """A node whose data loss is ⟨a, w⟩ (a constant gradient a) on 10 samples, trained by the real loop."""

    def __init__(self, a: torch.Tensor, momentum: float = 0.0) -> None:
        self.own = nn.Linear(2, 1, bias=False)
        self.a, self.name, self.device = a, "n", CPU
        self.cfg = SimpleNamespace(epochs=2, batch_size=4, lr=0.1, momentum=momentum)  # 3 steps an epoch: 4, 4, 2

    async def fit(self, module: nn.Module, penalty: Any = None, epochs: Any = None, loss_fn: Any = None) -> float:
        return train_epochs(module, torch.zeros(10, 2), torch.zeros(10, dtype=torch.long), epochs=self.cfg.epochs,
                            batch_size=self.cfg.batch_size, lr=self.cfg.lr, momentum=self.cfg.momentum, seed=0,
                            device=CPU, penalty=penalty, loss_fn=lambda m, x, y: (m.weight * self.a).sum())


def train(client: ScaffoldClient, w: list[float], c: list[float]) -> Update:
    task = Task("train", [{"weight": torch.tensor([w])}], aux={"weight": torch.tensor([c])})
    update, choice = asyncio.run(client.train(task))
    assert choice == 0
    return update


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_option_two_recovers_the_nodes_gradient_with_or_without_momentum(momentum: float) -> None:
    a = torch.tensor([[0.5, -1.0]])
    client = ScaffoldClient(FakeNode(a, momentum))  # type: ignore[arg-type]
    client.restore({"weight": torch.tensor([[0.2, 0.2]])})  # c_i
    update = train(client, [1.0, 1.0], [1.0, 0.0])
    # 6 steps of the corrected gradient a − c_i + c, each lr 0.1, stretched by momentum
    d = a - torch.tensor([[0.2, 0.2]]) + torch.tensor([[1.0, 0.0]])
    moved = moving_steps(6, momentum) * 0.1
    assert moving_steps(6, 0.0) == 6 and moving_steps(2, 0.9) == pytest.approx(1 + 1.9)
    assert torch.allclose(update.state["weight"], torch.tensor([[1.0, 1.0]]) - moved * d, atol=1e-5)  # type: ignore[index]
    # c_i⁺ = c_i − c + (w − y)/(Kη) is the node's gradient a; Δc = c_i⁺ − c_i
    assert torch.allclose(client.state()["weight"], a, atol=1e-5)
    assert torch.allclose(update.aux["weight"], a - torch.tensor([[0.2, 0.2]]), atol=1e-5)


def test_a_node_starts_with_c_i_zero_and_keeps_c_i_between_rounds() -> None:
    a = torch.tensor([[0.5, -1.0]])
    client = ScaffoldClient(FakeNode(a))  # type: ignore[arg-type]
    assert client.state() == {}
    first = train(client, [0.0, 0.0], [0.0, 0.0])
    assert torch.allclose(first.aux["weight"], a) and torch.allclose(client.state()["weight"], a)  # from 0 to a
    second = train(client, [0.0, 0.0], [0.3, 0.3])
    assert torch.allclose(second.aux["weight"], torch.zeros(1, 2), atol=1e-5)  # a again: no change


@pytest.mark.parametrize("c", [{"weight": torch.tensor([[1.0, float("inf")]])}, {"weight": torch.ones(2)},
                               {}, {"weight": torch.ones(1, 2), "bias": torch.ones(1)}])
def test_a_node_refuses_a_task_whose_c_is_malformed(c: dict[str, torch.Tensor]) -> None:
    client = ScaffoldClient(FakeNode(torch.ones(1, 2)))  # type: ignore[arg-type]
    with pytest.raises(WireError):
        asyncio.run(client.train(Task("train", [{"weight": torch.ones(1, 2)}], aux=c)))
    assert client.state() == {}


# -- options and the node's checkpoint ---------------------------------------------------------------
def scenario_file(tmp_path: Path, table: str = "") -> Path:
    path = write(tmp_path, methods='["scaffold"]')
    shrink(path, nodes=3, clusters=1, rounds=4)
    path.write_text(path.read_text() + f"\n[methods.scaffold]\n{table}\n")
    return path


@pytest.mark.parametrize(("table", "message"), [
    ("server_lr = 0", "methods.scaffold.server_lr must be > 0 (got 0.0)"),
    ("server_lr = inf", "methods.scaffold.server_lr must be > 0 (got inf)"),
    ("option = 1", "methods.scaffold.option is not a known key (known: server_lr)"),
])
def test_an_option_that_cannot_work_is_named_with_its_file_and_key(tmp_path: Path, table: str, message: str) -> None:
    path = scenario_file(tmp_path, table)
    with pytest.raises(ConfigError) as caught:
        load_checked(path)
    assert str(path) in str(caught.value) and message in str(caught.value)
    assert ScaffoldServer.options_from(load_checked(scenario_file(tmp_path, "server_lr = 0.5"))).server_lr == 0.5


def central_node(tmp_path: Path, members: Callable[..., Endpoint], method: str | None) -> CentralNode:
    scenario = load_checked(scenario_file(tmp_path))
    dataset, partition = prepare_data(scenario)
    given = scenario_node(scenario, 1, dataset, partition)
    node = CentralNode(scenario, given, method, members("n01", options=MeshOptions()), tmp_path)
    node.endpoint.peers.heard_from("coord", "tcp://127.0.0.1:9", "coordinator", 1, "", 0)
    return node


async def test_a_restarted_node_keeps_its_c_i_from_its_checkpoint(tmp_path: Path, members: Callable[..., Endpoint]
                                                                   ) -> None:
    node = central_node(tmp_path, members, "scaffold")
    params = {n for n, p in node.model.named_parameters()}
    c = {n: torch.full_like(t, 0.01) for n, t in node.reference.items() if n in params}
    body = {"kind": "train", "method": "scaffold", "groups": [], "names": [], "shared": 0, "meta": {}}
    reply = await node._on_task(Message("task", "coord", round=2, body=body, tensors=pack([node.reference], c)))
    assert reply is not None and reply.body["kind"] == "update"
    [_] = unpack(reply.tensors, node.reference)
    dc = aux_of(reply.tensors)  # Δc = c_i⁺ − 0 travels as the update's aux tensors, one per parameter
    assert dc.keys() == c.keys() and any(bool(t.abs().sum() > 0) for t in dc.values())
    assert node.client is not None
    kept = node.client.state()
    assert all(torch.equal(kept[n], dc[n]) for n in c)
    # a restart with the method named, and one that learns it from the first task
    for method in ("scaffold", None):
        again = central_node(tmp_path, members, method)
        again.restore()
        client = again._method_for("scaffold")
        assert all(torch.equal(client.state()[n], kept[n]) for n in c), method
