"""Text for next-token prediction: word lists read in their own encoding, words encoded as character
sequences with their next characters, the next-token task scoring real positions only, and text datasets
that refuse a model that cannot read them."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from p2pfed.config import ConfigError
from p2pfed.learn.datasets import DatasetUnavailable, load_dataset
from p2pfed.learn.models import build_model
from p2pfed.learn.tasks import NEXT_TOKEN, PAD, TASKS
from p2pfed.learn.text import BOS, EOS, decode, is_word_list, load_words, read_text, sequences_of, words_of
from p2pfed.learn.train import evaluate
from p2pfed.scenario.config import load_scenario


def test_a_word_list_is_read_as_utf8_when_it_is_and_as_iso_8859_1_otherwise(tmp_path: Path) -> None:
    (tmp_path / "latin1").write_bytes("blåbærsyltetøy\nsmørbrød\n".encode("iso-8859-1"))
    (tmp_path / "utf8").write_bytes("blåbærsyltetøy\nsmørbrød\n".encode())
    assert read_text(tmp_path / "latin1") == read_text(tmp_path / "utf8") == "blåbærsyltetøy\nsmørbrød\n"


def test_words_are_lowercased_distinct_and_short_enough() -> None:
    assert words_of("Hus hus\nHUSET båt\nkjempelangtord\x07 x", 6) == ["hus", "huset", "båt", "x"]


def test_a_word_is_its_characters_after_a_start_token_and_their_next_ones_then_the_end(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("ab ba abba bab\n")
    (tmp_path / "b.txt").write_text("øy ø yø øøy\n")
    files = {"a": tmp_path / "a.txt", "b": tmp_path / "b.txt"}
    words = load_words(files, per_group=10, max_len=4, seed=0)
    assert words.vocabulary == BOS + EOS + "abyø" and words.group_names == ["a", "b"]
    assert words.groups.tolist() == [0] * 4 + [1] * 4 and words.x.shape == words.y.shape == (8, 5)
    v = {c: i for i, c in enumerate(words.vocabulary)}
    assert words.x[0].tolist() == [v[BOS], v["a"], v["b"], v[EOS], v[EOS]]
    assert words.y[0].tolist() == [v["a"], v["b"], v[EOS], PAD, PAD]
    assert [decode(x, words.vocabulary) for x in words.x] == ["ab", "ba", "abba", "bab", "øy", "ø", "yø", "øøy"]
    # the draw is numpy's seeded generator: these words on every machine (pinned, not compared with itself)
    drawn = load_words(files, per_group=2, max_len=4, seed=0)
    assert [decode(x, drawn.vocabulary) for x in drawn.x] == ["abba", "bab", "ø", "øøy"]
    with pytest.raises(ValueError, match="3 usable words"):
        (tmp_path / "c.txt").write_text("a b c\n")
        load_words({"c": tmp_path / "c.txt"}, per_group=2, max_len=4, seed=0)


def test_running_text_becomes_sequences_of_consecutive_words_in_its_order() -> None:
    text = "The cat sat\non the MAT and kjempelangtord then it ran"
    assert not is_word_list(text)
    assert sequences_of(text, 2, 6, seed=0) == ["the cat", "sat on", "the mat", "and then", "it ran"]
    assert sequences_of(text, 4, 6, seed=0) == ["the cat sat on", "the mat and then"]  # the short tail left out
    assert sequences_of(text, 1, 6, seed=0) == words_of(text, 6)  # one word a sample: the distinct words
    # a sequence that comes again is one sample (it could otherwise be trained on and tested on)
    assert sequences_of("to be or not to be or not", 2, 6, seed=0) == ["to be", "or not"]
    assert not is_word_list("a line of prose\nand another\nword") and is_word_list("\n".join(["one two"] + ["w"] * 9))


def test_a_word_lists_words_are_drawn_into_sequences_at_random_not_as_alphabetical_neighbours() -> None:
    listed = "\n".join(f"ord{a}{b}" for a in "abcdefgh" for b in "abcdefgh")  # 64 words, sorted
    assert is_word_list(listed)
    sequences = sequences_of(listed, 4, 6, seed=0)
    assert len(sequences) == 16 and sorted(w for s in sequences for w in s.split()) == listed.split()
    assert sequences != sequences_of(listed, 4, 6, seed=1) and sequences == sequences_of(listed, 4, 6, seed=0)
    assert sum(s.split()[0][:4] == s.split()[1][:4] for s in sequences) < 8  # not neighbours sharing a prefix


def test_a_sequence_sample_is_its_words_and_spaces_after_a_start_token(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("ab ba abba bab ab ab b a\n")
    words = load_words({"a": tmp_path / "a.txt"}, per_group=10, max_len=4, seed=0, words_per_sample=2)
    assert words.vocabulary == BOS + EOS + " ab" and words.x.shape == (4, 2 * 5)  # 2 words, 1 space, the end
    assert [decode(x, words.vocabulary) for x in words.x] == ["ab ba", "abba bab", "ab ab", "b a"]
    v = {c: i for i, c in enumerate(words.vocabulary)}
    assert words.y[0].tolist() == [v["a"], v["b"], v[" "], v["b"], v["a"], v[EOS], PAD, PAD, PAD, PAD]
    (tmp_path / "b.txt").write_text("ab ba abba bab ab ab\n")
    with pytest.raises(ValueError, match="3 usable sequences of 2 words"):
        load_words({"b": tmp_path / "b.txt"}, per_group=10, max_len=4, seed=0, words_per_sample=2)


def test_words_per_sample_is_for_text_and_bounded(tmp_path: Path) -> None:
    path = text_scenario(tmp_path)
    assert load_scenario(path, ["data.words_per_sample=4"]).data.words_per_sample == 4
    with pytest.raises(ConfigError, match=r"data\.words_per_sample must be in \[1, 16\]"):
        load_scenario(path, ["data.words_per_sample=0"])
    with pytest.raises(ConfigError, match=r"data\.words_per_sample is for text"):
        load_scenario(path, ["data.words_per_sample=2", "data.dataset='digits'", "train.model='cnn'"])


@pytest.mark.skipif(not Path("/usr/share/dict/bokmaal").exists(), reason="the word lists are not installed "
                    "(tests/run.sh installs them)")
def test_the_scandinavian_word_lists_keep_the_letters_that_tell_them_apart() -> None:
    data = load_dataset("scandinavian")
    assert (len(data.y_train), len(data.y_test)) == (18000, 6000) and data.task is NEXT_TOKEN
    letters = {}
    for g, name in enumerate(["bokmaal", "nynorsk", "swedish", "danish"]):
        mine = data.x_train[torch.from_numpy(data.groups_train == g)]
        letters[name] = {c for x in mine[:3000] for c in decode(x, data.vocabulary)}
    assert {"æ", "ø", "å"} <= letters["bokmaal"] & letters["nynorsk"] & letters["danish"]
    assert {"ä", "ö", "å"} <= letters["swedish"] and not {"æ", "ø"} & letters["swedish"]


def test_next_token_loss_and_metrics_leave_the_padding_out() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([[1, 2, PAD], [3, PAD, PAD]])
    real = logits[[0, 0, 1], [0, 1, 0]]
    assert torch.allclose(NEXT_TOKEN.loss(logits, target), F.cross_entropy(real, torch.tensor([1, 2, 3])))
    assert NEXT_TOKEN.count(target) == 3 and TASKS["next-token"] is NEXT_TOKEN
    predicted = np.array([[1, 0, 4], [3, 4, 4]])  # right at 2 of the 3 real positions; the padding is ignored
    accuracy, _ = NEXT_TOKEN.metrics(predicted, target.numpy())
    assert accuracy == pytest.approx(2 / 3)
    assert all(math.isnan(v) for v in NEXT_TOKEN.metrics(predicted, np.full((2, 3), PAD)))


def test_evaluation_of_a_language_model_is_the_mean_loss_per_token(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("abc abcabc ab cab\n")
    data = load_dataset(f"words:{tmp_path}")
    assert data.task is NEXT_TOKEN and data.input_shape == (17,) and data.groups_train is not None
    model = build_model("char-gru", data.input_shape, data.num_classes, seed=0)
    x, y = torch.cat([data.x_train, data.x_test]), torch.cat([data.y_train, data.y_test])
    ev = evaluate(model, x, y, torch.device("cpu"), task=NEXT_TOKEN)
    with torch.no_grad():
        assert ev.loss == pytest.approx(float(NEXT_TOKEN.loss(model(x), y)), rel=1e-5)
    assert ev.loss == pytest.approx(math.log(data.num_classes), rel=0.1)  # untrained: about uniform


def test_a_missing_word_list_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailable, match="apt-get install wnorwegian wswedish wdanish"):
        load_dataset("scandinavian", root=tmp_path)
    with pytest.raises(DatasetUnavailable, match="is not a folder"):
        load_dataset(f"words:{tmp_path / 'nowhere'}")


@pytest.mark.parametrize(("dataset", "model", "message"), [
    ("scandinavian", "cnn", "train.model 'cnn' cannot read 'scandinavian': text takes a sequence model (char-gru)"),
    ("digits", "char-gru", "train.model 'char-gru' cannot read 'digits': char-gru takes text"),
])
def test_a_model_that_cannot_read_the_dataset_is_refused(tmp_path: Path, dataset: str, model: str,
                                                         message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(f'[scenario]\nmethods = ["local-p2p"]\n[data]\ndataset = "{dataset}"\n[train]\nmodel = "{model}"\n')
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_scenario(path)


def text_scenario(tmp_path: Path, methods: str = '["local-p2p"]', scenario: str = "",
                  partition: str = "clusters = 2") -> Path:
    """A scenario file of 4 nodes on the scandinavian words with the char GRU."""
    path = tmp_path / "s.toml"
    path.write_text(f"[scenario]\nnodes = 4\nrounds = 3\nmethods = {methods}\n{scenario}[data]\n"
                    f'dataset = "scandinavian"\n[data.partition]\n{partition}\n[train]\nmodel = "char-gru"\n')
    return path


def test_a_method_built_on_class_tables_refuses_text_and_the_others_take_it(tmp_path: Path) -> None:
    from p2pfed.methods import load_checked

    path = text_scenario(tmp_path, methods='["fedproto"]')
    with pytest.raises(ConfigError, match=re.escape("scenario.methods: fedproto runs classification only, not the "
                                                    "next-token task of data.dataset 'scandinavian'")):
        load_checked(path)
    for method in ("feddsmic", "fedfm-lite"):
        with pytest.raises(ConfigError, match=f"{method} runs classification only"):
            load_checked(path, [f"scenario.methods=['{method}']"])
    assert load_checked(path, ["scenario.methods=['pfedlia-central', 'fedavg-p2p', 'ifca']",
                               "methods.pfedlia-central.warmup_rounds=1"]).methods


def test_text_takes_no_image_transform_and_no_label_flip(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("data.partition.kind: the feature partition transforms images; "
                                                    "'scandinavian' is text")):
        load_scenario(text_scenario(tmp_path, partition='kind = "feature"\nclusters = 2'))
    flipper = '[[scenario.adversaries]]\nnode = 1\nkind = "label-flip"\n'
    with pytest.raises(ConfigError, match=r"adversaries\[0\].kind: label-flip flips class labels"):
        load_scenario(text_scenario(tmp_path, scenario=flipper))
