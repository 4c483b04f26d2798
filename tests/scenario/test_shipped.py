"""Every scenario file we ship loads, validates, and gives every node data to train and test on."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from p2pfed.methods import load_checked

SCENARIOS = sorted((Path(__file__).parents[2] / "scenarios").glob("*.toml"))
# train, test, and what the partition deals out: 10 labels, or the 4 languages of the scandinavian words
SIZES = {"digits": (1347, 450, 10), "fmnist": (60000, 10000, 10), "cifar10": (50000, 10000, 10),
         "cifar100": (50000, 10000, 100),
         "scandinavian": (18000, 6000, 4)}


def test_the_scenarios_folder_is_found() -> None:
    assert len(SCENARIOS) >= 10


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_partitions_give_every_node_data(path: Path) -> None:
    s = load_checked(path)
    n_train, n_test, keys = SIZES[s.data.dataset]
    # Balanced labels of the dataset's size stand in for the real ones (the partitions only read labels).
    y_train, y_test = np.arange(n_train) % keys, np.arange(n_test) % keys
    part = s.data.partition.build(y_train, y_test, s.nodes, s.seed, s.data.val_fraction)
    assert len(part.shards) == s.nodes
    empty = [i for i, sh in enumerate(part.shards) if len(sh.train) == 0 or len(sh.test) == 0]
    assert not empty, f"{path.name}: nodes {empty} get no training or test data"


@pytest.mark.parametrize(("extra", "message"), [
    ("methods = ['ifca-cam']\n[methods.ifca-cam]\nwarmup = 5\n", "warmup (5) must be in [0, scenario.rounds = 5)"),
    ("methods = ['fesem']\n[methods.fesem]\nk = 9\n", "must not exceed scenario.nodes (4)"),
])
def test_settings_that_cannot_work_are_refused_with_the_key(tmp_path: Path, extra: str, message: str) -> None:
    from p2pfed.config import ConfigError

    path = tmp_path / "s.toml"
    path.write_text("[scenario]\nnodes = 4\nrounds = 5\n" + extra + "[data]\npartition.clusters = 2\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_checked(path)


def test_set_overrides_change_settings_and_name_what_is_wrong(tmp_path: Path) -> None:
    from p2pfed.config import ConfigError

    path = tmp_path / "s.toml"
    path.write_text("[scenario]\nnodes = 4\nrounds = 5\n[data]\npartition.clusters = 2\n")
    s = load_checked(path, ["scenario.seed=3", "data.dataset=fmnist", "methods.fesem.k=2",
                            "scenario.methods=['fesem']"])
    assert (s.seed, s.data.dataset, s.method_tables, s.methods, s.data.clusters) == (
        3, "fmnist", {"fesem": {"k": 2}}, ["fesem"], 2)
    for bad, message in [("seed=3", "expected TABLE.KEY=VALUE"), ("model.depth=3", "unknown table \\[model\\]"),
                         ("data.clusterz=3", "with --set data.clusterz=3: .*clusterz"),
                         ("scenario.rounds=0", "rounds must be at least 1")]:
        with pytest.raises(ConfigError, match=message):
            load_checked(path, [bad])


def test_a_run_folder_takes_more_methods_only_of_the_same_scenario(tmp_path: Path) -> None:
    from p2pfed.config import ConfigError
    from p2pfed.launch.runner import prepare_run

    path = tmp_path / "s.toml"
    path.write_text("[scenario]\nnodes = 4\nrounds = 5\nmethods = ['fedavg', 'local']\n"
                    "[data]\npartition.clusters = 2\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "scenario.toml").write_text(path.read_text())  # as a finished run leaves it
    with pytest.raises(ConfigError, match="holds a run of another scenario"):
        prepare_run(path, out, methods=["local"], overrides=["scenario.seed=5"])
    # another partition is another scenario; the same one takes more methods
    (out / "scenario.toml").write_text(path.read_text().replace("partition.clusters = 2", "partition.kind = 'iid'"))
    path.write_text(path.read_text().replace("partition.clusters = 2", "partition.kind = 'missing'\n"
                                             "partition.classes = 0"))
    with pytest.raises(ConfigError, match=r"holds a run of another scenario \(data differ\)"):
        prepare_run(path, out, methods=["local"])
    (out / "scenario.toml").write_text(path.read_text())
    assert prepare_run(path, out, methods=["local"])[0].methods == ["local"]
