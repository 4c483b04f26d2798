"""FedProx: FedAvg whose train tasks carry μ, from its own [methods.fedprox] table."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pfed.config import ConfigError
from p2pfed.methods import load_checked
from p2pfed.methods.fedprox import FedProxOptions, FedProxServer
from tests.methods.fake import FakeCoordinator
from tests.scenario.test_mesh_learning import write


def test_every_train_task_carries_mu_as_the_proximal_penalty() -> None:
    method = FedProxServer(FakeCoordinator(lambda n, t: None), FedProxOptions(mu=0.25))
    method.admit("n00")
    assert method.train_task(0, "n00").instructions.penalty == 0.25


def test_mu_comes_from_the_methods_own_table_and_the_old_key_says_where_it_went(tmp_path: Path) -> None:
    path = write(tmp_path, methods='["fedprox"]')
    path.write_text(path.read_text() + "\n[methods.fedprox]\nmu = 0.5\n")
    assert FedProxServer.options_from(load_checked(path)) == FedProxOptions(mu=0.5)
    old = tmp_path / "old.toml"
    old.write_text(write(tmp_path, methods='["fedprox"]').read_text() + "\n[central]\nprox_mu = 0.1\n")
    with pytest.raises(ConfigError, match=r"old\.toml: central\.prox_mu is now methods\.fedprox\.mu"):
        load_checked(old)
