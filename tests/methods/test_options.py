"""Every method's options live in its own [methods.NAME] table: the defaults are valid, every key of the former
shared tables says where it went, and a value is checked against the run only for the methods that run."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from p2pfed.config import ConfigError
from p2pfed.methods import CENTRAL, MOVED, OPTIONS, REGISTRY, load_checked
from p2pfed.methods.cam import IFCACAMOptions
from p2pfed.methods.fesem import FeSEMServer

# Every key the former [pfedlia] and [central] tables had (scenario/config.py before the move).
FORMER = {
    "pfedlia": ["warmup_rounds", "lia_epochs", "lia_batch", "lia_lr", "gap"],
    "central": ["k", "fesem_lambda", "prox_mu", "cfl_eps1", "cfl_eps2", "cfl_warmup", "cfl_min_size",
                "optics_min_samples", "optics_xi", "cam_warmup", "indicator_per_class", "maml_inner_lr",
                "fedfm_lambda", "fedfm_start", "fedfm_temperature", "fedfm_uniform", "fedfm_every", "lia_timeout",
                "proto_lambda", "fomo_m", "fomo_epsilon"],
}
BASE = "[scenario]\nnodes = 4\nrounds = 5\nmethods = {methods}\n[data]\npartition.clusters = 2\n"


def test_every_key_of_the_former_tables_went_to_a_field_of_each_method_that_reads_it() -> None:
    assert sorted(MOVED) == sorted((table, key) for table, keys in FORMER.items() for key in keys)
    for (table, key), targets in MOVED.items():
        for method, new in targets:
            options = OPTIONS[method]
            assert options is not None and new in {f.name for f in dataclasses.fields(options)}, (table, key)


@pytest.mark.parametrize("method", sorted(OPTIONS))
def test_the_defaults_of_every_method_are_valid(method: str) -> None:
    options = OPTIONS[method]
    if options is None:
        assert (CENTRAL.get(method) or REGISTRY[method]).options_type is None
        return
    options().validate(f"methods.{method}.")


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


def test_the_options_are_one_frozen_object_per_method() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        IFCACAMOptions().warmup = 3  # type: ignore[misc]
