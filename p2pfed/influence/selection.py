"""Peer selection from lazy influence scores (Rokvic et al. 2025, §III-F): peer to peer, each node splits its
score vector into two groups with 2-means and aggregates with the higher group.

Two rules, ``[methods.pfedlia-p2p] selection``:
- ``"paper"``: plain 2-means, the higher group, whatever the scores are (every peer when they cannot be
  split: one peer, or all scores equal).
- ``"ours"`` (the default) adds two rules where the paper is silent, about IID peers and about peers that
  raise a node's loss:
  - Structure test: 2-means always splits, even when all peers are alike (IID data). We accept the split
    only if it explains at least ``gap`` (default 0.8) of the scores' variance: a clearly bimodal vector
    explains > 0.9, evenly spread scores 0.75. Without a clear split, every peer with positive influence
    is chosen (IID: all peers help, so all are chosen; if none helps, the node trains alone).
  - Only peers with positive influence are ever chosen: a negative score means the peer's data raises my
    validation loss, whatever group it falls in. So a single peer is chosen iff its influence is positive.
    pFedLIA-p2p asks more (its ``confidence``): positive beyond the score's uncertainty over the node's
    validation samples (the lower bound of a one-sided paired t-test, influence/evidence.py), so a node
    with a tiny validation split chooses fewer, surer peers.

Both solve 2-means in one dimension exactly (the best split of the sorted scores), not by random restarts,
so every node of a scenario gets the same answer on every run; ties (equal scores) always land in the same
group, since a split only falls between distinct values. No peers, no choice.
"""

from __future__ import annotations

import numpy as np


def two_means(scores: np.ndarray) -> tuple[float, float]:
    """Exact 1-D 2-means: return (threshold, explained variance share) of the best split."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    n = len(s)
    total = float(np.sum((s - s.mean()) ** 2))
    if n < 2 or total <= 1e-12 * max(1.0, float(np.abs(s).max())):
        return float("-inf"), 0.0
    # Prefix sums of the centred scores: sum-of-squares minus squared-sum cancels badly for scores far from
    # zero and close together (e.g. -9.99 and -10.0 gave an explained share of 1.0000000011).
    c = s - s.mean()
    prefix = np.cumsum(c)
    prefix_sq = np.cumsum(c * c)
    best_sse, best_k = np.inf, 0
    for k in range(1, n):  # left = s[:k], right = s[k:]
        if s[k] == s[k - 1]:
            continue  # never split equal scores
        left = max(0.0, prefix_sq[k - 1] - prefix[k - 1] ** 2 / k)
        right = max(0.0, (prefix_sq[-1] - prefix_sq[k - 1]) - (prefix[-1] - prefix[k - 1]) ** 2 / (n - k))
        if left + right < best_sse:
            best_sse, best_k = left + right, k
    if best_k == 0:
        return float("-inf"), 0.0
    return float((s[best_k - 1] + s[best_k]) / 2), 1.0 - best_sse / total


SELECTION_RULES = ("ours", "paper")


def select_peers(scores: dict[str, float], gap: float = 0.8, rule: str = "ours",
                 lower: dict[str, float] | None = None) -> list[str]:
    """The peers this node aggregates with, from its lazy influence scores of them.

    rule "paper": the higher group of the 2-means split, negative scores included; every peer when the
    scores cannot be split (one peer, or all equal: one group, which is then the higher one).
    rule "ours": the split only if it explains at least gap of the variance, and only positive scores; given
    lower (each score's lower confidence bound, influence/evidence.py), only scores positive beyond their
    uncertainty.
    """
    if rule not in SELECTION_RULES:
        raise ValueError(f"selection rule must be one of {', '.join(SELECTION_RULES)} (got {rule!r})")
    names = sorted(scores)
    if not names:
        return []
    values = np.array([scores[n] for n in names])
    threshold, explained = two_means(values)
    if rule == "paper":
        return [n for n, v in zip(names, values, strict=True) if v > threshold]
    if len(names) >= 2 and explained >= gap:
        chosen = [n for n, v in zip(names, values, strict=True) if v > threshold]
    else:
        chosen = names
    floor = lower if lower is not None else scores
    return [n for n in chosen if floor[n] > 0]


def mutual_clusters(choices: dict[str, list[str]]) -> dict[str, int]:
    """Discovered clusters: connected groups of mutual choices (i chose j and j chose i)."""
    names = sorted(choices)
    parent = {n: n for n in names}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a in names:
        for b in choices[a]:
            if b in choices and a in choices[b]:
                parent[find(a)] = find(b)
    # A node no one chose back (a late joiner none of its peers has chosen yet) belongs to the group
    # most of its chosen peers belong to.
    sizes: dict[str, int] = {}
    for n in names:
        sizes[find(n)] = sizes.get(find(n), 0) + 1
    for a in names:
        if sizes[find(a)] == 1 and choices[a]:
            votes = [find(b) for b in choices[a] if b in parent]
            if votes:
                parent[find(a)] = max(sorted(set(votes)), key=votes.count)
    roots = sorted({find(n) for n in names})
    return {n: roots.index(find(n)) for n in names}
