"""Every method's options live in its own [methods.NAME] table: the defaults are valid, every key of the former
shared tables says where it went, and a value is checked against the run only for the methods that run."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from p2pfed.config import ConfigError
from p2pfed.methods import CENTRAL, OPTIONS, REGISTRY, load_checked
from p2pfed.methods.feddsmic import FedDSMICOptions, PaperFedDSMICOptions, PaperFedDSOptions
from p2pfed.methods.fesem import FeSEMServer
from p2pfed.methods.former import FORMER
from p2pfed.methods.pfedlia.options import PaperCentralOptions, PaperP2POptions
from p2pfed.scenario.config import Scenario

# Every key the former [pfedlia] and [central] tables had (scenario/config.py before the move).
KEYS = {
    "pfedlia": ["warmup_rounds", "lia_epochs", "lia_batch", "lia_lr", "gap"],
    "central": ["k", "fesem_lambda", "prox_mu", "cfl_eps1", "cfl_eps2", "cfl_warmup", "cfl_min_size",
                "optics_min_samples", "optics_xi", "cam_warmup", "indicator_per_class", "maml_inner_lr",
                "fedfm_lambda", "fedfm_start", "fedfm_temperature", "fedfm_uniform", "fedfm_every", "lia_timeout",
                "proto_lambda", "fomo_m", "fomo_epsilon"],
}
BASE = "[scenario]\nnodes = 4\nrounds = 5\nmethods = {methods}\n[data]\npartition.clusters = 2\n"


def test_every_key_of_the_former_tables_went_to_a_field_of_each_method_that_reads_it() -> None:
    assert sorted(FORMER) == sorted((table, key) for table, keys in KEYS.items() for key in keys)
    for (table, key), targets in FORMER.items():
        for method, new in targets:
            options = OPTIONS[method]
            assert options is not None and new in {f.name for f in dataclasses.fields(options)}, (table, key)


# Every method's defaults, as the shared tables had them: the results of a scenario that sets nothing must not
# move (a changed default changes every run that relies on it).
DEFAULTS = {
    # confidence, window, probe_every and fallback: new (the choice that keeps learning, beyond the paper);
    # sample and all_pairs_up_to: new (scoring a sample in a mesh of more than 100, beyond the paper)
    "pfedlia-p2p": {"warmup_rounds": 5, "lia_epochs": 20, "lia_batch": 100, "lia_lr": 0.05, "gap": 0.8,
                    "selection": "ours", "confidence": 0.9, "window": 3, "margin": 0.1, "probe_every": 4,
                    "fallback": True, "start": "partials", "sample": 16, "all_pairs_up_to": 100},
    "pfedlia-p2p-paper": {"warmup_rounds": 5, "lia_epochs": 20, "lia_batch": 100, "lia_lr": 0.05, "gap": 0.8,
                          "selection": "paper", "confidence": 0.0, "window": 0, "margin": 0.1, "probe_every": 0,
                          "fallback": False, "start": "w0", "sample": 0, "all_pairs_up_to": 100},
    "pfedlia-central": {"warmup_rounds": 5, "lia_epochs": 20, "lia_batch": 100, "lia_lr": 0.05, "optics": "ours",
                        "optics_min_samples": 3, "optics_xi": 0.05, "lia_timeout": 300.0},
    "pfedlia-central-paper": {"warmup_rounds": 5, "lia_epochs": 20, "lia_batch": 100, "lia_lr": 0.05,
                              "optics": "paper", "optics_min_samples": 3, "optics_xi": 0.05, "lia_timeout": 300.0},
    "fesem": {"k": 0, "penalty": 0.01, "participation": 0.0}, "ifca": {"k": 0},
    "ifca-cam": {"k": 0, "warmup": 5}, "fesem-cam": {"k": 0, "warmup": 5, "penalty": 0.01},
    "cfl": {"eps1": 0.4, "eps2": 1.6, "warmup": 20, "min_size": 2},
    "feddsmic": {"k": 0, "indicator_per_class": 10, "inner_lr": 0.01, "warmup": 5, "init": "kmeans"},
    "fedds": {"k": 0, "indicator_per_class": 10, "inner_lr": 0.01, "warmup": 5, "init": "kmeans"},
    "feddsmic-paper": {"k": 0, "indicator_per_class": 10, "inner_lr": 0.01, "warmup": 5, "init": "random"},
    "fedds-paper": {"k": 0, "indicator_per_class": 10, "inner_lr": 0.01, "warmup": 5, "init": "random"},
    "fedfm": {"lam": 10.0, "start": 20, "temperature": 0.1, "uniform": False},
    "fedfm-l2": {"lam": 10.0, "start": 20, "temperature": 0.1, "uniform": False},
    "fedfm-lite": {"lam": 10.0, "start": 20, "temperature": 0.1, "uniform": False, "every": 5},
    "fedprox": {"mu": 0.01}, "fedprox-p2p": {"mu": 0.01}, "fedproto": {"lam": 1.0}, "fedfomo": {"m": 5, "epsilon": 0.3},
    "perfedavg": {"inner_lr": 0.01, "personal_steps": 1},
    "fedavgm": {"momentum": 0.9, "server_lr": 1.0}, "scaffold": {"server_lr": 1.0},
    "fedavg-ensemble": {"k": 0}, "fedprox-ensemble": {"k": 0, "mu": 0.01},
    "fedprox-fm": {"lam": 10.0, "start": 20, "temperature": 0.1, "uniform": False, "mu": 0.01},
    "dpsgd": {"topology": "ring", "degree": 4}, "epidemic": {"fanout": 0},
}


@pytest.mark.parametrize("method", sorted(OPTIONS))
def test_every_methods_defaults_are_the_former_ones_valid_and_frozen(method: str) -> None:
    options = OPTIONS[method]
    if options is None:  # fedavg, local, oracle and their p2p forms, and gossip, have nothing to set
        assert method not in DEFAULTS and method.removesuffix("-p2p") in ("fedavg", "local", "oracle", "gossip")
        return
    assert dataclasses.asdict(options()) == DEFAULTS[method]
    options().validate(f"methods.{method}.")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options().k = 3  # type: ignore[attr-defined]


def test_a_method_that_does_not_run_has_its_values_checked_but_not_against_the_run(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE.format(methods="['fedavg']") + "[methods.ifca-cam]\nwarmup = 9\n")
    assert load_checked(path).method_tables == {"ifca-cam": {"warmup": 9}}  # 9 of 5 rounds: ifca-cam is not run
    with pytest.raises(ConfigError, match=re.escape("methods.ifca-cam.warmup (9) must be in [0, scenario.rounds")):
        load_checked(path, ["scenario.methods=['ifca-cam']"])
    with pytest.raises(ConfigError, match=re.escape("methods.ifca-cam.k must be >= 0")):
        load_checked(path, ["methods.ifca-cam.k=-2"])


def test_k_of_zero_takes_the_partitions_clusters_and_a_partition_without_any_needs_k(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE.format(methods="['fesem']"))
    assert FeSEMServer.options_from(load_checked(path)).k == 0  # the server takes the partition's 2 then
    assert load_checked(path).data.clusters == 2
    path.write_text(BASE.format(methods="['fesem']").replace("partition.clusters = 2", "partition.kind = 'dirichlet'"))
    with pytest.raises(ConfigError, match=re.escape("methods.fesem.k must be given: the dirichlet partition has no "
                                                    "clusters to take it from")):
        load_checked(path)
    assert FeSEMServer.options_from(load_checked(path, ["methods.fesem.k=3"])).k == 3


def test_an_old_file_is_told_where_every_key_went_at_once(tmp_path: Path) -> None:
    path = tmp_path / "old.toml"
    path.write_text(BASE.format(methods="['ifca-cam', 'pfedlia-p2p']").replace("partition.clusters", "clusters")
                    + "[pfedlia]\nwarmup_rounds = 2\n[central]\ncam_warmup = 2\n")
    with pytest.raises(ConfigError) as caught:
        load_checked(path)
    assert str(caught.value) == (
        f"{path}: data.clusters is now data.partition.clusters ([data.partition] clusters = ...); "
        "central.cam_warmup is now methods.ifca-cam.warmup, methods.fesem-cam.warmup, "
        "methods.feddsmic.warmup, methods.fedds.warmup ([methods.ifca-cam] warmup = ...); "
        "pfedlia.warmup_rounds is now methods.pfedlia-central.warmup_rounds, methods.pfedlia-p2p.warmup_rounds "
        "([methods.pfedlia-central] warmup_rounds = ...)")
    path.write_text(BASE.format(methods="['fedavg']") + "[central]\n")
    with pytest.raises(ConfigError, match=r"old\.toml: the \[central\] table is gone: a method's options are in"):
        load_checked(path)


def test_a_paper_form_takes_its_base_methods_table_but_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE.format(methods='["pfedlia-p2p", "pfedlia-p2p-paper", "pfedlia-central-paper"]')
                    + "[methods.pfedlia-p2p]\nwarmup_rounds = 1\nlia_batch = 7\nselection = 'ours'\nwindow = 5\n"
                    + "[methods.pfedlia-central]\nwarmup_rounds = 2\noptics = 'ours'\n")
    scenario = load_checked(path)
    assert options_of("pfedlia-p2p-paper", scenario) == PaperP2POptions(warmup_rounds=1, lia_batch=7, selection="paper")
    assert options_of("pfedlia-central-paper", scenario) == PaperCentralOptions(warmup_rounds=2, optics="paper")
    # its own table wins, and a bad inherited value is named where it is written
    assert options_of("pfedlia-p2p-paper", load_checked(path, ["methods.pfedlia-p2p-paper.lia_batch=9"])).lia_batch == 9
    with pytest.raises(ConfigError, match=r"methods\.pfedlia-p2p\.lia_epochs, lia_batch and lia_lr must be positive"):
        load_checked(path, ["methods.pfedlia-p2p.lia_batch=0"])
    with pytest.raises(ConfigError, match=r"methods\.pfedlia-p2p-paper\.selection must be one of ours, paper"):
        load_checked(path, ["methods.pfedlia-p2p-paper.selection=best"])
    with pytest.raises(ConfigError, match=r"methods\.pfedlia-p2p\.start must be one of partials, w0 \(got 'mean'\)"):
        load_checked(path, ["methods.pfedlia-p2p.start='mean'"])
    assert options_of("pfedlia-p2p", scenario).start == "partials"
    assert options_of("pfedlia-p2p-paper", scenario).start == "w0"
    # ... also when the value does not fit the run, and the base method does not run
    with pytest.raises(ConfigError, match=r"methods\.pfedlia-p2p\.warmup_rounds \(5\) must be in \[0, scenario"):
        load_checked(path, ["methods.pfedlia-p2p.warmup_rounds=5", "scenario.methods=['pfedlia-p2p-paper']"])
    # the choice that keeps learning: levels and windows in range, and probes and fallback only with a window
    with pytest.raises(ConfigError, match=r"methods\.pfedlia-p2p\.confidence must be in \[0, 1\) \(got 1\.0\)"):
        load_checked(path, ["methods.pfedlia-p2p.confidence=1.0"])
    with pytest.raises(ConfigError, match=r"window must be in 0\.\.50 and probe_every in 0\.\.1000 \(got 51, 4\)"):
        load_checked(path, ["methods.pfedlia-p2p.window=51"])
    with pytest.raises(ConfigError, match=r"probe_every and fallback need evidence over rounds"):
        load_checked(path, ["methods.pfedlia-p2p.window=0"])
    assert options_of("pfedlia-p2p", load_checked(path, ["methods.pfedlia-p2p.window=0",
                                                         "methods.pfedlia-p2p.probe_every=0",
                                                         "methods.pfedlia-p2p.fallback=false"])).window == 0



def test_the_paper_forms_of_feddsmic_and_fedds_take_their_base_tables_but_start_from_random_centers(
        tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE.format(methods='["feddsmic", "feddsmic-paper", "fedds-paper"]')
                    + "[methods.feddsmic]\nwarmup = 2\ninner_lr = 0.05\ninit = 'kmeans'\n"
                    + "[methods.fedds]\nindicator_per_class = 4\n")
    scenario = load_checked(path)
    assert options_of("feddsmic-paper", scenario) == PaperFedDSMICOptions(warmup=2, inner_lr=0.05, init="random")
    assert options_of("fedds-paper", scenario) == PaperFedDSOptions(indicator_per_class=4, init="random")
    assert options_of("feddsmic", scenario) == FedDSMICOptions(warmup=2, inner_lr=0.05, init="kmeans")
    told = load_checked(path, ["methods.feddsmic-paper.init='kmeans'"])  # its own table may still say otherwise
    assert options_of("feddsmic-paper", told) == PaperFedDSMICOptions(warmup=2, inner_lr=0.05, init="kmeans")


def options_of(method: str, scenario: Scenario) -> object:
    return (CENTRAL.get(method) or REGISTRY[method]).options_from(scenario)
