"""Peer selection: 2-means on influence scores, and the cases the paper leaves open."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from p2pfed.influence.selection import mutual_clusters, select_peers, two_means
from p2pfed.methods.pfedlia.options import P2POptions


def test_clear_split_chooses_the_helpful_group() -> None:
    scores = {"a": 2.1, "b": 1.9, "c": 2.0, "d": -3.0, "e": -2.8, "f": -3.2, "g": -2.9}
    assert select_peers(scores) == ["a", "b", "c"]


def test_iid_peers_are_all_chosen_when_they_help() -> None:
    rng = np.random.default_rng(0)
    scores = {f"p{i}": float(v) for i, v in enumerate(0.5 + 0.05 * rng.standard_normal(30))}
    assert select_peers(scores) == sorted(scores)


def test_nobody_is_chosen_when_nobody_helps() -> None:
    assert select_peers({"a": -1.0, "b": -1.1, "c": -0.9}) == []
    # a clear split whose upper group still hurts: train alone
    assert select_peers({"a": -0.1, "b": -0.12, "c": -5.0, "d": -5.1}) == []


def test_single_peer_ties_and_empty() -> None:
    assert select_peers({}) == []
    assert select_peers({"a": 0.3}) == ["a"]
    assert select_peers({"a": -0.3}) == []
    assert select_peers({"a": 1.0, "b": 1.0, "c": 1.0}) == ["a", "b", "c"]
    threshold, explained = two_means(np.array([1.0, 1.0, 5.0, 5.0]))
    assert 1.0 < threshold < 5.0 and explained > 0.99


def test_the_papers_rule_is_plain_2_means_and_the_higher_group_whatever_the_scores() -> None:
    hurting = {"a": -0.1, "b": -0.12, "c": -5.0, "d": -5.1}
    assert select_peers(hurting, rule="paper") == ["a", "b"]  # ours trains alone: every peer hurts
    spread = {f"p{i}": float(v) for i, v in enumerate(np.linspace(0.1, 1.0, 10))}
    assert select_peers(spread, rule="paper") == [f"p{i}" for i in range(5, 10)]  # ours: no clear split, all 10
    assert select_peers({"a": -0.3}, rule="paper") == ["a"]  # one group: the higher one
    assert select_peers({"a": -1.0, "b": -1.0}, rule="paper") == ["a", "b"]
    assert select_peers({}, rule="paper") == []
    # the gap is ours alone: the paper's rule splits however little the split explains
    assert select_peers(spread, gap=1.0, rule="paper") == select_peers(spread, rule="paper")
    with pytest.raises(ValueError, match="selection rule must be one of ours, paper"):
        select_peers(spread, rule="mine")


def test_mutual_clusters_are_connected_groups_of_mutual_choices() -> None:
    choices = {"a": ["b"], "b": ["a", "c"], "c": ["b"], "x": ["y"], "y": ["x"], "e": []}
    found = mutual_clusters(choices)
    assert found["a"] == found["b"] == found["c"] != found["x"] == found["y"]
    assert found["e"] not in (found["a"], found["x"])
    # a late joiner whom nobody chose back joins the group of the peers it chose
    found = mutual_clusters({**choices, "late": ["a", "b", "x"]})
    assert found["late"] == found["a"]


def test_the_split_is_the_exact_2_means_split_not_the_mean() -> None:
    # realistic scores of 10 peers: 6 helpful ones spread out, 4 around zero. 2-means puts 0.2 with the helpful
    # (threshold 0.09, explaining 82 % of the variance); a cut at the mean (0.206) would drop it.
    values = [0.25, 0.43, 0.49, 0.48, 0.2, 0.59, -0.21, -0.08, -0.02, -0.07]
    scores = {f"p{i}": v for i, v in enumerate(values)}
    threshold, explained = two_means(np.array(values))
    assert threshold == pytest.approx(0.09) and explained == pytest.approx(0.8190587, rel=1e-6)
    assert select_peers(scores) == ["p0", "p1", "p2", "p3", "p4", "p5"]


def test_evenly_spread_scores_have_no_clear_split_so_every_helpful_peer_is_chosen() -> None:
    values = np.linspace(0.1, 1.0, 10)  # 2-means explains 0.758 of their variance: below the 0.8 gap
    assert two_means(values)[1] == pytest.approx(0.7575758, rel=1e-6)
    scores = {f"p{i}": float(v) for i, v in enumerate(values)}
    assert select_peers(scores) == sorted(scores)
    assert len(select_peers(scores, gap=0.75)) == 5  # a looser gap would split them in half
    assert P2POptions().gap == 0.8  # the scenario's default is the same rule


def brute_force_2_means(values: list[float]) -> tuple[list[float], float]:
    """Every split of the sorted distinct values tried: (the thresholds of the best splits, their explained
    share). Several splits can tie (e.g. -0.18 and 4.57 for the example below): any of them is a best one."""
    s = sorted(values)
    total = sum((v - sum(s) / len(s)) ** 2 for v in s)
    splits = []
    for k in range(1, len(s)):
        if s[k] == s[k - 1]:
            continue
        left, right = s[:k], s[k:]
        sse = sum((v - sum(left) / len(left)) ** 2 for v in left) + sum((v - sum(right) / len(right)) ** 2
                                                                          for v in right)
        splits.append((sse, (s[k - 1] + s[k]) / 2))
    best = min(sse for sse, _ in splits)
    return [t for sse, t in splits if sse <= best + 1e-9 * max(1.0, total)], 1 - best / total


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1000, 1000), min_size=2, max_size=12))
@example(ints=[-999, -1000])  # far from zero, close together: the explained share came out over 1
@example(ints=[12, -48, 71, 97, -209, 213, -277, -375, -408, 701])  # two best splits: -0.18 and 4.57
def test_two_means_finds_the_best_split_of_any_scores(ints: list[int]) -> None:
    values = [i / 100 for i in ints]
    if len(set(values)) < 2:
        assert two_means(np.array(values)) == (float("-inf"), 0.0)
        return
    threshold, explained = two_means(np.array(values))
    best_thresholds, want_explained = brute_force_2_means(values)
    assert any(threshold == pytest.approx(t) for t in best_thresholds), (threshold, best_thresholds)
    assert explained == pytest.approx(want_explained, abs=1e-9)
    chosen = select_peers({f"p{i}": v for i, v in enumerate(values)})
    if explained >= 0.8:
        assert chosen == sorted(f"p{i}" for i, v in enumerate(values) if v > threshold and v > 0)
    else:
        assert chosen == sorted(f"p{i}" for i, v in enumerate(values) if v > 0)


def test_scores_equal_up_to_rounding_are_one_group() -> None:
    # Two peers whose influence differs only in the 12th decimal help equally: both are chosen, the split
    # does not cut between them (it would keep only the one a rounding error put higher).
    assert two_means(np.array([0.3, 0.3 + 1e-12])) == (float("-inf"), 0.0)
    assert select_peers({"a": 0.3, "b": 0.3 + 1e-12}) == ["a", "b"]


@pytest.mark.parametrize("n", [2, 5, 9])
def test_equal_scores_are_never_split_whatever_their_size(n: int) -> None:
    # A diverged partial model gives a huge loss; equal huge scores are still one group. At this size the
    # mean of five equal values is not exact (their spread comes out > 0), so only the rule "a split falls
    # between distinct values" keeps them together.
    assert two_means(np.full(n, 1.2345678901234567e20)) == (float("-inf"), 0.0)
    assert two_means(np.full(n, -1.2345678901234567e20)) == (float("-inf"), 0.0)
    assert select_peers({f"p{i}": 1.2345678901234567e20 for i in range(n)}) == [f"p{i}" for i in range(n)]


def test_a_peer_exactly_between_two_equally_good_splits_is_chosen() -> None:
    # 6 is as far from the 1s as from the 11s: both splits leave the same squared error (18.75). The first
    # (lowest) split wins, so the middle peer, whose influence is clearly positive, is chosen.
    scores = {"a": 1.0, "b": 1.0, "c": 1.0, "mid": 6.0, "x": 11.0, "y": 11.0, "z": 11.0}
    assert two_means(np.array(list(scores.values()))) == (3.5, pytest.approx(0.875))
    assert select_peers(scores) == ["mid", "x", "y", "z"]


def test_a_one_sided_choice_never_merges_two_groups() -> None:
    # m and n chose each other; m also chose a and b, who chose only each other. m stays with n: a cluster is
    # made of mutual choices, and only a node nobody chose back (a late joiner) follows its own choices.
    found = mutual_clusters({"a": ["b"], "b": ["a"], "m": ["n", "a", "b"], "n": ["m"]})
    assert found["a"] == found["b"] != found["m"] == found["n"]


def test_a_split_that_explains_exactly_gap_of_the_variance_is_taken() -> None:
    # "at least gap" (the module's rule): the boundary itself counts as a clear split
    scores = {"a": 2.1, "b": 1.9, "c": 2.0, "d": 0.5, "e": 0.7}
    explained = two_means(np.array(list(scores.values())))[1]
    assert select_peers(scores, gap=explained) == ["a", "b", "c"]
    assert select_peers(scores, gap=np.nextafter(explained, 1.0)) == ["a", "b", "c", "d", "e"]
