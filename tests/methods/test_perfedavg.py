"""Per-FedAvg (a baseline of FedDSMIC, Li et al. 2022): first-order MAML with independent batches, one global model, a
personalisation step at each node, and its own options table [methods.perfedavg] that reaches the node side
typed. Added as one module (methods/perfedavg.py) and registered by name: the test of the method interface."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from p2pfed.config import ConfigError
from p2pfed.launch.runner import prepare_data, scenario_node
from p2pfed.learn.train import evaluate, maml_first_order, one_step, state_of
from p2pfed.methods import load_checked
from p2pfed.methods.central import pack, unpack
from p2pfed.methods.perfedavg import PerFedAvgOptions, PerFedAvgServer
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.node.client import CentralNode
from p2pfed.wire import Message
from tests.scenario.test_mesh_learning import shrink, write

CPU = torch.device("cpu")


def test_first_order_maml_with_independent_batches_takes_the_outer_gradient_on_the_next_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 4, generator=gen), torch.randint(0, 3, (24,), generator=gen)  # three batches
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    expected = copy.deepcopy(model)
    maml_first_order(model, x, y, epochs=1, batch_size=8, inner_lr=0.3, outer_lr=0.1, seed=5, device=CPU,
                     independent=True)
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(5))
    batches = [perm[:8], perm[8:16], perm[16:]]
    loss = nn.functional.cross_entropy
    for i, batch in enumerate(batches):  # by hand: ŵ on D, the step from w with ŵ's gradient on D'
        w = [p.detach().clone() for p in expected.parameters()]
        grads = torch.autograd.grad(loss(expected(x[batch]), y[batch]), list(expected.parameters()))
        with torch.no_grad():
            for p, g in zip(expected.parameters(), grads, strict=True):
                p.sub_(0.3 * g)
        other = batches[(i + 1) % 3]  # the next batch, the first after the last
        grads = torch.autograd.grad(loss(expected(x[other]), y[other]), list(expected.parameters()))
        with torch.no_grad():
            for p, w0, g in zip(expected.parameters(), w, grads, strict=True):
                p.copy_(w0 - 0.1 * g)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(model.parameters(), expected.parameters(), strict=True))
    same = copy.deepcopy(model)
    maml_first_order(same, x, y, epochs=1, batch_size=8, inner_lr=0.3, outer_lr=0.1, seed=5, device=CPU)
    assert not torch.allclose(same.weight, model.weight)  # D' = D (FedDSMIC's) is another update


def scenario_file(tmp_path: Path, table: str) -> Path:
    path = write(tmp_path, methods='["perfedavg"]')
    shrink(path, nodes=3, clusters=1, rounds=4)
    path.write_text(path.read_text() + f"\n[methods.perfedavg]\n{table}\n")
    return path


@pytest.mark.parametrize(("table", "overrides", "message"), [
    ("inner_lr = 0", [], "methods.perfedavg.inner_lr must be > 0 (got 0.0)"),
    ("personal_steps = -1", [], "methods.perfedavg.personal_steps must be in [0, 100] (got -1)"),
    ("beta = 0.1", [], "methods.perfedavg.beta is not a known key (known: inner_lr, personal_steps)"),
    ("inner_lr = 'fast'", [], "methods.perfedavg.inner_lr must be float (got str 'fast')"),
    ("", ["methods.perfedavg.inner_lr=-1"], "methods.perfedavg.inner_lr must be > 0 (got -1.0)"),
    ("", ["methods.nosuch.x=1"], "[methods.nosuch]: 'nosuch' is not a known method"),
    ("", ["methods.fedavg.x=1"], "[methods.fedavg]: fedavg has no options"),
])
def test_an_option_that_cannot_work_is_named_with_its_file_and_key(
        tmp_path: Path, table: str, overrides: list[str], message: str) -> None:
    path = scenario_file(tmp_path, table)
    with pytest.raises(ConfigError) as caught:
        load_checked(path, overrides)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_a_set_that_names_no_key_of_a_method_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--set 'methods.perfedavg=1': expected TABLE.KEY=VALUE .* or "
                       r"methods.NAME.KEY=VALUE"):
        load_checked(scenario_file(tmp_path, ""), ["methods.perfedavg=1"])


def test_the_options_table_and_set_overrides_reach_the_method(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, "inner_lr = 0.05")
    assert PerFedAvgServer.options_from(load_checked(path)) == PerFedAvgOptions(inner_lr=0.05, personal_steps=1)
    overridden = load_checked(path, ["methods.perfedavg.personal_steps=3"])
    assert PerFedAvgServer.options_from(overridden) == PerFedAvgOptions(inner_lr=0.05, personal_steps=3)
    (tmp_path / "plain").mkdir()
    untouched = load_checked(write(tmp_path / "plain", methods='["perfedavg"]'))
    assert PerFedAvgServer.options_from(untouched) == PerFedAvgOptions()


def central_node(tmp_path: Path, members: Callable[..., Endpoint], table: str) -> CentralNode:
    scenario = load_checked(scenario_file(tmp_path, table))
    dataset, partition = prepare_data(scenario)
    given = scenario_node(scenario, 1, dataset, partition)
    node = CentralNode(scenario, given, None, members("n01", options=MeshOptions()), tmp_path)
    node.endpoint.peers.heard_from("coord", "tcp://127.0.0.1:9", "coordinator", 1, "", 0)
    return node


def task(kind: str, model: dict[str, torch.Tensor], rnd: int = 2) -> Message:
    body = {"kind": kind, "method": "perfedavg", "groups": [], "names": [], "shared": 0, "meta": {}}
    return Message("task", "coord", round=rnd, body=body, tensors=pack([model]))


async def test_a_node_trains_the_global_model_by_maml_with_the_tables_inner_rate(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    node = central_node(tmp_path, members, "inner_lr = 0.05")
    start = {k: v + 0.01 if v.is_floating_point() else v for k, v in node.reference.items()}
    reply = await node._on_task(task("train", start))
    assert reply is not None and reply.body["kind"] == "update"
    [trained] = unpack(reply.tensors, node.reference)
    model = node.new_model(start)
    cfg = node.cfg
    maml_first_order(model, node.data.x_train, node.data.y_train, epochs=cfg.epochs, batch_size=cfg.batch_size,
                     inner_lr=0.05, outer_lr=cfg.lr, seed=node.round_seed, device=node.device, independent=True)
    assert all(torch.equal(trained[k], v) for k, v in state_of(model).items())


@pytest.mark.parametrize("steps", [0, 2])
async def test_a_node_is_evaluated_after_the_tables_personalisation_steps(
        tmp_path: Path, members: Callable[..., Endpoint], steps: int) -> None:
    node = central_node(tmp_path, members, f"inner_lr = 0.2\npersonal_steps = {steps}")
    start = {k: v + 0.01 if v.is_floating_point() else v for k, v in node.reference.items()}
    reply = await node._on_task(task("eval", start))
    assert reply is not None and reply.type == "control"
    model = node.new_model(start)
    for step in range(steps):
        one_step(model, node.data.x_train, node.data.y_train, lr=0.2, batch_size=node.cfg.batch_size,
                 seed=node.round_seed + step, device=node.device)
    expected = evaluate(model, node.data.x_test, node.data.y_test, node.device)
    assert reply.body["meta"]["accuracy"] == expected.accuracy and reply.body["meta"]["loss"] == expected.loss
    record = json.loads((tmp_path / "n01.jsonl").read_text().splitlines()[-1])
    assert record["event"] == "round" and record["method"] == "perfedavg"
    assert node.client is not None and node.client.options == PerFedAvgOptions(inner_lr=0.2, personal_steps=steps)
