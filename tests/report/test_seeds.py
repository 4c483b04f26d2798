"""The report over seeds: mean, sample standard deviation and each seed's value of every metric, over the
seeds that ran a method to its end; and the run over seeds that resumes what is missing and refuses to mix
experiments."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from p2pfed.config import ConfigError
from p2pfed.launch import runner
from p2pfed.report.seeds import aggregate, complete_methods, ended_methods, is_seeds_folder, seeds_table


def summary(**accuracies: float | None) -> dict[str, Any]:
    return {"methods": {m: {"accuracy": a, "ari": None, "bytes_sent": 10, "nodes_finished": 4, "nodes": 4,
                            "crashed": {}} for m, a in accuracies.items()}}


def test_mean_and_sample_sd_over_the_seeds_that_ran_a_method_to_its_end() -> None:
    summaries = {0: summary(a=0.8, b=0.5), 1: summary(a=0.9, b=0.7), 2: summary(a=0.7, b=0.1)}
    ended = {0: {"a", "b"}, 1: {"a", "b"}, 2: {"a"}}  # b was cut short in seed 2: not counted
    out = aggregate(summaries, ended)
    assert out["methods"]["a"]["accuracy"]["mean"] == pytest.approx(0.8)
    assert out["methods"]["a"]["accuracy"]["sd"] == pytest.approx(0.1)  # n - 1 in the denominator
    assert out["methods"]["b"]["seeds"] == [0, 1] and out["methods"]["b"]["accuracy"]["values"] == [0.5, 0.7]
    assert (out["methods"]["b"]["nodes_finished"], out["methods"]["b"]["nodes"]) == (8, 8)
    assert "ari" not in out["methods"]["a"]  # no value in any seed: no entry, not a zero
    assert out["methods"]["a"]["bytes_sent"] == {"mean": 10.0, "sd": 0.0, "values": [10.0, 10.0, 10.0]}
    table = seeds_table(out)
    assert "80.00 ± 10.00" in table and "60.00 ± 14.14" in table and "8/8" in table


def test_a_seed_without_a_value_keeps_its_place() -> None:
    summaries = {0: summary(a=0.8), 1: summary(a=None), 2: summary(a=0.6)}
    entry = aggregate(summaries, {s: {"a"} for s in summaries})["methods"]["a"]
    assert entry["seeds"] == [0, 1, 2] and entry["accuracy"]["values"] == [0.8, None, 0.6]
    assert entry["accuracy"]["mean"] == pytest.approx(0.7)


def test_the_share_of_peers_in_own_cluster_is_reported_over_seeds_beside_the_ari() -> None:
    summaries = {s: summary(a=0.8, b=0.7) for s in (0, 1)}
    for s, share in [(0, 0.75), (1, 1.0)]:
        summaries[s]["methods"]["a"].update(ari=1.0, own_cluster_peers=share)
    out = aggregate(summaries, {s: {"a", "b"} for s in summaries})
    assert out["methods"]["a"]["own_cluster_peers"]["values"] == [0.75, 1.0]
    assert "own_cluster_peers" not in out["methods"]["b"]  # b chooses no peers
    header, _, *rows = seeds_table(out).splitlines()[1:]
    at = header.index("own-cluster peers %")
    assert [row[at:at + 11] for row in rows] == ["87.5 ± 17.7", "–" + " " * 10]


def test_one_seed_has_no_spread() -> None:
    out = aggregate({3: summary(a=0.5)}, {3: {"a"}})
    assert out["methods"]["a"]["accuracy"]["sd"] is None
    assert "50.00 " in seeds_table(out) and "±" not in seeds_table(out).splitlines()[-1]


def test_a_seeds_folder_is_told_from_a_run_folder(tmp_path: Path) -> None:
    (tmp_path / "seed-0" / "fedavg").mkdir(parents=True)
    (tmp_path / "seed-0" / "partition.json").write_text(json.dumps({}))
    (tmp_path / "seed-0" / "fedavg" / "run.json").write_text(json.dumps({"crashed": {}}))
    (tmp_path / "seed-0" / "ifca").mkdir()
    (tmp_path / "seed-0" / "ifca" / "run.json").write_text(json.dumps({"crashed": {"n01": "RuntimeError()"}}))
    (tmp_path / "seed-0" / "local").mkdir()  # started, never ended: no run.json
    assert is_seeds_folder(tmp_path) and not is_seeds_folder(tmp_path / "seed-0")
    assert set(ended_methods(tmp_path / "seed-0")) == {"fedavg", "ifca"}
    assert complete_methods(tmp_path / "seed-0") == {"fedavg"}  # a crash is run again when the run resumes


SCENARIO = "[scenario]\nnodes = 4\nrounds = 2\nmethods = ['fedavg', 'local', 'ifca']\n[data]\npartition.clusters = 2\n"


class FakeRuns:
    """run_scenario as the runner calls it, without learning: it records what it was asked and leaves each
    method's folder as a method that ran to its end does (records, run.json), except methods told to stop."""

    def __init__(self, stop_at: set[tuple[int, str]] | None = None) -> None:
        self.asked: list[tuple[int, list[str]]] = []
        self.stop_at = stop_at or set()

    def __call__(self, scenario: Any, out: Path, progress: Any = None) -> dict[str, Any]:
        self.asked.append((scenario.seed, list(scenario.methods)))
        (out / "partition.json").write_text(json.dumps({"nodes": ["n0"], "true_cluster": [0]}))
        for method in scenario.methods:
            (out / method).mkdir(exist_ok=True)
            (out / method / "n0.jsonl").write_text(json.dumps(
                {"event": "final", "node": "n0", "method": method, "round": 1, "time": 0.0,
                 "accuracy": 0.5 + scenario.seed / 10, "macro_f1": 0.5, "test_samples": 3}) + "\n")
            if (scenario.seed, method) in self.stop_at:
                raise KeyboardInterrupt
            (out / method / "run.json").write_text(json.dumps({"method": method, "seconds": 1.0, "crashed": {}}))
        return {}


def test_a_run_over_seeds_resumes_what_did_not_end_and_reports_over_every_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, out = tmp_path / "s.toml", tmp_path / "run"
    path.write_text(SCENARIO)
    fake = FakeRuns(stop_at={(1, "local")})
    monkeypatch.setattr(runner, "run_scenario", fake)
    assert runner.run_seeds(path, out, [0, 1]) is True  # Ctrl-C in seed 1's local
    assert fake.asked == [(0, ["fedavg", "local", "ifca"]), (1, ["fedavg", "local", "ifca"])]
    partial = json.loads((out / "summary.json").read_text())["methods"]
    assert partial["local"]["seeds"] == [0] and partial["fedavg"]["seeds"] == [0, 1]
    fake.asked, fake.stop_at = [], set()
    assert runner.run_seeds(path, out, [0, 1]) is False  # the same command resumes: seed 1's local and ifca
    assert fake.asked == [(1, ["local", "ifca"])]
    done = json.loads((out / "summary.json").read_text())
    assert done["seeds"] == [0, 1] and done["methods"]["local"]["accuracy"]["values"] == [0.5, 0.6]
    fake.asked = []
    assert runner.run_seeds(path, out, [2], methods=["fedavg"]) is False  # one more seed of one method
    assert fake.asked == [(2, ["fedavg"])]
    assert json.loads((out / "summary.json").read_text())["methods"]["fedavg"]["seeds"] == [0, 1, 2]


@pytest.mark.parametrize(("seeds", "overrides", "message"), [
    ([0], ["scenario.seed=3"], "leave --set scenario.seed out"),
    ([2], ["train.lr=0.2"], "holds a run of other settings (train differ)"),
    ([0], [], "holds the run of one scenario"),
])
def test_a_run_over_seeds_that_would_mix_experiments_is_refused_before_it_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeds: list[int], overrides: list[str], message: str) -> None:
    path, out = tmp_path / "s.toml", tmp_path / "run"
    path.write_text(SCENARIO)
    fake = FakeRuns()
    monkeypatch.setattr(runner, "run_scenario", fake)
    runner.run_seeds(path, out, [0, 1])
    if "one scenario" in message:
        out = out / "seed-0"  # a run folder of one seed is not a folder of seeds
    fake.asked = []
    with pytest.raises(ConfigError, match=re.escape(message)):
        runner.run_seeds(path, out, seeds, overrides=overrides)
    assert fake.asked == []  # refused before any seed ran
    with pytest.raises(ConfigError, match="holds a run over seeds"):
        runner.prepare_run(path, tmp_path / "run", None)  # nor does a run of one seed go into a folder of seeds


def test_a_report_over_seed_folders_of_different_settings_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from p2pfed.report.seeds import write_seeds_report

    path, out = tmp_path / "s.toml", tmp_path / "run"
    path.write_text(SCENARIO)
    monkeypatch.setattr(runner, "run_scenario", FakeRuns())
    runner.run_seeds(path, out, [0, 1])
    edited = out / "seed-1" / "scenario.toml"
    edited.write_text(edited.read_text() + "\n[train]\nlr = 0.2\n")
    with pytest.raises(ValueError, match=re.escape("seed-1 holds a run of other settings than the seeds before it "
                                                   "(train differ)")):
        write_seeds_report(out)
