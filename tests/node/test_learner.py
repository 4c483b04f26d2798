"""A learning node's crash safety: what it checkpoints is what a restarted node resumes with; and its round
loop: where it starts and catches up, whom it waits for, and how it averages (FedAvg by sample count)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from p2pfed.launch.adversary import conduct_of
from p2pfed.launch.runner import prepare_data, scenario_node
from p2pfed.learn.checkpoint import CheckpointError, load_own
from p2pfed.learn.tasks import Classification
from p2pfed.learn.train import evaluate, weighted_average
from p2pfed.methods.base import Method
from p2pfed.methods.central import participates
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.net.membership import ALIVE, DEAD
from p2pfed.node.learner import LearningNode
from p2pfed.scenario.config import Scenario, load_scenario
from p2pfed.wire import Message, ModelIn, NoteIn, WireError
from p2pfed.wire.messages import check_body

SCENARIO = """
[scenario]
name = "restore"
nodes = 4
rounds = 6
methods = ["pfedlia-p2p"]
[data]
dataset = "digits"
partition.clusters = 2
[methods.pfedlia-p2p]
warmup_rounds = 2
"""


def scenario(tmp_path: Path) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return load_scenario(path)


def node(s: Scenario, members: Callable[..., Endpoint], out: Path) -> LearningNode:
    dataset, partition = prepare_data(s)
    given = scenario_node(s, 1, dataset, partition)
    return LearningNode(s, given, "pfedlia-p2p", members("n01", options=MeshOptions()), out)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "n01.jsonl").read_text().splitlines()]


def checkpointed(s: Scenario, members: Callable[..., Endpoint], out: Path) -> dict[str, torch.Tensor]:
    """Make node n01 as it is after round 4 (trained weights, a choice, kept models), checkpoint it, and
    return its weights."""
    first = node(s, members, out)
    trained = {k: v + torch.randn_like(v) if v.is_floating_point() else v for k, v in first.current_state().items()}
    first.load_state(trained)
    first.keep({"w0": {k: v * 3 for k, v in trained.items()}, "partial": {k: v * 2 for k, v in trained.items()}})
    first.method.restore({"chosen": ["n00"], "choosers": ["n00", "n02"], "chosen_scores": {"n00": 0.5}})
    first.checkpoint(4)
    return trained


async def test_restore_brings_back_the_model_the_choice_and_the_kept_models(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    s = scenario(tmp_path)
    trained = checkpointed(s, members, tmp_path)
    again = node(s, members, tmp_path)  # a new process: fresh weights, no choice
    assert not all(torch.equal(again.current_state()[k], trained[k]) for k in trained)
    assert again.restore() == 4
    assert all(torch.equal(again.current_state()[k], trained[k]) for k in trained)
    state = again.method.state()
    assert {k: state[k] for k in ("chosen", "choosers", "chosen_scores")} == {
        "chosen": ["n00"], "choosers": ["n00", "n02"], "chosen_scores": {"n00": 0.5}}
    floats = [k for k in trained if trained[k].is_floating_point()]
    assert all(torch.equal(again.kept_model("partial")[k], 2 * trained[k]) for k in floats)  # type: ignore[index]
    assert all(torch.equal(again.kept_model("w0")[k], 3 * trained[k]) for k in floats)  # type: ignore[index]
    assert node(s, members, tmp_path / "elsewhere").restore() is None  # nothing to resume from


async def test_a_node_with_an_earlier_p2pfeds_checkpoint_stops_instead_of_starting_afresh(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    s = scenario(tmp_path)
    checkpointed(s, members, tmp_path)
    for old, new in [("n01.ckpt", "n01.safetensors"), ("n01.kept", "n01.kept.safetensors")]:
        (tmp_path / new).rename(tmp_path / old)  # as a run of an earlier p2pfed left it (the format aside)
        with pytest.raises(CheckpointError, match=rf"p2pfed convert .*{old}"):
            node(s, members, tmp_path).restore()
        (tmp_path / old).rename(tmp_path / new)


async def test_a_restarted_node_goes_on_after_its_checkpointed_round_without_choosing_again(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    s = scenario(tmp_path)
    checkpointed(s, members, tmp_path)
    again = node(s, members, tmp_path)
    await again.run(start_round=1, start_timeout=0.2)  # told to start early (as a restart at round 1 would be)
    mine = records(tmp_path)
    assert [r["round"] for r in mine if r["event"] == "round"] == [5]  # after round 4: not again, not from 1
    assert not [r for r in mine if r["event"] == "choice"]  # its choice came back: no new peer selection
    assert mine[-1]["event"] == "final" and mine[-1]["chosen"] == ["n00"]


async def test_a_choice_made_before_a_round_is_checkpointed_before_the_round_trains(
        tmp_path: Path, members: Callable[..., Endpoint], monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario(tmp_path)
    alone = node(s, members, tmp_path)
    saved: list[tuple[int, object]] = []
    checkpoint = alone.checkpoint

    def spy(rnd: int) -> None:
        saved.append((rnd, alone.method.state()["chosen"]))
        checkpoint(rnd)

    def crash(*args: object, **kw: object) -> float:
        raise RuntimeError("killed while training")

    monkeypatch.setattr(alone, "checkpoint", spy)
    await alone.run_round(1)  # a warm-up round: nothing chosen yet
    monkeypatch.setattr("p2pfed.node.local.train_epochs", crash)
    with pytest.raises(RuntimeError, match="killed while training"):
        await alone.run_round(2)  # the influence phase (no peers: it chooses nobody), then the crash
    assert saved == [(1, None), (1, [])]  # the choice was on disk before the round's training
    again = node(s, members, tmp_path)
    assert again.restore() == 1 and again.method.state()["chosen"] == []


# -- the round loop without sockets: peers are entries of the node's membership table (as heartbeats and
# -- introductions make them), a peer's model arrives through the node's own handler (as the transport delivers
# -- it), and what the node sends is recorded ---------------------------------------------------------------------

ROUNDS = """
[scenario]
name = "rounds"
seed = 3
nodes = 4
rounds = 6
methods = ["fedavg-p2p"]
[data]
dataset = "digits"
partition.clusters = 1
[train]
participation = {participation}
round_timeout = 1
eval_every = {eval_every}
momentum = {momentum}
"""


def fedavg_node(out: Path, members: Callable[..., Endpoint], participation: float = 1.0, eval_every: int = 1,
                momentum: float = 0.0, adversary: str | None = None, options: MeshOptions | None = None
                ) -> LearningNode:
    """Node n01 of a 4-node digits scenario of decentralized FedAvg (6 rounds), its endpoint not started."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rounds.toml"
    text = ROUNDS.format(participation=participation, eval_every=eval_every, momentum=momentum)
    path.write_text(text + (f'[[adversaries]]\nnode = 1\nkind = "{adversary}"\n' if adversary else ""))
    s = load_scenario(path)
    dataset, partition = prepare_data(s)
    given = scenario_node(s, 1, dataset, partition)
    return LearningNode(s, given, "fedavg-p2p", members("n01", options=options or MeshOptions()), out,
                        conduct=conduct_of(s, 1))


def heard(n: LearningNode, peer: str, rnd: int = 0) -> None:
    """A heartbeat of a learning peer at round rnd reaches the node (the peer is alive; a heartbeat tells its
    period)."""
    n.endpoint.peers.heard_from(peer, "tcp://127.0.0.1:9", "node", 1, "", rnd, period=1.0)


def introduced(n: LearningNode, peer: str, rnd: int = 0) -> None:
    """The node's join introduced a learning peer at round rnd it has not heard from itself yet (joining)."""
    n.endpoint.peers.learned_of({"name": peer, "address": "tcp://127.0.0.1:9", "role": "node", "incarnation": 1,
                                 "pubkey": "", "state": ALIVE, "round": rnd})


async def deliver(n: LearningNode, sender: str, rnd: int, state: dict[str, torch.Tensor], samples: int) -> None:
    """A peer's model of round rnd arrives at the node."""
    await n._on_model(Message("model", sender, round=rnd, body={"kind": "model", "samples": samples, "meta": {}},
                              tensors=state))


def shifted(n: LearningNode, by: float) -> dict[str, torch.Tensor]:
    """The initial model with every float tensor shifted: a distinct, recognisable peer model."""
    return {k: v + by if v.is_floating_point() else v.clone() for k, v in n.reference.items()}


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), atol=1e-6) for k in a)


def record_sends(n: LearningNode, then: Callable[[], Any] | None = None) -> list[tuple[set[str], str, Any]]:
    """Replace the node's send with one that records (to, kind, state), then runs then() (a peer's move)."""
    sent: list[tuple[set[str], str, Any]] = []

    async def send(to: set[str], kind: str, state: dict[str, torch.Tensor], meta: Any = None) -> int:
        sent.append((set(to), kind, state))
        if then is not None:
            await then()
        return len(to)

    n.send_model = send  # type: ignore[method-assign]
    return sent


async def test_a_round_averages_the_sources_models_and_its_own_by_sample_count(
        tmp_path: Path, members: Callable[..., Endpoint], caplog: pytest.LogCaptureFixture) -> None:
    n = fedavg_node(tmp_path, members)
    heard(n, "n00")
    heard(n, "n02")
    s0, s2 = shifted(n, 0.5), shifted(n, -0.25)

    async def peers_send() -> None:
        await deliver(n, "n00", 0, s0, 10)
        await deliver(n, "n02", 0, s2, 30)

    sent = record_sends(n, peers_send)
    with caplog.at_level(logging.INFO, logger="p2pfed.node"):
        assert await n.run_round(0) == 0
    # a node tells its progress, one line a round (it printed nothing)
    [line] = [r.getMessage() for r in caplog.records if "done" in r.getMessage()]
    accuracy = next(r for r in records(tmp_path) if r["event"] == "round")["accuracy"]
    assert line == f"n01: round 1 of 6 done, accuracy {accuracy:.1%}; averaged 2 of 2 peers' models (n00, n02)"
    [(to, kind, trained)] = sent
    assert to == {"n00", "n02"} and kind == "model" and not close(trained, n.reference)  # its trained model
    # FedAvg (McMahan et al.): the sample-weighted mean of the round's models, this node's own included (written
    # out here, not with weighted_average, so that a change there shows on this path too)
    total = 10 + 30 + n.samples
    expected = {k: (10 * s0[k] + 30 * s2[k] + n.samples * trained[k]) / total if v.is_floating_point() else v
                for k, v in trained.items()}
    assert close(n.current_state(), expected)
    [rec] = [r for r in records(tmp_path) if r["event"] == "round"]
    ev = evaluate(n.model, n.data.x_test, n.data.y_test, n.device)
    assert rec["participated"] is True and math.isfinite(rec["train_loss"])
    assert (rec["sources"], rec["received"]) == (2, 2)
    assert rec["bytes_sent"] == n.endpoint.transport.bytes_sent
    assert (rec["accuracy"], rec["loss"], rec["macro_f1"]) == (ev.accuracy, ev.loss, ev.macro_f1)


async def test_an_early_model_and_the_model_of_a_source_that_left_during_the_round_both_count(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    heard(n, "n00")
    heard(n, "n02")
    s0, s2 = shifted(n, 0.5), shifted(n, -0.25)
    await deliver(n, "n00", 1, s0, 10)  # a faster peer sent its round-1 model before this node began round 1
    await deliver(n, "n00", 3, s0, 10)  # and its round-3 model: kept for round 3

    async def send_and_leave() -> None:  # n02 sends its model, finishes the run and leaves
        await deliver(n, "n02", 1, s2, 30)
        n.endpoint.peers.left("n02")

    sent = record_sends(n, send_and_leave)
    await n.run_round(1)
    trained = sent[0][2]
    assert close(n.current_state(), weighted_average([s0, s2, trained], [10.0, 30.0, float(n.samples)]))
    assert ("model", 3) in n.inbox  # not dropped: round 3 has not come yet


async def test_a_scripted_free_rider_sends_the_model_it_has_untrained_and_still_takes_the_average(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members, adversary="free-rider")
    heard(n, "n00")
    s0 = shifted(n, 0.5)

    async def n00_sends() -> None:
        await deliver(n, "n00", 0, s0, 10)

    sent = record_sends(n, n00_sends)
    await n.run_round(0)
    [(to, kind, state)] = sent
    assert to == {"n00"} and kind == "model" and close(state, n.reference)  # no local training: w0 as it was
    assert close(n.current_state(), weighted_average([s0, n.reference], [10.0, float(n.samples)]))
    [rec] = [r for r in records(tmp_path) if r["event"] == "round"]
    assert rec["participated"] is True and rec["train_loss"] is None


class EveryOther(Method):
    """A method whose every answer depends on the round: n00 is the source in even rounds, n02 in odd ones,
    and the node must train in even rounds whatever the participation draw says."""

    name = "every-other"

    def __init__(self, node: Any, options: Any = None) -> None:
        super().__init__(node, options)
        self.asked: list[tuple[Any, ...]] = []  # the round each step is asked about (and whose own model)

    def sources(self, rnd: int) -> set[str]:
        return {["n00", "n02"][rnd % 2]} & set(self.node.live_peers())

    async def train(self, rnd: int) -> float | None:
        self.asked.append(("train", rnd))
        return await super().train(rnd)

    def outgoing(self, rnd: int) -> dict[str, torch.Tensor]:
        self.asked.append(("outgoing", rnd))
        return super().outgoing(rnd)

    def aggregate(self, rnd: int, own: ModelIn | None, arrived: dict[str, ModelIn]) -> dict[str, torch.Tensor] | None:
        self.asked.append(("aggregate", rnd, own.sender if own is not None else None))
        return super().aggregate(rnd, own, arrived)

    def must_participate(self, rnd: int) -> bool:
        return rnd % 2 == 0


async def test_the_node_asks_its_method_about_the_round_it_runs(tmp_path: Path,
                                                                members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members, participation=0.01)
    assert not any(participates(n.scenario.seed, p, r, 0.01) for p in ("n00", "n01", "n02") for r in (0, 1))
    n.method = method = EveryOther(n)
    heard(n, "n00")
    heard(n, "n02")
    s0, s2 = shifted(n, 0.5), shifted(n, -0.25)
    sent = record_sends(n)
    await deliver(n, "n00", 0, s0, 10)
    await deliver(n, "n02", 1, s2, 30)
    with pytest.raises(WireError, match="does not expect a model from n02 in round 0"):
        await deliver(n, "n02", 0, s2, 30)  # not a source of round 0
    assert await n.run_round(0) == 0
    [(to, _, trained)] = sent  # forced to train in round 0; sends to the round's subscribers
    assert to == {"n00"} and close(n.current_state(), weighted_average([s0, trained], [10.0, float(n.samples)]))
    await n.run_round(1)  # not drawn, not forced: no training, no send; it takes its source's model
    assert len(sent) == 1 and close(n.current_state(), s2)
    rounds = [r for r in records(tmp_path) if r["event"] == "round"]
    assert [(r["participated"], r["sources"], r["received"]) for r in rounds] == [(True, 1, 1), (False, 0, 1)]
    assert method.asked == [("train", 0), ("outgoing", 0), ("aggregate", 0, "n01"), ("aggregate", 1, None)]


class Rechooses(Method):
    """A method whose sources are what it last chose (as pFedLIA's are)."""

    name = "rechooses"

    def __init__(self, node: Any, options: Any = None) -> None:
        super().__init__(node, options)
        self.chosen = {"n00"}

    def sources(self, rnd: int) -> set[str]:
        return self.chosen & set(self.node.live_peers())


async def test_a_model_taken_from_a_peer_the_method_no_longer_chooses_is_not_averaged(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    n.method = method = Rechooses(n)
    heard(n, "n00")
    heard(n, "n02")
    await deliver(n, "n00", 0, shifted(n, 0.5), 10)  # early, while n00 was chosen
    method.chosen = {"n02"}  # the method chose again before the round
    s2 = shifted(n, -0.25)

    async def n02_sends() -> None:
        await deliver(n, "n02", 0, s2, 30)

    sent = record_sends(n, n02_sends)
    await n.run_round(0)
    trained = sent[0][2]
    assert close(n.current_state(), weighted_average([s2, trained], [30.0, float(n.samples)]))
    [rec] = [r for r in records(tmp_path) if r["event"] == "round"]
    assert rec["received"] == 1


class Settles(Method):
    """A method that changes the round's aggregate once the node holds it (as pFedLIA-p2p takes a harmful model
    back): to the model it was given."""

    name = "settles"

    def __init__(self, node: Any, settled: dict[str, torch.Tensor]) -> None:
        super().__init__(node)
        self.settled = settled
        self.held: list[dict[str, torch.Tensor]] = []  # the model the node held as settle was awaited

    async def settle(self, rnd: int) -> None:
        self.held.append(self.node.current_state())
        await asyncio.sleep(0)  # awaited: it may score models in a worker thread
        self.node.load_state(self.settled)


async def test_what_a_method_settles_after_averaging_is_what_the_round_evaluates_and_keeps(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    """A harmful model that came in the last round of a run must be taken back before the run ends: a round's
    aggregate is settled by the method before the round is evaluated and checkpointed (on adversaries-fmnist-
    clean, seed 1, four nodes that averaged a broken model in round 30 ended 30 points down)."""
    n = fedavg_node(tmp_path, members)
    heard(n, "n00")
    s0, settled = shifted(n, 0.5), shifted(n, -0.25)
    n.method = method = Settles(n, settled)
    await deliver(n, "n00", 0, s0, 10)
    sent = record_sends(n)
    await n.run_round(0)
    [(_, _, trained)] = sent
    [held] = method.held  # the round's average, as aggregate made it
    assert close(held, weighted_average([s0, trained], [10.0, float(n.samples)]))
    assert close(n.current_state(), settled)
    assert close(load_own(n.checkpoint_path)["model"], settled)
    ev = evaluate(n.model, n.data.x_test, n.data.y_test, n.device, task=n.task)
    [rec] = [r for r in records(tmp_path) if r["event"] == "round"]
    assert rec["accuracy"] == ev.accuracy and rec["loss"] == ev.loss


async def test_who_trains_and_whose_model_is_awaited_follow_the_shared_participation_draw(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    fraction = 0.5
    n = fedavg_node(tmp_path, members, participation=fraction)
    peers = ["n00", "n02", "n03"]
    for p in peers:
        heard(n, p)
    record_sends(n)
    seed = n.scenario.seed
    drawn = {r: {p for p in ["n01", *peers] if participates(seed, p, r, fraction)} for r in range(6)}
    assert len({frozenset(d) for d in drawn.values()}) >= 4  # the draw changes from round to round
    for rnd in range(6):
        for p in sorted(drawn[rnd] - {"n01"}):  # the drawn peers train and send; the others sit the round out
            await deliver(n, p, rnd, shifted(n, 0.1 * rnd), 10)
        await n.run_round(rnd)
    rounds = [r for r in records(tmp_path) if r["event"] == "round"]
    # the coordinator's draw (methods/central.py): every method of a scenario trains the same nodes
    assert [r["participated"] for r in rounds] == [("n01" in drawn[r]) for r in range(6)]
    assert [r["sources"] for r in rounds] == [len(drawn[r] - {"n01"}) for r in range(6)]
    assert [r["received"] for r in rounds] == [len(drawn[r] - {"n01"}) for r in range(6)]
    assert all((r["train_loss"] is None) == (not r["participated"]) for r in rounds)


async def test_the_node_evaluates_every_eval_every_rounds_and_after_the_last(
        tmp_path: Path, members: Callable[..., Endpoint], caplog: pytest.LogCaptureFixture) -> None:
    n = fedavg_node(tmp_path, members, eval_every=4)
    with caplog.at_level(logging.INFO, logger="p2pfed.node"):
        for rnd in range(6):
            await n.run_round(rnd)  # alone: it trains and keeps its own model
    lines = [r.getMessage() for r in caplog.records if "done" in r.getMessage()]
    assert lines[0] == "n01: round 1 of 6 done; averaged 0 of 0 peers' models"  # no accuracy, nobody to name
    rounds = [r for r in records(tmp_path) if r["event"] == "round"]
    assert [r["round"] for r in rounds if "accuracy" in r] == [3, 5]
    assert all({"loss", "macro_f1"} <= r.keys() for r in rounds if "accuracy" in r)


async def test_local_training_uses_the_configured_momentum(tmp_path: Path,
                                                           members: Callable[..., Endpoint]) -> None:
    plain = fedavg_node(tmp_path / "a", members)
    heavy = fedavg_node(tmp_path / "b", members, momentum=0.9)
    for n in (plain, heavy):
        await n.run_round(0)
    assert not close(plain.current_state(), heavy.current_state())


class ChoosesSlowly(Method):
    """Chooses n00 before its first round (as pFedLIA's late joiner does, fetching models), while n00 goes on
    to round moved_to."""

    name = "chooses-slowly"

    def __init__(self, node: LearningNode, moved_to: int) -> None:
        super().__init__(node)
        self.moved_to = moved_to
        self.chosen: list[str] | None = None

    async def before_round(self, rnd: int) -> None:
        if self.chosen is None:
            self.chosen = ["n00"]
            heard(self.node, "n00", self.moved_to)  # type: ignore[arg-type]
            heard(self.node, "n02", self.moved_to)  # type: ignore[arg-type]  # a second member confirms n00's word

    def state(self) -> dict[str, Any]:
        return {"chosen": self.chosen}


@pytest.mark.parametrize(("moved_to", "runs"), [(2, 1), (3, 3), (4, 4)])
async def test_a_node_whose_choice_took_long_catches_up_before_it_trains_if_two_rounds_behind(
        tmp_path: Path, members: Callable[..., Endpoint], moved_to: int, runs: int) -> None:
    n = fedavg_node(tmp_path, members)
    n.method = ChoosesSlowly(n, moved_to)
    heard(n, "n00", 1)

    async def n00_sends() -> None:
        await deliver(n, "n00", runs, shifted(n, 0.5), 10)

    sent = record_sends(n, n00_sends)
    assert await n.run_round(1) == runs  # the round its source had reached meanwhile, if two or more ahead
    assert n.round == n.endpoint.round == runs and len(sent) == 1
    mine = records(tmp_path)
    skips = [(r["skipped_from"], r["skipped_to"]) for r in mine if r["event"] == "skip"]
    assert skips == ([(1, runs)] if runs > 1 else [])
    assert [(r["round"], r["received"]) for r in mine if r["event"] == "round"] == [(runs, 1)]
    ckpt = load_own(n.checkpoint_path)
    assert ckpt["round"] == runs and json.loads(ckpt["method"]) == {"chosen": ["n00"]}


def scripted_rounds(n: LearningNode, first_returns: int | None = None) -> list[tuple[int, int, float]]:
    """Replace the node's round with one that records (round, peers seen, seconds since the call) and returns
    the round it ran (first_returns for the first call: a round whose pre-round work ended in a catch-up)."""
    ran: list[tuple[int, int, float]] = []
    t0 = time.monotonic()

    async def run_round(rnd: int) -> int:
        ran.append((rnd, n.peers_seen(), time.monotonic() - t0))
        if len(ran) > 20:
            raise AssertionError(f"rounds never end: {[r for r, _, _ in ran]}")
        await asyncio.sleep(0)
        return first_returns if first_returns is not None and len(ran) == 1 else rnd

    n.run_round = run_round  # type: ignore[method-assign]
    return ran


async def test_a_node_alone_runs_every_round_once_from_the_first_without_waiting(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    ran = scripted_rounds(n)
    await asyncio.wait_for(n.run(), 10)  # the defaults: round 0, no peers to wait for
    assert [r for r, _, _ in ran] == [0, 1, 2, 3, 4, 5]
    assert ran[0][2] < 1.0 and records(tmp_path)[-1]["event"] == "final"
    assert n.endpoint.identity()["round"] == 6  # finished: past its last round, a peer waiting on its model goes on


async def test_a_node_waits_for_the_peers_it_is_told_to_wait_for_but_not_forever(
        tmp_path: Path, members: Callable[..., Endpoint], caplog: pytest.LogCaptureFixture) -> None:
    n = fedavg_node(tmp_path, members)
    ran = scripted_rounds(n)
    asyncio.get_running_loop().call_later(0.3, heard, n, "n00")
    with caplog.at_level(logging.INFO, logger="p2pfed.node"):
        await n.run(wait_for_peers=1, start_timeout=5)
    assert "n01: waiting for 1 more peers to start (0 of 1 heard; 5 s left)" in caplog.messages
    assert ran[0][:2] == (0, 1) and 0.3 <= ran[0][2] < 3  # it began once n00 was there, not at the deadline
    ran.clear()
    await n.run(wait_for_peers=2, start_timeout=0.5)  # a second peer never comes: it starts at the deadline
    assert ran[0][:2] == (0, 1) and 0.5 <= ran[0][2] < 3


def test_a_peer_is_gone_once_the_table_holds_it_dead_or_left_or_forgot_it_not_before_it_is_met(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    for peer in ("n00", "n02", "n03"):
        heard(n, peer)
    n.members()  # known from here on
    n.endpoint.peers.left("n00")
    n.endpoint.peers.mark_dead("n02")
    assert [n.gone(p) for p in ("n00", "n02", "n03", "n04")] == [True, True, False, False]  # n04: never met
    del n.endpoint.peers.peers["n03"]  # forgotten
    assert n.gone("n03") and not n.gone("n01")
    n.endpoint.peers.heard_from("n00", "tcp://127.0.0.1:9", "node", 2, "", 0)  # restarted: back
    assert not n.gone("n00")
    introduced(n, "n05")  # known from the join alone, then dead for not answering its introduction: a request
    n.endpoint.peers.introducing("n05")  # introduces it again (Endpoint.introduces), so it is not gone
    n.endpoint.peers.peers["n05"].introduced = n.endpoint.peers.clock() - 60
    n.endpoint.peers.sweep()
    assert n.endpoint.peers.peers["n05"].state == DEAD and not n.gone("n05")
    n.endpoint.peers.mark_dead("n05")  # its last will: known to have failed
    assert n.gone("n05")


async def test_a_node_stops_waiting_for_a_peers_model_once_the_peers_heartbeat_says_it_has_moved_on(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    """A peer past the round has sent what it had for it (collect): its heartbeat saying so must end the wait at
    once. Seen at 250 nodes: 10 to 30 nodes of a run waited out the whole 300 s round timeout in the last round
    for peers that had long finished, and said nothing (at the deadline there was nothing left to wait for): a
    peer's round rising in its heartbeat woke no one."""
    n = fedavg_node(tmp_path, members)
    heard(n, "n00", 3)
    identity = {"address": "tcp://127.0.0.1:9", "role": "node", "incarnation": 1, "pubkey": "", "round": 4,
                "heartbeat": 1.0, "membership": "probe"}
    asyncio.get_running_loop().call_later(0.2, n.endpoint._heard, Message("heartbeat", "n00", body=identity))
    started = time.monotonic()
    got = await n.collect("model", 3, {"n00"}, timeout=10)
    assert got == {} and time.monotonic() - started < 3  # not the round's timeout


async def test_a_node_that_waited_for_peers_and_met_only_other_recipes_stops_naming_them(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    # Two nodes of different recipes, each waiting for one peer, waited for ever after five warnings
    n = fedavg_node(tmp_path, members)
    n.endpoint.recipe = "a" * 16
    n.endpoint.other_recipes["n02"] = "b" * 16  # as _heard records a refused member (tests/net/test_endpoint.py)
    ran = scripted_rounds(n)
    with pytest.raises(ValueError, match=r"n01: waited 0 s for 1 peers of its recipe a{16} and heard 0; these "
                                         r"train another: n02 .recipe b{16}.: start every node with the same"):
        await n.run(wait_for_peers=1, start_timeout=0.3)
    assert not ran
    heard(n, "n00")  # one peer of its recipe is all it waited for: the others' recipes do not matter then
    await n.run(wait_for_peers=1, start_timeout=0.3)
    assert ran


async def test_a_restarted_node_does_not_wait_for_the_run_to_start(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    n.checkpoint(3)
    ran = scripted_rounds(n)
    await n.run(wait_for_peers=3, start_timeout=5)  # the others started long ago; some may have finished
    assert [r for r, _, _ in ran] == [4, 5] and ran[0][2] < 3


async def test_a_late_joiner_hears_from_its_introduced_peers_then_starts_at_their_round(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path / "late", members)
    ran = scripted_rounds(n)
    introduced(n, "n00")
    introduced(n, "n02")
    heard(n, "n03", 5)
    n.endpoint.peers.left("n03")  # finished the run and left: its round does not count
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, heard, n, "n00", 3)
    loop.call_later(0.3, heard, n, "n02", 3)
    await n.run(start_round=1, start_timeout=5)
    assert [r for r, _, _ in ran] == [3, 4, 5] and 0.3 <= ran[0][2] < 3
    assert not [r for r in records(tmp_path / "late") if r["event"] == "skip"]  # a start, not a skip

    far = fedavg_node(tmp_path / "far", members)
    ran = scripted_rounds(far)
    heard(far, "n00", 9)  # a round past the scenario's end (a peer can claim any)
    heard(far, "n02", 9)
    await far.run(start_round=1, start_timeout=5)
    assert [r for r, _, _ in ran] == [5]  # only as far as the last round


async def test_a_node_started_into_a_mesh_under_way_starts_as_a_late_joiner(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    # `p2pfed node` starts at round 0: one that joined a mesh at round 300 trained round 0 alone (and recorded
    # it) before it caught up
    n = fedavg_node(tmp_path, members)
    ran = scripted_rounds(n)
    introduced(n, "n00", 4)
    introduced(n, "n02", 4)
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, heard, n, "n00", 4)
    loop.call_later(0.3, heard, n, "n02", 4)
    await n.run(start_timeout=5)
    assert [r for r, _, _ in ran] == [4, 5] and 0.3 <= ran[0][2] < 3
    skips = [r for r in records(tmp_path) if r["event"] == "skip"]
    assert [(r["skipped_from"], r["skipped_to"]) for r in skips] == [(0, 4)]  # it did not start with the run


async def test_a_node_that_starts_with_the_run_does_not_wait_for_introduced_peers_that_stay_silent(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    ran = scripted_rounds(n)
    introduced(n, "n00")  # gossip named it; it never answers (its address may be stale)
    await n.run(start_timeout=3)
    assert [r for r, _, _ in ran] == [0, 1, 2, 3, 4, 5] and ran[0][2] < 1.5


async def test_under_lazy_introduction_a_node_waits_to_know_of_every_peer_it_expects_not_to_hear_from_each(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    # [mesh] introduce_up_to = 2: a member hears directly from about two peers, and knows of the rest from news.
    # Seen with 40 nodes and introduce_up_to = 8 when it waited for introduce_up_to peers heard from instead: a node
    # started knowing 5 members, drew its warm-up aggregators over those (the others drew theirs over 39), asked
    # peers that were none, and waited twice a round's timeout (10 minutes) for their average.
    lazy = MeshOptions(introduce_up_to=2)
    n = fedavg_node(tmp_path / "start", members, options=lazy)
    ran = scripted_rounds(n)
    heard(n, "n00")
    introduced(n, "n02")
    asked: list[float] = []

    async def ask_table() -> int:  # (its bootstrap's table: news of members it has not heard of)
        asked.append(time.monotonic())
        return 0

    n.endpoint.ask_table = ask_table  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    loop.call_later(0.5, introduced, n, "n03")  # heard of, never heard from: the third it expects
    await n.run(wait_for_peers=3, start_timeout=5)
    assert [r for r, _, _ in ran] == [0, 1, 2, 3, 4, 5] and 0.5 <= ran[0][2] < 2.5
    assert len(asked) == 1  # at once, then every 5 s while it waits

    late = fedavg_node(tmp_path / "late", members, options=lazy)
    ran = scripted_rounds(late)
    heard(late, "n00", 3)
    heard(late, "n03", 3)
    introduced(late, "n02")  # heard of and not introduced to: its silence does not hold the start
    await late.run(start_round=1, start_timeout=5)
    assert [r for r, _, _ in ran] == [3, 4, 5] and ran[0][2] < 1.5
    introduced(late, "n04")
    late.endpoint.peers.introducing("n04")  # one it introduces itself to now is waited for, as without lazy
    ran = scripted_rounds(late)
    await late.run(start_round=1, start_timeout=2)
    assert ran and ran[0][2] >= 2


async def test_a_late_joiner_starts_at_the_round_of_the_peers_it_averages_with_in_that_round(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    n.method = EveryOther(n)  # n02 in odd rounds, n00 in even ones
    ran = scripted_rounds(n)
    heard(n, "n02", 3)
    heard(n, "n00", 5)  # another group, further on: it does not set where this node starts
    await n.run(start_round=1, start_timeout=5)
    assert [r for r, _, _ in ran] == [3, 4, 5]


async def test_a_node_two_rounds_behind_its_sources_catches_up_one_round_behind_does_not(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    behind = fedavg_node(tmp_path / "two", members)
    ran = scripted_rounds(behind)
    heard(behind, "n00", 2)
    heard(behind, "n02", 2)
    await behind.run(start_timeout=5)
    assert [r for r, _, _ in ran] == [2, 3, 4, 5]
    skips = [r for r in records(tmp_path / "two") if r["event"] == "skip"]
    assert [(r["skipped_from"], r["skipped_to"]) for r in skips] == [(0, 2)]

    alone = fedavg_node(tmp_path / "alone", members)
    ran = scripted_rounds(alone)
    heard(alone, "n00", 2)  # its only peer's word, unconfirmed: forged or not, one member moves nobody
    await alone.run(start_timeout=5)
    assert [r for r, _, _ in ran] == [0, 1, 2, 3, 4, 5]

    close_behind = fedavg_node(tmp_path / "one", members)
    ran = scripted_rounds(close_behind)
    heard(close_behind, "n00", 1)
    await close_behind.run(start_timeout=5)
    assert [r for r, _, _ in ran] == [0, 1, 2, 3, 4, 5]  # one round behind: it waits for the models instead


async def test_the_loop_goes_on_after_the_round_a_round_actually_ran(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    ran = scripted_rounds(n, first_returns=2)  # round 0's pre-round work ended in a catch-up to round 2
    await n.run(start_timeout=5)
    assert [r for r, _, _ in ran] == [0, 3, 4, 5]


async def test_a_resumed_node_logs_the_round_it_resumes_from(
        tmp_path: Path, members: Callable[..., Endpoint], caplog: pytest.LogCaptureFixture) -> None:
    s = scenario(tmp_path)
    checkpointed(s, members, tmp_path)
    with caplog.at_level(logging.INFO, logger="p2pfed.node.learner"):
        assert node(s, members, tmp_path).restore() == 4
    assert "n01: resumed from its checkpoint at round 4" in [r.getMessage() for r in caplog.records]


async def test_a_choice_announced_rounds_earlier_or_later_is_taken_and_kept_only_within_the_window(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    # Seen in the late-joiner scenario: a late joiner's (or a restarted node's) choice of round 7 reached its
    # chosen peers at round 11; refusing it as "outside this node's rounds" left the joiner with no sources.
    # And the other way: a node that joined a mesh at round 250 was told its peers' choices of round 250 while
    # it was at round 0, and refused them all ("beyond this node's rounds 0..8").
    n = node(scenario(tmp_path), members, tmp_path)
    heard(n, "n00", rnd=11)
    n.round = 11

    def choices(rnd: int, chosen: list[str]) -> Message:
        return Message("note", "n00", round=rnd,
                       body={"kind": "choices", "names": chosen, "values": [1.0] * len(chosen), "meta": {}})

    await n._on_note(choices(7, ["n01", "n02"]))
    assert n.method.choosers == {"n00"}  # n01 now sends its models to n00
    assert ("choices", 7) not in n.inbox  # nothing kept for a round that will not be collected again
    await n._on_note(choices(250, ["n02"]))  # n00 chose again, far ahead: n01 no longer sends it its models
    assert n.method.choosers == set() and ("choices", 250) not in n.inbox  # not kept: the inbox stays bounded
    await n._on_note(choices(12, ["n01"]))
    assert n.method.choosers == {"n00"} and ("choices", 12) in n.inbox


def note(sender: str, kind: str, names: list[str], values: list[float], rnd: int = 0) -> Message:
    return Message("note", sender, round=rnd, body={"kind": kind, "names": names, "values": values, "meta": {}})


async def test_a_note_of_this_round_is_routed_to_the_method_and_kept_for_collect(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = node(scenario(tmp_path), members, tmp_path)
    heard(n, "n00")
    heard(n, "n02")
    await n._on_note(note("n00", "choices", ["n01"], [0.25]))
    await n._on_note(note("n02", "choices", ["n00"], [0.5], rnd=1))
    assert n.method.choosers == {"n00"}
    assert n.inbox[("choices", 0)] == {"n00": NoteIn("n00", {"n01": 0.25})}
    assert await n.collect("choices", 1, {"n02"}, 1) == {"n02": NoteIn("n02", {"n00": 0.5})}


@pytest.mark.parametrize(("sender", "kind", "names", "values", "reason"), [
    ("n00", "scores", ["n01"], [1.0], "n01 takes no scores note"),
    ("n00", "choices", ["n01", "n02"], [1.0], "choices: names and values differ in length"),
    ("n09", "choices", ["n01"], [1.0], "n09 is not a learning peer n01 knows"),
    ("coord", "choices", ["n01"], [1.0], "coord is not a learning peer n01 knows"),
])
async def test_a_note_the_method_does_not_take_or_that_does_not_add_up_is_refused(
        tmp_path: Path, members: Callable[..., Endpoint], sender: str, kind: str, names: list[str],
        values: list[float], reason: str) -> None:
    n = node(scenario(tmp_path), members, tmp_path)
    heard(n, "n00")
    n.endpoint.peers.heard_from("coord", "tcp://127.0.0.1:9", "coordinator", 1, "", 0)  # a member, not a node
    with pytest.raises(WireError, match=reason):
        await n._on_note(note(sender, kind, names, values))
    assert n.method.choosers == set() and n.inbox == {}


async def test_a_method_that_takes_no_notes_refuses_every_note(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    heard(n, "n00")
    with pytest.raises(WireError, match="n01 takes no choices note"):
        await n._on_note(note("n00", "choices", ["n01"], [1.0]))
    assert n.inbox == {}


async def test_a_node_waiting_to_start_is_at_its_start_round_and_takes_that_rounds_models(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    heard(n, "n00")
    ran = scripted_rounds(n)
    waiting = asyncio.ensure_future(n.run(start_round=0, wait_for_peers=2, start_timeout=5))
    await asyncio.sleep(0.05)
    assert n.round == n.endpoint.round == 0  # its heartbeats say round 0 while it waits for n02
    await deliver(n, "n00", 0, shifted(n, 0.5), 10)  # a peer that started already sends its round-0 model
    assert "n00" in n.inbox[("model", 0)]
    heard(n, "n02")
    await asyncio.wait_for(waiting, 5)
    assert ran[0][0] == 0


class SpyTask(Classification):
    """Classification that counts its calls: the node must train and evaluate with its dataset's task."""

    def __init__(self) -> None:
        self.losses = self.predictions = 0

    def loss(self, output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        self.losses += 1
        return super().loss(output, target, reduction)

    def predict(self, output: torch.Tensor) -> torch.Tensor:
        self.predictions += 1
        return super().predict(output)


async def test_a_node_trains_and_evaluates_with_its_datasets_task(tmp_path: Path,
                                                                  members: Callable[..., Endpoint]) -> None:
    n = fedavg_node(tmp_path, members)
    spy = n.task = SpyTask()
    assert await n.run_round(0) == 0  # alone: trains, averages its own model, evaluates
    assert spy.losses > 1 and spy.predictions >= 1


async def test_what_a_node_records_is_what_its_status_tells_the_dashboard(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    n = node(scenario(tmp_path), members, tmp_path)
    assert n.endpoint.progress is not None and n.endpoint.progress()["method"] == "pfedlia-p2p"
    n.round = 3
    n.record("round", accuracy=0.75, loss=0.5, participated=True)
    n.record("choice", chosen=["n02", "n00"], scores={"n00": 0.2, "n02": 0.1})
    told = n.endpoint.progress()
    assert (told["rounds"], told["accuracy"], told["loss"]) == ([3], [0.75], [0.5])
    assert told["chosen"] == ["n00", "n02"] and dict(zip(told["names"], told["values"], strict=True)) == \
        {"n00": 0.2, "n02": 0.1}
    check_body("status", {**n.endpoint.identity(), "address": "tcp://127.0.0.1:1", "name": "n01", "peers": [],
                          "learning": told})  # what the wire lets through


async def test_a_peer_asked_for_a_model_it_keeps_none_of_yet_says_its_round_in_its_answer(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    """Over real sockets: n00, at round 3, keeps no partial model yet; n01 asks it, gets none, and knows from the
    answer that n00 is at round 3, though its table still holds n00 at the round it last heard (a member of a large
    probing mesh hears a peer it does not work with once in many minutes). pFedLIA's sampling node waits by it."""
    asker = fedavg_node(tmp_path / "a", members)
    s = asker.scenario
    dataset, partition = prepare_data(s)
    (tmp_path / "b").mkdir()
    asked = LearningNode(s, scenario_node(s, 0, dataset, partition), "fedavg-p2p",
                         members("n00", options=MeshOptions()), tmp_path / "b")
    boot = members("bootstrap", "bootstrap", options=MeshOptions())
    await boot.start("tcp://127.0.0.1:0")
    await asked.endpoint.start("tcp://127.0.0.1:0", [boot.ticket])
    await asker.endpoint.start("tcp://127.0.0.1:0", [boot.ticket])
    for _ in range(100):
        if "n00" in asker.live_peers():
            break
        await asyncio.sleep(0.05)
    assert asker.peer_round("n00") == 0
    asked.round = 3
    assert await asker.fetch("n00", "partial") is None
    assert asker.peer_round("n00") == 3 and asker.endpoint.peers.peers["n00"].round < 3
    asked.keep({"partial": asked.current_state()})
    assert await asker.fetch("n00", "partial") is not None
