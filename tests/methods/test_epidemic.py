"""Epidemic Learning: each sender's s recipients are drawn alike everywhere, a node waits for exactly the senders
that drew it, and it takes the plain mean of its own model and what came."""

from __future__ import annotations

import math

import pytest

from p2pfed.methods.epidemic import Epidemic, EpidemicOptions, recipients
from p2pfed.wire import ModelIn
from tests.methods.fake import FakePeers, models, vec

NAMES = [f"n{i:02d}" for i in range(10)]


def method(name: str, fanout: int = 3, own: float = 0.0, live: list[str] | None = None) -> Epidemic:
    return Epidemic(FakePeers(name, NAMES, own=own, live=live), EpidemicOptions(fanout=fanout))  # type: ignore[arg-type]


def test_each_sender_draws_s_others_alike_everywhere_and_anew_each_round() -> None:
    drawn = {n: recipients(0, n, 4, NAMES, 3) for n in NAMES}
    assert all(len(d) == 3 and n not in d for n, d in drawn.items())
    assert drawn == {n: recipients(0, n, 4, NAMES, 3) for n in NAMES} and drawn != {
        n: recipients(0, n, 5, NAMES, 3) for n in NAMES}
    assert recipients(0, "n00", 0, NAMES[:3], 5) == {"n01", "n02"}  # fewer others than s: all of them
    assert len(recipients(0, "n00", 0, NAMES, 0)) == math.ceil(math.log2(10))  # s = 0: log2 N


def test_a_node_waits_for_exactly_the_senders_that_drew_it() -> None:
    for rnd in range(4):
        sent = {n: method(n).subscribers(rnd) for n in NAMES}
        for n in NAMES:
            assert method(n).sources(rnd) == {s for s in NAMES if n in sent[s]}


def test_a_dead_recipient_is_not_sent_to() -> None:
    everyone = method("n00").subscribers(2)
    dead = sorted(everyone)[0]
    assert method("n00", live=[n for n in NAMES[1:] if n != dead]).subscribers(2) == everyone - {dead}


def test_a_node_takes_the_plain_mean_of_its_own_and_what_came() -> None:
    node = method("n00", own=3.0)
    arrived = {**models(n01=0.0), "n02": ModelIn("n02", vec(9.0), samples=50)}
    mixed = node.aggregate(0, None, arrived)
    assert mixed is not None and mixed["w"].item() == pytest.approx(4.0)  # (3 + 0 + 9) / 3, samples ignored
    assert node.aggregate(0, None, {}) is None
