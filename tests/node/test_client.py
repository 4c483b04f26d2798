"""A node under a coordinator answers generic tasks through its method's node side: a compute task with the
method's own step, a note task with a number per name; it knows no method by name."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from p2pfed.influence.lazy_influence import score_peers
from p2pfed.launch.adversary import conduct_of
from p2pfed.launch.runner import prepare_data, scenario_node
from p2pfed.learn.train import state_of, train_copy
from p2pfed.methods.central import pack, unpack
from p2pfed.methods.pfedlia.central import PFedLIACentralServer
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.node.client import CentralNode
from p2pfed.scenario.config import load_scenario
from p2pfed.wire import Message, WireError
from tests.scenario.test_mesh_learning import shrink, write


def central_node(tmp_path: Path, members: Callable[..., Endpoint], adversary: str | None = None) -> CentralNode:
    """Node n01 of a 3-node digits scenario, with a live coordinator in its peer table."""
    path = write(tmp_path, methods='["pfedlia-central"]')
    shrink(path, nodes=3, clusters=1, rounds=4)
    path.write_text(path.read_text() + "\n[methods.ifca-cam]\nwarmup = 1\n")
    if adversary:
        path.write_text(path.read_text() + f'\n[[adversaries]]\nnode = 1\nkind = "{adversary}"\n')
    scenario = load_scenario(path)
    dataset, partition = prepare_data(scenario)
    given = scenario_node(scenario, 1, dataset, partition)
    node = CentralNode(scenario, given, None, members("n01", options=MeshOptions()), tmp_path,
                       conduct=conduct_of(scenario, 1))
    node.endpoint.peers.heard_from("coord", "tcp://127.0.0.1:9", "coordinator", 1, "", 0)
    return node


def task(kind: str, method: str, models: list[dict[str, torch.Tensor]], names: tuple[str, ...] | list[str] = (),
         rnd: int = 2) -> Message:
    body = {"kind": kind, "method": method, "groups": [], "names": list(names), "shared": 0, "meta": {}}
    return Message("task", "coord", round=rnd, body=body, tensors=pack(models))


def shifted(state: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    return {k: v + by if v.is_floating_point() else v for k, v in state.items()}


async def test_a_note_task_is_answered_with_the_methods_number_for_each_name_in_order(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    node = central_node(tmp_path, members)
    w0 = node.reference
    partials = [shifted(w0, 0.01), shifted(w0, -0.02)]
    reply = await node._on_task(task("note", "pfedlia-central", [w0, *partials], ["n02", "n00"]))
    assert reply is not None and reply.type == "note" and reply.body["kind"] == "answer"
    expected = score_peers(node.model, w0, partials, node.data.x_val, node.data.y_val, node.device)
    assert reply.body["names"] == ["n02", "n00"] and reply.body["values"] == expected
    record = json.loads((tmp_path / "n01.jsonl").read_text().splitlines()[-1])
    assert (record["event"], record["peers"], record["values"]) == ("scores", ["n02", "n00"], expected)
    assert record["round"] == 2
    # told its method by the task, it advertises the recipe it now trains, as a node told at start does
    assert node.endpoint.recipe == node.scenario.fingerprint("pfedlia-central", (1, 8, 8), 10, "classification")


async def test_a_compute_task_of_pfedlia_is_answered_with_the_partial_model_and_the_own_model_is_unchanged(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    node = central_node(tmp_path, members)
    w0, before = shifted(node.reference, 0.05), state_of(node.model)
    reply = await node._on_task(task("compute", "pfedlia-central", [w0]))
    assert reply is not None and reply.type == "model" and reply.body["kind"] == "update"
    [partial] = unpack(reply.tensors, node.reference)
    cfg = PFedLIACentralServer.options_from(node.scenario)
    n = min(cfg.lia_batch, node.data.samples)
    expected = train_copy(node.model, w0, node.data.x_train[:n], node.data.y_train[:n], epochs=cfg.lia_epochs,
                          batch_size=node.cfg.batch_size, lr=cfg.lia_lr, seed=node.scenario.seed + 1,
                          device=node.device)
    assert all(torch.equal(partial[k], expected[k]) for k in expected)
    assert not all(torch.equal(partial[k], w0[k]) for k in w0 if w0[k].is_floating_point())  # it trained
    assert all(torch.equal(node.model.state_dict()[k], before[k]) for k in before)


@pytest.mark.parametrize("adversary", ["free-rider", "noise-model"])
async def test_an_adversarys_partial_model_is_what_it_would_send(
        tmp_path: Path, members: Callable[..., Endpoint], adversary: str) -> None:
    node = central_node(tmp_path, members, adversary)
    w0 = shifted(node.reference, 0.05)
    reply = await node._on_task(task("compute", "pfedlia-central", [w0]))
    assert reply is not None
    [partial] = unpack(reply.tensors, node.reference)
    floats = [k for k in w0 if w0[k].is_floating_point()]
    assert all(torch.equal(partial[k], w0[k]) for k in floats) == (adversary == "free-rider")


@pytest.mark.parametrize(("message", "reason"), [
    (lambda w0: task("note", "fedavg", [w0, w0], ["n00"]), "ClientMethod takes no note tasks"),
    (lambda w0: task("compute", "fedavg", [w0]), "ClientMethod takes no compute tasks"),
    (lambda w0: task("note", "pfedlia-central", [w0, w0], ["n00", "n02"]), "a score task is w0 and one named"),
    (lambda w0: task("compute", "pfedlia-central", [w0, w0]), "a partial model is trained from one model"),
    (lambda w0: task("score", "pfedlia-central", [w0]), "unknown task 'score'"),
])
async def test_a_task_the_method_does_not_take_is_refused(
        tmp_path: Path, members: Callable[..., Endpoint], message: Callable[..., Message], reason: str) -> None:
    node = central_node(tmp_path, members)
    with pytest.raises(WireError, match=reason):
        await node._on_task(message(node.reference))


def train_task(method: str, models: list[dict[str, torch.Tensor]], shared: int, **meta: int) -> Message:
    body = {"kind": "train", "method": method, "groups": [], "names": [], "shared": shared, "meta": meta}
    return Message("task", "coord", round=2, body=body, tensors=pack(models))


@pytest.mark.parametrize(("method", "shared", "sent"), [
    ("fedavg", 0, 1),  # one model: it sends it back
    ("fedavg-ensemble", 3, 3),  # K shared members, no candidate: every member back, untrained, in order
    ("ifca-cam", 1, 2),  # the global model shared, a cluster model chosen: the cluster part, then the global
])
async def test_a_free_rider_sends_back_every_model_it_was_given_untrained(
        tmp_path: Path, members: Callable[..., Endpoint], method: str, shared: int, sent: int) -> None:
    node = central_node(tmp_path, members, "free-rider")
    given = [shifted(node.reference, 0.01 * (i + 1)) for i in range(sent)]
    reply = await node._on_task(train_task(method, given, shared))
    assert reply is not None and reply.type == "model"
    back = unpack(reply.tensors, node.reference)
    expected = [*given[shared:], *given[:shared]]  # the update's order: the candidate trained, then the shared ones
    assert len(back) == sent
    assert all(torch.equal(b[k], e[k]) for b, e in zip(back, expected, strict=True) for k in e)


async def test_a_free_rider_given_no_model_sends_back_the_one_it_held_untrained(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    node = central_node(tmp_path, members, "free-rider")
    held = shifted(node.reference, 0.03)
    node.model.load_state_dict(held)  # e.g. FedFM's global model, kept from the round's anchor exchange
    reply = await node._on_task(train_task("fedfm", [], 0, matching=True))
    assert reply is not None
    [back] = unpack(reply.tensors, node.reference)
    assert all(torch.equal(back[k], held[k]) for k in held)
    assert all(torch.equal(node.model.state_dict()[k], held[k]) for k in held)  # nor did it keep any training


async def test_a_free_rider_of_a_method_that_trains_its_own_model_sends_that_back_not_its_peers(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    node = central_node(tmp_path, members, "free-rider")
    held = shifted(node.reference, 0.02)
    node.model.load_state_dict(held)
    peers = [shifted(node.reference, 0.5), shifted(node.reference, -0.5)]  # FedFomo's downloads: peers' models
    reply = await node._on_task(train_task("fedfomo", peers, 0))
    assert reply is not None
    [back] = unpack(reply.tensors, node.reference)
    assert all(torch.equal(back[k], held[k]) for k in held)
