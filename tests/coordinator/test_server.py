"""The coordinator over real sockets: it clusters, serves a late joiner by the method's rule, is not
stalled by a crashed node, and resumes from its checkpoint after a crash of its own."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from p2pfed.config import ConfigError
from p2pfed.coordinator.server import Coordinator
from p2pfed.launch.runner import make_coordinator, mesh_options, prepare_data, run_scenario, scenario_node
from p2pfed.learn.partition import server_samples
from p2pfed.methods import load_checked
from p2pfed.methods.central import Instructions, Task, pack
from p2pfed.net import security
from p2pfed.net.endpoint import Endpoint
from p2pfed.node.client import CentralNode
from p2pfed.scenario.config import Scenario, load_scenario
from p2pfed.wire import Message, WireError
from tests.scenario.test_mesh_learning import LATE_AND_CRASH, shrink, write


def coordinator_records(out: Path, method: str) -> list[dict]:
    return [json.loads(line) for line in (out / method / "coordinator.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 30 rounds of 9 nodes (35 s under coverage on 2 cores); CI runs the slow tests too
def test_pfedlia_central_clusters_places_a_late_joiner_and_a_crash_does_not_stall_a_round(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, methods='["pfedlia-central"]', events=LATE_AND_CRASH))
    out = tmp_path / "run"
    run_scenario(scenario, out)
    summary = json.loads((out / "summary.json").read_text())["methods"]["pfedlia-central"]
    assert summary["ari"] == 1.0 and summary["nodes_finished"] == 9 and summary["accuracy"] > 0.9
    records = coordinator_records(out, "pfedlia-central")
    final = records[-1]["assignment"]
    assert final["n08"] == final["n06"] == final["n07"]  # the late joiner went to its true cluster
    rounds = [r for r in records if r["event"] == "round"]
    assert [r["round"] for r in rounds] == list(range(scenario.rounds))
    assert max(r["seconds"] for r in rounds[3:8]) < scenario.train.round_timeout / 2  # crash at 6: no stall
    assert rounds[-1]["sizes"] == [3, 3, 3]
    assert (out / "clusters.png").stat().st_size > 1000 and (out / "influence-pfedlia-central.png").exists()


def test_a_restarted_coordinator_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    path = write(tmp_path, methods='["fedavg"]')
    shrink(path, nodes=3, clusters=1, rounds=8)
    scenario = load_scenario(path)
    dataset, partition = prepare_data(scenario)
    out = tmp_path / "run" / "fedavg"
    out.mkdir(parents=True)
    options = mesh_options(scenario, "fedavg")
    keys = security.ephemeral_keys()  # the coordinator's, kept across its restart as its key folder keeps it

    async def coordinator(boot: str) -> tuple[Endpoint, Coordinator]:
        endpoint = Endpoint("coordinator", "coordinator", options=options, keys=keys)
        await endpoint.start("tcp://127.0.0.1:0", [boot])
        return endpoint, make_coordinator(scenario, "fedavg", endpoint, dataset, partition, out)

    async def main() -> None:
        boot = Endpoint("bootstrap", "bootstrap", options=options)
        await boot.start("tcp://127.0.0.1:0")
        nodes = []
        for i in range(3):
            endpoint = Endpoint(scenario.node_name(i), options=options)
            await endpoint.start("tcp://127.0.0.1:0", [boot.ticket])
            nodes.append(CentralNode(scenario, scenario_node(scenario, i, dataset, partition), None, endpoint, out))
        runs = [asyncio.ensure_future(n.run()) for n in nodes]
        endpoint, first = await coordinator(boot.ticket)
        task = asyncio.ensure_future(first.run(wait_for=3))
        while not first.checkpoint_path.exists() or first.round < 4:
            await asyncio.sleep(0.05)
        task.cancel()  # the coordinator dies mid-run, without a goodbye
        await asyncio.gather(task, return_exceptions=True)
        await endpoint.stop(leave=False)
        endpoint, second = await coordinator(boot.ticket)
        await second.run(wait_for=3)
        await asyncio.wait_for(asyncio.gather(*runs), 30)  # every node got its final model and ended
        await endpoint.stop()
        for node in nodes:
            await node.endpoint.stop()
        await boot.stop()

    asyncio.run(main())
    records = coordinator_records(tmp_path / "run", "fedavg")
    rounds = [r["round"] for r in records if r["event"] == "round"]
    # every round once, in order: the second coordinator went on after the last checkpointed round (a round's
    # record and its checkpoint are written together, so no round is lost or repeated)
    assert rounds == list(range(8))
    for i in range(3):
        lines = (out / f"n{i:02d}.jsonl").read_text().splitlines()
        assert json.loads(lines[-1])["event"] == "final"
        assert json.loads(lines[0])["method"] == "fedavg"  # the nodes were told their method by the coordinator


def small(tmp_path: Path, method: str = "fedavg") -> tuple[Scenario, Any, Any]:
    path = write(tmp_path, methods=f'["{method}"]')
    shrink(path, nodes=3, clusters=1, rounds=4)
    scenario = load_scenario(path)
    return (scenario, *prepare_data(scenario))


def update(coordinator: Coordinator, models: int = 1, samples: int = 5, kind: str = "update",
           mtype: str = "model", **meta: Any) -> Message:
    states = [coordinator.initial] * models
    return Message(mtype, "n00", body={"kind": kind, "samples": samples, "meta": meta}, tensors=pack(states))


@pytest.mark.parametrize(("task", "reply", "reason"), [
    (Task("train"), lambda c: update(c, kind="model"), "expected an update, got model model"),
    (Task("train"), lambda c: update(c, samples=0), "expected an update"),
    (Task("train"), lambda c: Message("ack", "n00", body={"ref": "x", "ok": True, "reason": ""}),
     "expected an update, got ack"),
    (Task("compute"), lambda c: Message("control", "n00", body={"kind": "metrics", "meta": {}}),
     "expected an update, got control"),
    (Task("train", models=[{}, {}]), lambda c: update(c, choice=2), "choice 2 is not one of the 2 candidates"),
    (Task("train", models=[{}, {}]), lambda c: update(c, choice="0"), "choice '0' is not one of"),
    (Task("train"), lambda c: Message("model", "n00", body={"kind": "update", "samples": 5, "meta": {}},
                                      tensors={"0/nope": torch.zeros(1)}), "local model"),
    (Task("note", names=["n01", "n02"]), lambda c: Message(
        "note", "n00", body={"kind": "answer", "names": ["n02", "n01"], "values": [0.1, 0.2], "meta": {}}),
     "expected one finite number per name of the note task, in the order sent"),
    (Task("note", names=["n01", "n02"]), lambda c: Message(
        "note", "n00", body={"kind": "answer", "names": ["n01", "n02"], "values": [0.1], "meta": {}}),
     "expected one finite number per name"),
    (Task("note", names=["n01"]), lambda c: update(c), "expected one finite number per name"),
    (Task("note", names=["n01"]), lambda c: Message(
        "note", "n00", body={"kind": "choices", "names": ["n01"], "values": [0.1], "meta": {}}),
     "expected one finite number per name"),
    (Task("eval"), lambda c: Message("control", "n00", body={"kind": "hello", "meta": {}}),
     "expected metrics, got control"),
    (Task("finish"), lambda c: update(c), "expected metrics, got model"),
])
async def test_a_reply_that_does_not_answer_its_task_is_refused(
        tmp_path: Path, members: Callable[..., Endpoint], task: Task, reply: Callable[[Coordinator], Message],
        reason: str) -> None:
    scenario, dataset, partition = small(tmp_path)
    coordinator = make_coordinator(scenario, "fedavg", members("coordinator", "coordinator"), dataset, partition,
                                   tmp_path)
    with pytest.raises(WireError, match=re.escape(reason)):
        coordinator._read(task, reply(coordinator))
    good = coordinator._read(Task("train", models=[{}, {}]), update(coordinator, choice=1, train_loss=0.5))
    assert good.samples == 5 and good.choice == 1 and good.train_loss == 0.5 and good.state is not None
    assert all(torch.equal(good.state[k], v) for k, v in coordinator.initial.items())
    answer = Message("note", "n00", body={"kind": "answer", "names": ["n02", "n01"], "values": [0.5, -1.0], "meta": {}})
    assert coordinator._read(Task("note", names=["n02", "n01"]), answer) == {"n02": 0.5, "n01": -1.0}


async def test_a_checkpoint_of_another_method_is_refused_not_resumed(tmp_path: Path,
                                                                    members: Callable[..., Endpoint]) -> None:
    scenario, dataset, partition = small(tmp_path)
    fedavg = make_coordinator(scenario, "fedavg", members("c1", "coordinator"), dataset, partition, tmp_path)
    fedavg.checkpoint(2)
    again = make_coordinator(scenario, "fedavg", members("c2", "coordinator"), dataset, partition, tmp_path)
    assert again.restore() == 3
    local = make_coordinator(scenario, "local", members("c3", "coordinator"), dataset, partition, tmp_path)
    with pytest.raises(ValueError, match="is a checkpoint of fedavg, not local"):
        local.restore()


def scripted(coordinator: Coordinator, live: list[str], answers: Callable[[int, str], bool]
             ) -> tuple[list[tuple[int, float]], list[tuple[list[str], dict[str, str], float | None]]]:
    """Run the coordinator's loop without sockets: live is who the mesh says is alive, a round only places the
    live nodes (so the record has an assignment), and answers(call, node) says whether node answers the call-th
    request. Return the rounds run (with seconds since the start) and the requests (nodes, task kinds, timeout)."""
    rounds: list[tuple[int, float]] = []
    asked: list[tuple[list[str], dict[str, str], float | None]] = []
    t0 = time.monotonic()

    async def run_round(rnd: int) -> None:
        rounds.append((rnd, time.monotonic() - t0))
        await coordinator.method.before_round(rnd, list(live))

    async def ask(nodes: list[str], tasks: dict[str, Task], timeout: float | None = None) -> dict[str, Any]:
        asked.append((list(nodes), {n: t.kind for n, t in tasks.items()}, timeout))
        return {n: {"accuracy": 0.5} for n in nodes if answers(len(asked), n)}

    coordinator.run_round = run_round  # type: ignore[method-assign]
    coordinator.ask = ask  # type: ignore[method-assign]
    coordinator.live_nodes = lambda: sorted(live)  # type: ignore[method-assign]
    return rounds, asked


async def test_after_the_last_round_every_node_is_finished_and_a_late_one_gets_a_longer_second_try(
        tmp_path: Path, members: Callable[..., Endpoint], caplog: pytest.LogCaptureFixture) -> None:
    scenario, dataset, partition = small(tmp_path)
    coordinator = make_coordinator(scenario, "fedavg", members("coordinator", "coordinator"), dataset, partition,
                                   tmp_path)
    coordinator.checkpoint(1)  # it restarts after round 1
    live = ["n00", "n01", "n02"]
    busy = {"n01", "n02"}  # still on a late task when the finish comes
    rounds, asked = scripted(coordinator, live, lambda call, node: node not in busy or call > 1)
    with caplog.at_level(logging.INFO, logger="p2pfed.coordinator.server"):
        await asyncio.wait_for(coordinator.run(), 10)
    assert [r for r, _ in rounds] == [2, 3]
    deadline = scenario.train.round_timeout
    assert asked == [(live, {n: "finish" for n in live}, None),
                     (["n01", "n02"], {"n01": "finish", "n02": "finish"}, 3 * deadline)]
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:2] == ["coordinator: resumed fedavg from its checkpoint after round 1",
                            "coordinator: fedavg with 3 nodes from round 2"]
    assert "coordinator: finish again for n01, n02" in messages
    final = coordinator_records(tmp_path.parent, tmp_path.name)[-1]
    assert final["event"] == "final"
    assert final["assignment"] == {"n00": 0, "n01": 0, "n02": 0} and final["sizes"] == [3]
    assert final["bytes_sent"] == coordinator.endpoint.transport.bytes_sent


async def test_the_coordinator_waits_for_the_nodes_it_is_told_to_wait_for_and_otherwise_starts_at_once(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    scenario, dataset, partition = small(tmp_path)
    coordinator = make_coordinator(scenario, "fedavg", members("c1", "coordinator"), dataset, partition, tmp_path / "a")
    live: list[str] = []
    rounds, _ = scripted(coordinator, live, lambda call, node: True)
    asyncio.get_running_loop().call_later(0.3, live.extend, ["n00", "n01"])
    await coordinator.run(wait_for=2, start_timeout=5)
    assert [r for r, _ in rounds] == [0, 1, 2, 3] and 0.3 <= rounds[0][1] < 3
    alone = make_coordinator(scenario, "fedavg", members("c2", "coordinator"), dataset, partition, tmp_path / "b")
    rounds, _ = scripted(alone, [], lambda call, node: True)
    await asyncio.wait_for(alone.run(), 10)  # the defaults: nobody to wait for
    assert [r for r, _ in rounds] == [0, 1, 2, 3] and rounds[0][1] < 1


async def test_the_servers_samples_are_set_aside_before_the_nodes_get_theirs(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    path = write(tmp_path, methods='["feddsmic"]')
    shrink(path, nodes=3, clusters=1, rounds=4)
    text = path.read_text().replace("[data]\n", "[data]\nserver_per_class = 4\n")
    path.write_text(text.replace("[methods.pfedlia-p2p]", "[methods.feddsmic]\nindicator_per_class = 3\n"
                                 "[methods.pfedlia-p2p]"))
    scenario = load_checked(path)
    dataset, partition = prepare_data(scenario)
    held = set(server_samples(dataset.y_train.numpy(), 4, scenario.seed).tolist())
    assert len(held) == 40  # digits: 4 of each of its 10 classes
    dealt = {int(i) for s in partition.shards for i in [*s.train, *s.val]}
    assert not held & dealt and len(dealt) == len(dataset.y_train) - 40  # every other sample is dealt
    coordinator = make_coordinator(scenario, "feddsmic", members("coordinator", "coordinator"), dataset, partition,
                                   tmp_path)
    indicators = coordinator.data.samples(3)
    assert len(indicators) == 30
    x = dataset.x_train
    assert all(any(torch.equal(row, x[i]) for i in held) for row in indicators)  # the server's own samples
    path.write_text(path.read_text().replace("indicator_per_class = 3", "indicator_per_class = 5"))
    with pytest.raises(ConfigError, match=re.escape("indicator_per_class (5) must not exceed data.server_per_class")):
        load_checked(path)


def test_a_served_model_is_tested_on_the_servers_set_and_reported_at_its_best_validation_round(
        tmp_path: Path) -> None:
    """The protocol of FedFM (Ye et al. 2023) over real sockets: each evaluation, the nodes also validate the
    global model, and the coordinator tests it on its own held-out test samples; the report takes the round of
    the best validation."""
    path = write(tmp_path, methods='["fedavg"]')
    shrink(path, nodes=3, clusters=1, rounds=6)
    path.write_text(path.read_text().replace("[data]\n", "[data]\nserver_test = 300\n")
                    .replace("round_timeout = 20", "round_timeout = 20\neval_every = 2"))
    out = tmp_path / "run"
    run_scenario(load_checked(path), out)
    served = [r for r in coordinator_records(out, "fedavg") if r["event"] == "server"]
    assert [r["round"] for r in served] == [1, 3, 5]  # every evaluation; the finish after round 5 is round 5's
    assert all(r["validated"] == 3 and r["test_samples"] == 300 and 0 <= r["val_accuracy"] <= 1 for r in served)
    node = [json.loads(line) for line in (out / "fedavg" / "n00.jsonl").read_text().splitlines()]
    assert all(0 <= r["val_accuracy"] <= 1 for r in node if r["event"] == "round")
    best = max(served, key=lambda r: r["val_accuracy"])
    summary = json.loads((out / "summary.json").read_text())["methods"]["fedavg"]
    assert summary["server_test_accuracy"] == best["accuracy"] and summary["server_best_round"] == best["round"]
    assert "server test %" in (out / "results.md").read_text()
    with pytest.raises(ConfigError, match=r"data.server_test picks the served model .* data.val_fraction must be"):
        load_checked(path, ["data.val_fraction=0"])


async def test_only_a_served_model_is_tested_and_a_nodes_junk_validation_is_left_out(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    scenario, dataset, partition = small(tmp_path)
    scenario.data.server_test = 50
    asked: list[Instructions] = []

    def answering(coordinator: Coordinator, vals: dict[str, Any]) -> None:
        async def ask(nodes: list[str], tasks: dict[str, Task], timeout: float | None = None) -> dict[str, Any]:
            asked.extend(t.instructions for t in tasks.values())
            return {n: {"accuracy": 0.5, "val_accuracy": vals[n]} for n in nodes}
        coordinator.ask = ask  # type: ignore[method-assign]
        coordinator.live_nodes = lambda: sorted(vals)  # type: ignore[method-assign]

    fedavg = make_coordinator(scenario, "fedavg", members("c1", "coordinator"), dataset, partition, tmp_path / "a")
    await fedavg.method.before_round(0, ["n00", "n01", "n02", "n03"])
    answering(fedavg, {"n00": 0.5, "n01": 0.75, "n02": 5.0, "n03": float("nan")})
    await fedavg.evaluate("eval")
    assert [how.validate for how in asked] == [True] * 4
    record = coordinator_records(tmp_path, "a")[-1]
    assert record["event"] == "server" and record["validated"] == 2 and record["val_accuracy"] == 0.625
    assert record["test_samples"] == 50  # the seeded draw from the test split
    # the finish right after a tested round does not test the same model again; after an untested one (a resume
    # with another eval_every, say) it does
    fedavg.tested = fedavg.round = 5
    await fedavg.evaluate("finish")
    assert len(coordinator_records(tmp_path, "a")) == 1
    fedavg.tested = 3
    await fedavg.evaluate("finish")
    assert [r["round"] for r in coordinator_records(tmp_path, "a")] == [0, 5]
    asked.clear()
    ifca = make_coordinator(scenario, "ifca", members("c2", "coordinator"), dataset, partition, tmp_path / "b")
    answering(ifca, {"n00": 0.5})
    await ifca.evaluate("eval")
    assert asked and not any(how.validate for how in asked)  # cluster models: nothing one server set could test
    assert not (tmp_path / "b" / "coordinator.jsonl").exists()


def test_the_run_waits_for_the_coordinators_last_records_after_the_nodes_have_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the finish, the nodes end at once; a coordinator still testing the served model on its own test set
    (seconds on a large one) used to be cancelled then, losing its last records (the final one: bytes, clusters)."""
    slow = Coordinator.test_served

    async def slower(self: Coordinator, *args: Any) -> None:
        await asyncio.sleep(2.0)
        await slow(self, *args)

    monkeypatch.setattr(Coordinator, "test_served", slower)
    path = write(tmp_path, methods='["fedavg"]')
    shrink(path, nodes=3, clusters=1, rounds=3)  # evaluations after round 1 only: the finish tests round 2's model
    path.write_text(path.read_text().replace("[data]\n", "[data]\nserver_test = 100\n")
                    .replace("round_timeout = 20", "round_timeout = 20\neval_every = 2"))
    out = tmp_path / "run"
    run_scenario(load_checked(path), out)
    records = coordinator_records(out, "fedavg")
    assert [r["event"] for r in records[-3:]] == ["round", "server", "final"]  # the finish's test, then the end
