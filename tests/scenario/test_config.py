"""A scenario that cannot work is refused before anything starts, with the file, the key and the rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from p2pfed.config import ConfigError
from p2pfed.methods import load_checked
from p2pfed.methods.pfedlia.options import P2POptions
from p2pfed.methods.pfedlia.p2p import PFedLIAP2P

BASE = ("[scenario]\nnodes = 4\nrounds = 5\nmethods = ['pfedlia-p2p']\n[data]\npartition.clusters = 2\n"
        "[methods.pfedlia-p2p]\nwarmup_rounds = 2\n")
EVENT = "[[events]]\nround = {round}\naction = '{action}'\nnode = {node}\n"


@pytest.mark.parametrize(("settings", "message"), [
    (["scenario.nodes=1"], "scenario.nodes must be at least 2"),
    (["scenario.rounds=0"], "scenario.rounds must be at least 1"),
    (["scenario.methods=[]"], "scenario.methods must name at least one method"),
    (["scenario.methods=['fedavg', 'nope']"], "scenario.methods: 'nope' not known; choose among fedavg, "),
    (["data.partition.kind=stripes"], "data.partition.kind must be one of pathological, "),
    (["data.partition.clusters=5"], "data.partition.clusters (5) must be between 1 and scenario.nodes (4)"),
    (["data.partition.kind='iid'"],
     "data.partition.clusters is not an option of the iid partition (its options: none; "),
    (["data.dataset=imagenet"], "data.dataset must be one of "),
    (["train.model=resnet1000"], "train.model must be one of "),
    (["train.participation=0"], "train.participation must be in (0, 1]"),
    (["train.participation=1.5"], "train.participation must be in (0, 1]"),
    (["train.eval_every=0"], "train.eval_every must be at least 1"),
    (["data.val_fraction=1.0"], "data.val_fraction must be in [0, 1)"),
    (["data.partition.kind='dirichlet'", "data.partition.clusters=0"],
     "data.partition.clusters is not an option of the dirichlet partition (its options: alpha; to change the kind "
     "with --set, give the whole table: --set 'data.partition={kind = \"dirichlet\"}')"),
    (["data.partition.kind='cluster-label-dirichlet'", "data.partition.alpha=0"],
     "data.partition.alpha must be > 0 (got 0.0)"),
    (["data.partition.kind='cluster-dirichlet'", "data.partition.alpha_within=-1"],
     "data.partition.alpha_between and alpha_within must be > 0 (got 0.1, -1.0)"),
    (["data.partition.kind='cluster-nclass'", "data.partition.k_client=4"],
     "data.partition.k_client must be in [1, k_cluster] (got 4, 3)"),
    (["data.partition.kind='noisy'", "data.partition.extra_prob=2"],
     "data.partition.extra_labels must be >= 0 and extra_prob in [0, 1] (got 1, 2.0)"),
    (["data.partition.kind='pathological'", "data.partition.extra_prob=0.5"],
     "data.partition.extra_prob is not an option of the pathological partition (its options: clusters, label_groups, "
     "per_node; "),
    (["data.partition.clusters='two'"], "data.partition.clusters must be int (got str 'two')"),
    (["data.partition.kind=3"], "data.partition.kind must be one of pathological, "),
    (["data.partition=3"], "data.partition must be a table, [data.partition], with kind and the partition's options"),
    # the [data] keys of the partitions, before [data.partition]
    (["data.partition='noisy'"], "data.partition is now a table: [data.partition] kind = 'noisy', with the"),
    (["data.clusters=2"], "data.clusters is now data.partition.clusters ([data.partition] clusters = ...)"),
    (["data.partition='dominant'", "data.dominant_share=0.5"],
     "data.dominant_share is now data.partition.share ([data.partition] share = ...)"),
    (["data.missing_classes=3"], "data.missing_classes is not an option of the pathological partition: drop it"),
    (["data.partition='missing'", "data.missing_classes=3"],
     "data.partition is now a table: [data.partition] kind = 'missing', with the partition's options; "
     "data.missing_classes is now data.partition.classes ([data.partition] classes = ...)"),
    (["data.partition='iid'", "data.clusters=3"], "data.clusters is not an option of the iid partition: drop it (a "
     "method with K models takes k in its own table)"),
    (["train.lr=0"], "train.epochs, train.batch_size and train.lr must be positive"),
    (["train.batch_size=0"], "train.epochs, train.batch_size and train.lr must be positive"),
    (["methods.pfedlia-p2p.warmup_rounds=5"],
     "methods.pfedlia-p2p.warmup_rounds (5) must be in [0, scenario.rounds = 5): the influence phase runs in that"),
    (["methods.pfedlia-p2p.lia_batch=0"], "methods.pfedlia-p2p.lia_epochs, lia_batch and lia_lr must be positive"),
    (["methods.pfedlia-p2p.gap=1.5"], "methods.pfedlia-p2p.gap must be in [0, 1] (got 1.5)"),
    (["methods.fesem.k=-1"], "methods.fesem.k must be >= 0 (0: the partition's clusters; got -1)"),
    (["methods.fesem.penalty=-1"], "methods.fesem.penalty must be in [0, 500000] (got -1.0)"),
    # what travels in a task must fit the bounds a node reads it with: no scenario has its tasks refused
    (["methods.fesem.penalty=6e5"], "methods.fesem.penalty must be in [0, 500000] (got 600000.0)"),
    (["methods.fedprox.mu=2e6"], "methods.fedprox.mu must be in [0, 1e+06] (got 2000000.0)"),
    (["methods.feddsmic.warmup=20000"], "warmup in [1, 10000] (got 10, 0.01, 20000)"),
    (["scenario.methods=['fesem']", "methods.fesem.k=9"], "methods.fesem.k (9) must not exceed scenario.nodes (4)"),
    (["scenario.methods=['ifca-cam']", "methods.ifca-cam.warmup=5"],
     "methods.ifca-cam.warmup (5) must be in [0, scenario.rounds = 5): the warm-up would leave no round"),
    (["methods.fesem-cam.warmup=0"],
     "methods.fesem-cam.warmup must be in [1, 10000] and penalty in [0, 1e+06] (got 0, 0.01)"),
    (["methods.cfl.eps2=0"], "methods.cfl.eps1 and eps2 must be > 0, min_size >= 1 and warmup >= 0"),
    (["methods.pfedlia-central.optics_min_samples=1"],
     "methods.pfedlia-central.optics_min_samples must be >= 2 and optics_xi in (0, 1) (got 1, 0.05)"),
    (["methods.pfedlia-central.optics_xi=1"], "optics_xi in (0, 1) (got 3, 1.0)"),
    (["methods.pfedlia-central.lia_timeout=0"], "methods.pfedlia-central.lia_timeout must be > 0 (got 0.0)"),
    (["methods.fedfm-lite.every=0"], "methods.fedfm-lite.every must be >= 1 (got 0)"),
    (["methods.fedfm-l2.temperature=0"], "methods.fedfm-l2.lam and start must be >= 0 and temperature > 0"),
    (["methods.feddsmic.indicator_per_class=0"], "methods.feddsmic.indicator_per_class must be >= 1, inner_lr > 0"),
    (["methods.fedds.inner_lr=0"], "methods.fedds.indicator_per_class must be >= 1, inner_lr > 0 and warmup in "
     "[1, 10000] (got 10, 0.0, 5)"),
    (["methods.fedprox.mu=-0.1"], "methods.fedprox.mu must be in [0, 1e+06] (got -0.1)"),
    (["methods.fedavg.mu=0.1"], "[methods.fedavg]: fedavg has no options"),
    (["methods.fesem.kk=2"], "methods.fesem.kk is not a known key (known: k, participation, penalty)"),
    # the former shared tables: each key says where it went, to every method that has it now
    (["central.prox_mu=0.1"], "central.prox_mu is now methods.fedprox.mu ([methods.fedprox] mu = ...)"),
    (["central.fomo_epsilon=0.1"], "central.fomo_epsilon is now methods.fedfomo.epsilon"),
    (["central.proto_lambda=1"], "central.proto_lambda is now methods.fedproto.lam ([methods.fedproto] lam = ...)"),
    (["central.cfl_eps1=0.1"], "central.cfl_eps1 is now methods.cfl.eps1 ([methods.cfl] eps1 = ...)"),
    (["central.k=2"], "central.k is now methods.fesem.k, methods.ifca.k, methods.ifca-cam.k, methods.fesem-cam.k, "
     "methods.feddsmic.k, methods.fedds.k ([methods.fesem] k = ...)"),
    (["central.cam_warmup=3"], "central.cam_warmup is now methods.ifca-cam.warmup, methods.fesem-cam.warmup, "
     "methods.feddsmic.warmup, methods.fedds.warmup"),
    (["central.fedfm_lambda=1"], "central.fedfm_lambda is now methods.fedfm.lam, methods.fedfm-l2.lam, "
     "methods.fedfm-lite.lam ([methods.fedfm] lam = ...)"),
    (["pfedlia.lia_batch=50"], "pfedlia.lia_batch is now methods.pfedlia-central.lia_batch, "
     "methods.pfedlia-p2p.lia_batch ([methods.pfedlia-central] lia_batch = ...)"),
    (["pfedlia.gap=0.5"], "pfedlia.gap is now methods.pfedlia-p2p.gap ([methods.pfedlia-p2p] gap = ...)"),
    (["central.nope=1"], "central.nope is not a known key (the [central] table is gone: a method's options are "
     "in its own [methods.NAME] table)"),
    (["methods.fedfomo.epsilon=2"], "methods.fedfomo.epsilon must be in [0, 1] (got 2.0)"),
    (["methods.fedfomo.m=0"], "methods.fedfomo.m must be >= 1 (got 0)"),
    (["methods.fedproto.lam=-1"], "methods.fedproto.lam must be >= 0 (got -1.0)"),
    (["scenario.workers=0"], "workers must be at least 1"),
    (["mesh.heartbeat=0"], "mesh.heartbeat must be in [0.01, 60] seconds (got 0"),
    (["mesh.heartbeat=61"], "mesh.heartbeat must be in [0.01, 60] seconds"),
    (["scenario.name=my lab"], "scenario.name must be up to 64 letters, digits, '-', '_' or '.'"),
    (["mesh.suspect_after=7"], "mesh.suspect_after must be >= 1 and < dead_after"),
    (["mesh.introduce_up_to=-1"], "mesh.introduce_up_to must be in [1, 1024] live peers, or 0 to leave it to the "
     "method (got -1)"),
    (["mesh.introduce_up_to=2000"], "mesh.introduce_up_to must be in [1, 1024] live peers, or 0 to leave it to the "
     "method (got 2000)"),
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
    *[(EVENT.format(round=1, action=action, node=0) + f"via = {via}\n", "",
       "events[0].via: a join goes through another node of the scenario (0..3), or leave via out")
      for action, via in [("join", 0), ("join", 4), ("join", -2), ("crash", 1)]],
])
def test_a_scripted_event_that_cannot_happen_is_named(tmp_path: Path, events: str, extra: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE.replace("[data]", extra + "[data]") + events)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: .*{re.escape(message)}"):
        load_checked(path)


def test_a_valid_scenario_loads_with_its_settings(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE + EVENT.format(round=1, action="crash", node=0))
    s = load_checked(path, ["train.participation=1", "methods.pfedlia-p2p.warmup_rounds=4"])
    assert (s.nodes, s.rounds, s.train.participation) == (4, 5, 1.0)
    assert PFedLIAP2P.options_from(s) == P2POptions(warmup_rounds=4)
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
    # a top-level key before the file's first table; no [methods.NAME] table of its own (pFedLIA's default
    # warm-up of 5 rounds needs a sixth)
    base = BASE.replace("[methods.pfedlia-p2p]\nwarmup_rounds = 2\n", "").replace("rounds = 5", "rounds = 6")
    path.write_text(text + base)
    with pytest.raises(ConfigError) as caught:
        load_checked(path, settings)
    assert message in str(caught.value)
