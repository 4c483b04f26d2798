"""The report over seeds: mean, sample standard deviation and the values of each metric, over the seeds
that ran a method to its end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from p2pfed.cli import parse_seeds
from p2pfed.report.seeds import aggregate, complete_methods, is_seeds_folder, seeds_table


def summary(**accuracies: float | None) -> dict:
    return {"methods": {m: {"accuracy": a, "ari": None, "bytes_sent": 10} for m, a in accuracies.items()}}


def test_mean_and_sample_sd_over_the_seeds_that_completed_a_method() -> None:
    summaries = {0: summary(a=0.8, b=0.5), 1: summary(a=0.9, b=0.7), 2: summary(a=0.7, b=0.1)}
    complete = {0: {"a", "b"}, 1: {"a", "b"}, 2: {"a"}}  # b was cut short in seed 2: not counted
    out = aggregate(summaries, complete)
    assert out["methods"]["a"]["accuracy"]["mean"] == pytest.approx(0.8)
    assert out["methods"]["a"]["accuracy"]["sd"] == pytest.approx(0.1)  # n - 1 in the denominator
    assert out["methods"]["b"]["seeds"] == [0, 1] and out["methods"]["b"]["accuracy"]["values"] == [0.5, 0.7]
    assert "ari" not in out["methods"]["a"]  # no value in any seed: no entry, not a zero
    assert out["methods"]["a"]["bytes_sent"] == {"mean": 10.0, "sd": 0.0, "values": [10.0, 10.0, 10.0]}
    table = seeds_table(out)
    assert "80.00 ± 10.00" in table and "60.00 ± 14.14" in table


def test_one_seed_has_no_spread() -> None:
    out = aggregate({3: summary(a=0.5)}, {3: {"a"}})
    assert out["methods"]["a"]["accuracy"]["sd"] is None
    assert "50.00 " in seeds_table(out) and "±" not in seeds_table(out).splitlines()[-1]


def test_a_seeds_folder_is_told_from_a_run_folder(tmp_path: Path) -> None:
    (tmp_path / "seed-0" / "fedavg").mkdir(parents=True)
    (tmp_path / "seed-0" / "partition.json").write_text(json.dumps({}))
    (tmp_path / "seed-0" / "fedavg" / "run.json").write_text("{}")
    (tmp_path / "seed-0" / "local").mkdir()  # started, never ended: no run.json
    assert is_seeds_folder(tmp_path) and not is_seeds_folder(tmp_path / "seed-0")
    assert complete_methods(tmp_path / "seed-0") == {"fedavg"}


@pytest.mark.parametrize(("text", "seeds"), [("4", [0, 1, 2, 3]), ("0-3", [0, 1, 2, 3]), ("0,1,5", [0, 1, 5]),
                                             ("2-3,7", [2, 3, 7])])
def test_seeds_are_a_count_or_a_list(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["0", "abc", "1,1", "3-1", "101", "-2"])
def test_bad_seeds_are_refused_with_the_forms_that_work(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="seeds"):
        parse_seeds(text)
