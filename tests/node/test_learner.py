"""A learning node's crash safety: what it checkpoints is what a restarted node resumes with."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from p2pfed.learn.checkpoint import save_atomic
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.node.learner import LearningNode
from p2pfed.scenario.config import Scenario, load_scenario
from p2pfed.scenario.runner import prepare_data

SCENARIO = """
[scenario]
name = "restore"
nodes = 4
rounds = 6
methods = ["pfedlia-p2p"]
[data]
dataset = "digits"
clusters = 2
[pfedlia]
warmup_rounds = 2
"""


def scenario(tmp_path: Path) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return load_scenario(path)


def node(s: Scenario, members: Callable[..., Endpoint], out: Path) -> LearningNode:
    dataset, partition = prepare_data(s)
    return LearningNode(s, 1, "pfedlia-p2p", dataset, partition, members("n01", options=MeshOptions()), out)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "n01.jsonl").read_text().splitlines()]


def checkpointed(s: Scenario, members: Callable[..., Endpoint], out: Path) -> dict[str, torch.Tensor]:
    """Make node n01 as it is after round 4 (trained weights, a choice, kept models), checkpoint it, and
    return its weights."""
    first = node(s, members, out)
    trained = {k: v + torch.randn_like(v) if v.is_floating_point() else v for k, v in first.current_state().items()}
    first.load_state(trained)
    first.kept = {"w0": {k: v * 3 for k, v in trained.items()}, "partial": {k: v * 2 for k, v in trained.items()}}
    save_atomic(first.kept, first.checkpoint_path.with_suffix(".kept"))  # as train_partial writes it
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
    assert again.method.state() == {"chosen": ["n00"], "choosers": ["n00", "n02"], "chosen_scores": {"n00": 0.5}}
    floats = [k for k in trained if trained[k].is_floating_point()]
    assert all(torch.equal(again.kept["partial"][k], 2 * trained[k]) for k in floats)
    assert all(torch.equal(again.kept["w0"][k], 3 * trained[k]) for k in floats)
    assert node(s, members, tmp_path / "elsewhere").restore() is None  # nothing to resume from


async def test_a_restarted_node_goes_on_after_its_checkpointed_round_without_choosing_again(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    s = scenario(tmp_path)
    checkpointed(s, members, tmp_path)
    again = node(s, members, tmp_path)
    await again.run(start_round=1, start_timeout=0.2)  # told to start early (as a restart at round 1 would be)
    mine = records(tmp_path)
    assert [r["round"] for r in mine if r["event"] == "round"] == [5]  # after round 4: not again, not from 1
    assert not [r for r in mine if r["event"] == "lia"]  # its choice came back: no new peer selection
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
    monkeypatch.setattr("p2pfed.node.learner.train_epochs", crash)
    with pytest.raises(RuntimeError, match="killed while training"):
        await alone.run_round(2)  # the influence phase (no peers: it chooses nobody), then the crash
    assert saved == [(1, None), (1, [])]  # the choice was on disk before the round's training
    again = node(s, members, tmp_path)
    assert again.restore() == 1 and again.method.state()["chosen"] == []
