"""A strategy runs alike with a coordinator and peer to peer: its grouping, its training and its aggregation,
whichever form runs it; a form takes its name, options and node side from its strategy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from p2pfed.methods.base import NodeContext
from p2pfed.methods.central import ClientMethod, Task, Update
from p2pfed.methods.strategy import Coordinated, Knows, Peered, State, Strategy
from tests.methods.fake import FakeCoordinator, FakePeers, models, vec


class Median(Strategy):
    """Two groups by the first letter of the node's name, each aggregated by its coordinate-wise median, and a
    local step that trains a copy (adds 1 to the start) rather than the node's model in place."""

    name = "median"

    def group(self, ctx: Knows, node: str) -> int | None:
        return 0 if node < "m" else 1

    async def train(self, node: NodeContext, start: State | None) -> tuple[State, float]:
        base = start if start is not None else node.current_state()
        return {k: v + 1.0 for k, v in base.items()}, 0.5

    def aggregate(self, states: list[State], samples: list[float]) -> State:
        return {k: torch.stack([s[k] for s in states]).median(dim=0).values for k in states[0]}


class MedianServer(Coordinated):
    strategy = Median


class MedianPeer(Peered):
    strategy = Median


class LoadingPeers(FakePeers):
    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state


def test_a_strategy_groups_and_aggregates_alike_with_a_coordinator_and_peer_to_peer() -> None:
    values = {"a": 1.0, "b": 9.0, "c": 2.0, "x": 5.0}  # a, b, c in group 0; x in group 1
    server = MedianServer(FakeCoordinator(lambda n, t: None), None)
    asyncio.run(server.before_round(0, sorted(values)))
    server.aggregate(0, {n: Update(vec(v), 1 + i) for i, (n, v) in enumerate(values.items())})
    assert server.models[0]["w"].tolist() == [2.0] and server.models[1]["w"].tolist() == [5.0]  # the median
    peer = MedianPeer(FakePeers("a", list(values)))  # type: ignore[arg-type]
    assert peer.sources(0) == {"b", "c"}
    mixed = peer.aggregate(0, FakePeers("a", []).mine(), models(b=9.0, c=2.0))
    assert mixed is not None and mixed["w"].tolist() == server.models[0]["w"].tolist()


def test_both_forms_train_by_the_strategy_and_a_peer_sends_what_it_trained() -> None:
    assert (MedianServer.name, MedianPeer.name) == ("median", "median-p2p")
    client = MedianServer.client(FakePeers("a", []), None)  # type: ignore[misc, arg-type]
    update, _ = asyncio.run(client.train(Task("train", [vec(3.0)], groups=[0])))
    assert update.state is not None and update.state["w"].tolist() == [4.0] and update.train_loss == 0.5
    node = LoadingPeers("a", ["b"], own=3.0)
    assert asyncio.run(MedianPeer(node).train(0)) == 0.5  # type: ignore[arg-type]
    assert node.current_state()["w"].tolist() == [4.0]  # the trained copy is the node's model, and what it sends


def test_a_strategy_that_trains_as_fedavg_leaves_the_base_node_side_which_honours_instructions() -> None:
    class Grouped(Strategy):
        name = "grouped"

        def group(self, ctx: Knows, node: str) -> int | None:
            return 1

    class GroupedServer(Coordinated):
        strategy = Grouped

    assert GroupedServer.client is None and issubclass(MedianServer.client or ClientMethod, ClientMethod)


@pytest.mark.parametrize("body", [{"name": "mine"}, {"options_type": None}, {"client": None}])
def test_a_form_that_sets_what_its_strategy_gives_it_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="which its strategy gives it"):
        type("Mine", (Coordinated,), {"strategy": Median, **body})
    if "client" not in body:
        with pytest.raises(TypeError, match="which its strategy gives it"):
            type("MinePeer", (Peered,), {"strategy": Median, **body})


def test_a_strategy_with_no_name_of_its_own_is_refused() -> None:
    class Unnamed(Strategy):
        pass

    with pytest.raises(TypeError, match="Unnamed names no method"):
        type("UnnamedServer", (Coordinated,), {"strategy": Unnamed})
    with pytest.raises(TypeError, match="Unnamed names no method"):
        type("UnnamedPeer", (Peered,), {"strategy": Unnamed})
