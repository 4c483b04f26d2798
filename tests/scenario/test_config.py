"""A scenario that cannot work is refused before anything starts, with the file, the key and the rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from p2pfed.config import ConfigError
from p2pfed.methods import load_checked

BASE = ("[scenario]\nnodes = 4\nrounds = 5\nmethods = ['pfedlia-p2p']\n[data]\nclusters = 2\n"
        "[pfedlia]\nwarmup_rounds = 2\n")
EVENT = "[[events]]\nround = {round}\naction = '{action}'\nnode = {node}\n"


@pytest.mark.parametrize(("settings", "message"), [
    (["scenario.nodes=1"], "scenario.nodes must be at least 2"),
    (["scenario.rounds=0"], "scenario.rounds must be at least 1"),
    (["scenario.methods=[]"], "scenario.methods must name at least one method"),
    (["scenario.methods=['fedavg', 'nope']"], "scenario.methods: 'nope' not known; choose among fedavg, "),
    (["data.partition=stripes"], "data.partition must be one of pathological, "),
    (["data.clusters=5"], "data.clusters (5) must be between 1 and scenario.nodes (4) for the pathological partition"),
    (["data.dataset=imagenet"], "data.dataset must be one of "),
    (["train.model=resnet1000"], "train.model must be one of "),
    (["train.participation=0"], "train.participation must be in (0, 1]"),
    (["train.participation=1.5"], "train.participation must be in (0, 1]"),
    (["train.eval_every=0"], "train.eval_every must be at least 1"),
    (["data.val_fraction=1.0"], "data.val_fraction must be in [0, 1)"),
    (["data.alpha=0"], "data.alpha, alpha_between and alpha_within must be > 0"),
    (["data.alpha_within=-1"], "data.alpha, alpha_between and alpha_within must be > 0"),
    (["data.k_client=4"], "data.k_client must be in [1, data.k_cluster]"),
    (["data.dominant_share=0"], "data.dominant_classes must be >= 1, dominant_share in (0, 1], missing_classes >= 0"),
    (["data.missing_classes=-1"], "missing_classes >= 0"),
    (["train.lr=0"], "train.epochs, train.batch_size and train.lr must be positive"),
    (["train.batch_size=0"], "train.epochs, train.batch_size and train.lr must be positive"),
    (["pfedlia.warmup_rounds=5"], "pfedlia.warmup_rounds must be in [0, rounds)"),
    (["pfedlia.lia_batch=0"], "pfedlia.lia_* must be positive"),
    (["central.k=-1"], "central.k and fesem_lambda must be >= 0"),
    (["central.prox_mu=0.1"], "central.prox_mu is now methods.fedprox.mu ([methods.fedprox] mu = ...)"),
    (["methods.fedprox.mu=-0.1"], "methods.fedprox.mu must be >= 0 (got -0.1)"),
    (["central.cfl_eps2=0"], "central.cfl_* must be positive"),
    (["central.optics_min_samples=1"], "central.optics_min_samples must be >= 2, optics_xi in (0, 1)"),
    (["central.optics_xi=1"], "optics_xi in (0, 1)"),
    (["central.lia_timeout=0"], "central.lia_timeout must be positive"),
    (["central.fedfm_every=0"], "fedfm_temperature > 0, fedfm_every >= 1"),
    (["central.fedfm_temperature=0"], "fedfm_temperature > 0"),
    (["central.indicator_per_class=0"], "central.indicator_per_class must be >= 1 and maml_inner_lr > 0"),
    (["central.maml_inner_lr=0"], "maml_inner_lr > 0"),
    (["central.fomo_epsilon=0.1"], "central.fomo_epsilon is now methods.fedfomo.epsilon"),
    (["central.proto_lambda=1"], "central.proto_lambda is now methods.fedproto.lam ([methods.fedproto] lam = ...)"),
    (["methods.fedfomo.epsilon=2"], "methods.fedfomo.epsilon must be in [0, 1] (got 2.0)"),
    (["methods.fedfomo.m=0"], "methods.fedfomo.m must be >= 1 (got 0)"),
    (["methods.fedproto.lam=-1"], "methods.fedproto.lam must be >= 0 (got -1.0)"),
    (["scenario.workers=0"], "workers must be at least 1"),
    (["mesh.heartbeat=0"], "mesh.heartbeat must be in [0.01, 60] seconds (got 0"),
    (["mesh.heartbeat=61"], "mesh.heartbeat must be in [0.01, 60] seconds"),
    (["scenario.name=my lab"], "scenario.name must be up to 64 letters, digits, '-', '_' or '.'"),
    (["mesh.suspect_after=7"], "mesh.suspect_after must be >= 1 and < dead_after"),
    (["mesh.mesh=a/b"], "mesh.mesh must be a name of up to 64 letters, digits, '-', '_' or '.'"),
    (["train.epochs=two"], "train.epochs must be int (got str 'two')"),
])
def test_each_setting_that_cannot_work_is_named(tmp_path: Path, settings: list[str], message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))} with --set [^:]*: .*{re.escape(message)}"):
        load_checked(path, settings)


@pytest.mark.parametrize(("events", "extra", "message"), [
    (EVENT.format(round=1, action="explode", node=0), "", "events[0].action must be one of join, leave, crash, slow"),
    (EVENT.format(round=1, action="join", node=4), "", "events[0] names node 4 / round 1 outside the scenario"),
    (EVENT.format(round=5, action="crash", node=0), "", "events[0] names node 0 / round 5 outside the scenario"),
    (EVENT.format(round=1, action="crash", node=0), "workers = 2\n",
     "events need workers = 1 (all nodes here) or processes = true"),
])
def test_a_scripted_event_that_cannot_happen_is_named(tmp_path: Path, events: str, extra: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE.replace("[data]", extra + "[data]") + events)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: .*{re.escape(message)}"):
        load_checked(path)


def test_a_valid_scenario_loads_with_its_settings(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE + EVENT.format(round=1, action="crash", node=0))
    s = load_checked(path, ["train.participation=1", "pfedlia.warmup_rounds=4"])
    assert (s.nodes, s.rounds, s.train.participation, s.pfedlia.warmup_rounds) == (4, 5, 1.0, 4)
    assert s.events[0].action == "crash" and s.path == str(path)
    assert s.mesh_for("fedavg").mesh == s.mesh_name("fedavg") == f"{s.name}-fedavg"
    assert s.mesh_for("fedavg").heartbeat == s.mesh.heartbeat and s.mesh.mesh == "default"
    with pytest.raises(ConfigError, match=r"s\.toml: unknown table \[modle\]"):
        path.write_text(BASE + "[modle]\nx = 1\n")
        load_checked(path)


@pytest.mark.parametrize(("text", "settings", "message"), [
    ('methods = ["fedavg"]\n', [], "methods must be [methods.NAME] tables of a method's options (the methods to "
     "run are scenario.methods, in [scenario])"),
    ('methods = ["fedavg"]\n', ["methods.perfedavg.inner_lr=0.1"], "methods in the file is not a table"),
    ("[methods]\nperfedavg = 3\n", [], "methods.perfedavg must be a table of the method's options"),
])
def test_a_methods_key_that_is_not_a_table_of_tables_is_named(
        tmp_path: Path, text: str, settings: list[str], message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text + BASE)  # a top-level key before the file's first table
    with pytest.raises(ConfigError) as caught:
        load_checked(path, settings)
    assert message in str(caught.value)
