"""Next-token prediction over real sockets: nodes holding words of two made-up languages (a text made by the
test) find the nodes of their own language by lazy influence, and the report gives loss and perplexity; with
word sequences, they also tell apart languages whose words are the same and only their order differs (one word
a sample, the same test measured ARI −0.25)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from p2pfed.launch.runner import run_scenario
from p2pfed.methods import load_checked

SCENARIO = """
[scenario]
name = "tiny-text"
nodes = 6
rounds = 5
methods = ["pfedlia-p2p"]
[data]
dataset = "words:{folder}"
[data.partition]
kind = "pathological"
clusters = 2
[train]
model = "char-gru"
epochs = 2
batch_size = 16
lr = 1.0
round_timeout = 30
[methods.pfedlia-p2p]
warmup_rounds = 1
lia_epochs = 5
lia_batch = 200
lia_lr = 1.0
[mesh]
heartbeat = 0.3
"""


def language(letters: str, seed: int, n: int = 600) -> str:
    """n words of 3 to 8 letters, each letter drawn after the one before from a few likely successors."""
    rng = np.random.default_rng(seed)
    after = {c: rng.choice(list(letters), size=2, replace=False) for c in letters}
    words = []
    for _ in range(n):
        w = [str(rng.choice(list(letters)))]
        for _ in range(int(rng.integers(2, 8))):
            w.append(str(rng.choice(after[w[-1]])))
        words.append("".join(w))
    return "\n".join(words)


def test_nodes_of_a_language_find_each_other_and_the_report_gives_perplexity(tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "east.txt").write_text(language("abcdefgh", 0))
    (folder / "west.txt").write_text(language("abcdefgh", 1))  # the same letters, other successors
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(folder=folder))
    out = tmp_path / "run"
    run_scenario(load_checked(path), out)
    summary = json.loads((out / "summary.json").read_text())["methods"]["pfedlia-p2p"]
    assert summary["nodes_finished"] == 6 and not summary["crashed"]
    assert summary["ari"] == 1.0  # the first three nodes write east, the last three west
    assert summary["perplexity"] < 8 and abs(summary["perplexity"] - np.exp(summary["loss"])) < 1e-9
    assert "perplexity" in (out / "results.md").read_text()
    assert (out / "loss.png").stat().st_size > 1000
    assert json.loads((out / "partition.json").read_text())["task"] == "next-token"


def word_order(words: list[str], seed: int, n: int = 6000) -> str:
    """Running text of n words, each word followed by one of two successors of its own: two such texts over
    the same words differ only in which word follows which."""
    rng = np.random.default_rng(seed)
    after = {w: rng.choice(words, size=2, replace=False) for w in words}
    text = [str(rng.choice(words))]
    for _ in range(n - 1):
        text.append(str(rng.choice(after[text[-1]])))
    return " ".join(text)


def test_word_sequences_let_nodes_tell_apart_languages_that_differ_only_in_word_order(tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    folder.mkdir()
    words = ["ba", "da", "ga", "ka", "la", "ma", "na", "pa", "ra", "sa", "ta", "va"]
    (folder / "east.txt").write_text(word_order(words, 0))
    (folder / "west.txt").write_text(word_order(words, 1))  # the same words, other successors
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(folder=folder).replace("[data]\n", "[data]\nwords_per_sample = 6\n"))
    out = tmp_path / "run"
    run_scenario(load_checked(path), out)
    summary = json.loads((out / "summary.json").read_text())["methods"]["pfedlia-p2p"]
    assert summary["nodes_finished"] == 6 and not summary["crashed"]
    assert summary["ari"] == 1.0  # single words could not tell them apart: each text uses every word
