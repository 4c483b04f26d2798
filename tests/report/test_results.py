"""The report reads what methods record, whatever their names: a node's choice of peers gives the clusters
(their mutual choices) and says who keeps an adversary out; a coordinator's assignment does the same for the
clustered methods; score rows give the heatmaps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from p2pfed.report.records import append_record
from p2pfed.report.results import report_run, summarize_method, write_report

NODES = ["n00", "n01", "n02", "n03"]
PARTITION = {"nodes": NODES, "true_cluster": [0, 0, 1, 1], "adversaries": {"n03": "noise-model"}}


def run_folder(tmp_path: Path, method: str, records: dict[str, list[tuple[str, dict[str, Any]]]]) -> Path:
    (tmp_path / "partition.json").write_text(json.dumps(PARTITION))
    folder = tmp_path / method
    folder.mkdir()
    for member, lines in records.items():
        for event, fields in lines:
            append_record(folder / f"{member}.jsonl", event, member, method, 3, **fields)
    return folder


def final(accuracy: float) -> tuple[str, dict[str, Any]]:
    return "final", {"accuracy": accuracy, "macro_f1": accuracy, "bytes_sent": 10}


@pytest.mark.parametrize("event", ["choice", "lia"])  # lia: a choice as runs made before it had a general name
def test_a_method_whose_nodes_choose_their_peers_is_clustered_by_their_mutual_choices(
        tmp_path: Path, event: str) -> None:
    chosen = {"n00": ["n01"], "n01": ["n00"], "n02": ["n03"], "n03": ["n02"]}
    folder = run_folder(tmp_path, "any-new-method", {
        n: [(event, {"chosen": chosen[n], "scores": {p: 1.0 for p in chosen[n]}}), final(0.5 + i / 10)]
        for i, n in enumerate(NODES)})
    summary = summarize_method(folder, PARTITION)
    assert summary["ari"] == 1.0 and summary["nodes_finished"] == 4
    assert summary["accuracy"] == pytest.approx((0.5 + 0.6 + 0.7) / 3)  # the adversary n03 is not counted
    assert summary["adversaries"] == {"n03": {"kind": "noise-model", "excluded_by": 0.0}}  # n02 chose it


def test_a_node_that_later_chooses_nobody_lowers_the_ari_but_not_that_of_the_first_choices(tmp_path: Path) -> None:
    chosen = {"n00": ["n01"], "n01": ["n00"], "n02": ["n03"], "n03": ["n02"]}
    records = {n: [("choice", {"chosen": chosen[n]}), final(0.9)] for n in NODES}
    for n in ("n00", "n01"):  # both fall back to training alone
        records[n].insert(1, ("choice", {"chosen": []}))
    summary = summarize_method(run_folder(tmp_path, "pfedlia-p2p", records), PARTITION)
    assert summary["first_choice_ari"] == 1.0
    assert summary["ari"] == pytest.approx(0.5714285714285715)  # n00 and n01 apart: {n00}, {n01}, {n02, n03}


def test_a_method_whose_nodes_choose_nobody_has_no_first_choice_ari(tmp_path: Path) -> None:
    summary = summarize_method(run_folder(tmp_path, "plain", {n: [final(0.9)] for n in NODES}), PARTITION)
    assert summary["first_choice_ari"] is None


def test_a_clustered_method_is_judged_by_the_coordinators_last_assignment(tmp_path: Path) -> None:
    assignment = {"n00": 0, "n01": 0, "n02": 1, "n03": 2}
    folder = run_folder(tmp_path, "another-method", {
        **{n: [final(0.9)] for n in NODES},
        "coordinator": [("final", {"assignment": assignment, "bytes_sent": 5})]})
    summary = summarize_method(folder, PARTITION)
    assert summary["ari"] == pytest.approx(0.5714285714285715) and summary["bytes_sent"] == 45
    assert summary["adversaries"]["n03"]["excluded_by"] == 1.0  # n02 is not grouped with it


def test_a_method_with_neither_has_no_clusters(tmp_path: Path) -> None:
    folder = run_folder(tmp_path, "plain", {n: [final(0.9)] for n in NODES})
    summary = summarize_method(folder, PARTITION)
    assert summary["ari"] is None and summary["adversaries"]["n03"]["excluded_by"] is None


def test_score_rows_and_choices_are_drawn_as_heatmaps(tmp_path: Path) -> None:
    rows = {n: [("scores", {"peers": NODES, "values": [0.1, -0.2, 0.3, 0.0]}), final(0.8)] for n in NODES}
    run_folder(tmp_path, "scored", {**rows, "coordinator": [("final", {"assignment": dict.fromkeys(NODES, 0)})]})
    write_report(tmp_path)
    assert (tmp_path / "influence-scored.png").stat().st_size > 1000
    assert (tmp_path / "peers-scored.png").stat().st_size > 1000
    assert "scored" in (tmp_path / "results.md").read_text()


def test_micro_accuracy_weighs_each_node_by_its_test_samples(tmp_path: Path) -> None:
    # n00 finished (its final record says it evaluated 300 samples); n01 and n02 never finished: their last
    # round counts, with their test shard's size from the partition; the adversary n03 is not counted.
    partition = {**PARTITION, "test": [999, 100, 100, 50]}
    folder = run_folder(tmp_path, "weighted", {
        "n00": [("final", {"accuracy": 0.9, "macro_f1": 0.9, "test_samples": 300})],
        "n01": [("round", {"round": 1, "accuracy": 0.5, "macro_f1": 0.5})],
        "n02": [("round", {"round": 1, "accuracy": 0.3, "macro_f1": 0.3})],
        "n03": [("final", {"accuracy": 0.0, "macro_f1": 0.0, "test_samples": 50})]})
    summary = summarize_method(folder, partition)
    assert summary["micro_accuracy"] == pytest.approx((0.9 * 300 + 0.5 * 100 + 0.3 * 100) / 500)
    assert summary["accuracy"] == pytest.approx((0.9 + 0.5 + 0.3) / 3)
    assert summarize_method(folder, PARTITION)["micro_accuracy"] is None  # sizes unknown: no figure, not a guess


def test_the_feddsmic_papers_figures_the_best_five_rounds_and_the_five_worst_nodes(tmp_path: Path) -> None:
    partition = {"nodes": NODES, "true_cluster": [0, 0, 1, 1], "adversaries": {}, "test": [10, 10, 10, 30]}
    rounds = {n: [("round", {"round": r, "accuracy": (r + i) / 10, "macro_f1": 0.5}) for r in range(7)]
              for i, n in enumerate(NODES)}
    rounds["n03"] = rounds["n03"][:-1]  # n03 was not evaluated in round 6: that round does not count
    folder = run_folder(tmp_path, "swinging", rounds)
    summary = summarize_method(folder, partition)
    # round r's micro accuracy: (10·r + 10·(r+1) + 10·(r+2) + 30·(r+3)) / 60 / 10 = (6r + 12) / 60
    assert summary["best5_rounds_micro_accuracy"] == pytest.approx(sum((6 * r + 12) / 60 for r in range(1, 6)) / 5)
    assert summary["worst5_accuracy"] == pytest.approx((0.6 + 0.7 + 0.8 + 0.8) / 4)  # fewer than 5 nodes: all


def test_a_one_way_choice_across_clusters_lowers_the_share_of_peers_in_own_cluster_but_not_the_ari(
        tmp_path: Path) -> None:
    # n00-n01 and n02-n03 choose each other (ARI 1), but n01 also chose n02 of the other cluster, one way;
    # n04 and n05 train on data of their own (true cluster -1): what they chose does not count (were it
    # counted, their choice of each other would raise the share to 6/7).
    partition = {"nodes": [*NODES, "n04", "n05"], "true_cluster": [0, 0, 1, 1, -1, -1], "adversaries": {}}
    chosen = {"n00": ["n01"], "n01": ["n00", "n02"], "n02": ["n03"], "n03": ["n02"], "n04": ["n05"],
              "n05": ["n04"]}
    run_folder(tmp_path, "one-way", {
        n: [("choice", {"chosen": c, "scores": dict.fromkeys(c, 1.0)}), final(0.8)] for n, c in chosen.items()})
    (tmp_path / "partition.json").write_text(json.dumps(partition))
    summary = write_report(tmp_path)["methods"]["one-way"]
    assert summary["ari"] == 1.0
    assert summary["own_cluster_peers"] == pytest.approx(4 / 5)  # 5 pairs of nodes of a cluster, 1 across
    assert column(tmp_path / "results.md", "own-cluster peers %") == {"one-way": "80"}  # as tabulate writes 80.0


def test_methods_that_choose_no_peers_have_no_share_of_peers_in_own_cluster(tmp_path: Path) -> None:
    assignment = {"n00": 0, "n01": 0, "n02": 1, "n03": 2}
    clustered = run_folder(tmp_path, "clustered", {
        **{n: [final(0.9)] for n in NODES}, "coordinator": [("final", {"assignment": assignment})]})
    plain = run_folder(tmp_path, "plain", {n: [final(0.9)] for n in NODES})
    assert summarize_method(clustered, PARTITION)["own_cluster_peers"] is None
    assert summarize_method(plain, PARTITION)["own_cluster_peers"] is None
    write_report(tmp_path)
    assert column(tmp_path / "results.md", "own-cluster peers %") == {"clustered": "–", "plain": "–"}


def column(results: Path, header: str) -> dict[str, str]:
    """One column of a results.md table, by method."""
    head, _, *rows = ([cell.strip() for cell in line.strip("|").split("|")]
                      for line in results.read_text().splitlines() if line.startswith("|"))
    return {row[0]: row[head.index(header)] for row in rows}


def test_the_device_each_method_trained_on_is_reported_and_runs_that_did_not_record_it_stay_as_they_were(
        tmp_path: Path) -> None:
    for method, device in [("a", "cpu"), ("b", "cuda:0 (NVIDIA H100 80GB HBM3)"), ("old", None)]:
        folder = run_folder(tmp_path, method, {n: [final(0.9)] for n in NODES})
        if device:
            (folder / "run.json").write_text(json.dumps({"seconds": 1.0, "device": device}))
    summary = write_report(tmp_path)["methods"]
    assert summary["a"]["device"] == "cpu" and "device" not in summary["old"]
    line = "Trained on: a: cpu; b: cuda:0 (NVIDIA H100 80GB HBM3)."
    assert (tmp_path / "results.md").read_text().endswith(line + "\n") and report_run(tmp_path).endswith(line)
    (tmp_path / "b" / "run.json").write_text(json.dumps({"device": "cpu"}))
    assert report_run(tmp_path).endswith("\nTrained on: cpu.")
    for m in ("a", "b"):
        (tmp_path / m / "run.json").unlink()
    assert "Trained on" not in report_run(tmp_path)
