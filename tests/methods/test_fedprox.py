"""FedProx: one strategy, run by a coordinator (``fedprox``) and peer to peer (``fedprox-p2p``): local training
pulled toward the model the node starts from, μ from the method's own table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from p2pfed.config import ConfigError
from p2pfed.learn.train import distance_penalty, state_of
from p2pfed.methods import REGISTRY, load_checked
from p2pfed.methods.central import Task
from p2pfed.methods.fedprox import FedProxOptions, FedProxPeer, FedProxServer
from tests.methods.fake import CPU, FakeCoordinator, FakeNode, distance
from tests.scenario.test_mesh_learning import write


class ProxNode(FakeNode):
    """FakeNode with the node's train_local (load start, train with the distance penalty to it) and a model
    to start from that is far from the trained one."""

    def current_state(self) -> dict[str, torch.Tensor]:
        return state_of(self.model)

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    async def train_local(self, start: Any, penalty_coef: float = 0.0, epochs: Any = None
                          ) -> tuple[dict[str, torch.Tensor], float]:
        if start is not None:
            self.model.load_state_dict(start)
        penalty = distance_penalty(start, penalty_coef, CPU) if start is not None and penalty_coef else None
        loss = await self.fit(self.model, penalty)
        return state_of(self.model), loss

    async def pick(self, candidates: list[Any]) -> int:
        return 0


def drift(mu: float, coordinated: bool) -> float:
    """How far FedProx's local training moves a node from the model it starts the round from."""
    node = ProxNode(epochs=20)
    start = state_of(node.model)
    if coordinated:
        client = FedProxServer.client(node, FedProxOptions(mu=mu))  # type: ignore[misc, arg-type]
        update, _ = asyncio.run(client.train(Task("train", [start], groups=[0])))
        assert update.state is not None
        trained = update.state
    else:
        asyncio.run(FedProxPeer(node, FedProxOptions(mu=mu)).train(0))  # type: ignore[arg-type]
        trained = state_of(node.model)
    return distance(trained, start)


def test_mu_pulls_local_training_toward_its_start_and_alike_either_way() -> None:
    free, pulled = drift(0.0, coordinated=True), drift(5.0, coordinated=True)
    assert pulled < 0.5 * free
    assert drift(5.0, coordinated=False) == pytest.approx(pulled, rel=1e-6)  # the same start, the same training
    assert drift(0.0, coordinated=False) == pytest.approx(free, rel=1e-6)


def test_it_is_one_method_run_either_way_with_one_model_for_everyone() -> None:
    assert (FedProxServer.name, FedProxPeer.name, REGISTRY["fedprox-p2p"]) == ("fedprox", "fedprox-p2p", FedProxPeer)
    assert FedProxServer.options_type is FedProxPeer.options_type is FedProxOptions
    method = FedProxServer(FakeCoordinator(lambda n, t: None), FedProxOptions(mu=0.25))
    method.admit("n00")
    method.admit("n01")
    assert method.clusters() == {"n00": 0, "n01": 0} and method.served_model() is not None


def test_mu_comes_from_the_methods_own_table_and_the_old_key_says_where_it_went(tmp_path: Path) -> None:
    path = write(tmp_path, methods='["fedprox"]')
    path.write_text(path.read_text() + "\n[methods.fedprox]\nmu = 0.5\n")
    assert FedProxServer.options_from(load_checked(path)) == FedProxOptions(mu=0.5)
    old = tmp_path / "old.toml"
    old.write_text(write(tmp_path, methods='["fedprox"]').read_text() + "\n[central]\nprox_mu = 0.1\n")
    with pytest.raises(ConfigError, match=r"old\.toml: central\.prox_mu is now methods\.fedprox\.mu"):
        load_checked(old)
