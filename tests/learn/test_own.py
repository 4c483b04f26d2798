"""A node's own data: read in each format, split on the node (seeded, disjoint), standardised with its own
training samples, and stopped with one line naming the file and what does not fit the recipe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from p2pfed.learn.own import OwnDataError, Split, expected_shape, load_own_data
from p2pfed.scenario.config import Scenario


def digits_npz(path: Path, labels: list[int], n: int = 200) -> Path:
    digits = load_digits()
    keep = np.flatnonzero(np.isin(digits.target, labels))[:n]
    np.savez(path, x=digits.images[keep], y=digits.target[keep])
    return path


def test_own_data_is_split_on_the_node_disjointly_and_the_same_way_each_time(tmp_path: Path) -> None:
    path = digits_npz(tmp_path / "mine.npz", [0, 1, 2])
    dataset, train, val, test = load_own_data(path, (1, 8, 8), 10, Split(0.2, 0.25), seed=3)
    n = len(train) + len(val) + len(test)
    assert n == 200 and len(test) == 50 and len(val) == 40 and len(train) == 110
    assert dataset.input_shape == (1, 8, 8) and dataset.num_classes == 10  # the recipe's classes, not its own 3
    assert len(dataset.y_train) == len(train) + len(val) and len(dataset.y_test) == len(test)
    assert set(dataset.y_train.tolist()) | set(dataset.y_test.tolist()) == {0, 1, 2}
    # standardised with the training samples' statistics only (validation and test are held out)
    assert float(dataset.x_train[train].mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(dataset.x_train[train].std()) == pytest.approx(1.0, abs=1e-2)
    raw = dataset.x_train * dataset.input_std + dataset.input_mean  # type: ignore[operator]
    assert float(raw.min()) >= -1e-4 and float(raw.max()) <= 16 + 1e-4  # the card's units are the file's
    again, *_ = load_own_data(path, (1, 8, 8), 10, Split(0.2, 0.25), seed=3)
    other, *_ = load_own_data(path, (1, 8, 8), 10, Split(0.2, 0.25), seed=4)
    assert torch.equal(again.x_test, dataset.x_test) and not torch.equal(other.x_test, dataset.x_test)
    # every sample is in exactly one split
    back = torch.cat([raw, again.x_test * again.input_std + again.input_mean]).round()  # type: ignore[operator]
    rows = {tuple(r.flatten().tolist()) for r in back}
    assert len(rows) == len(np.unique(load_digits().images[np.isin(load_digits().target, [0, 1, 2])][:200]
                                      .reshape(200, -1), axis=0))


def test_csv_and_image_folders_are_own_data_too(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(30, 4)).round(3)
    labels = rng.integers(0, 3, 30)
    lines = ["a,b,label,c"] + [f"{f[0]},{f[1]},{y},{f[2]}" for f, y in zip(features, labels, strict=True)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    dataset, train, val, test = load_own_data(tmp_path / "t.csv", (3,), 3, Split(), seed=0)
    assert dataset.input_shape == (3,) and len(train) + len(val) + len(test) == 30 and dataset.pixel_max == 0.0
    from PIL import Image

    for cls in ("cat", "dog"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (5, 5, 3), dtype=np.uint8)).save(tmp_path / "imgs" / cls / f"{i}.png")
    # class numbers come from the recipe's names, not from which folders this machine happens to have
    dataset, *_ = load_own_data(tmp_path / "imgs", (3, 5, 5), 3, Split(), seed=0, class_names=["bird", "cat", "dog"])
    assert dataset.input_shape == (3, 5, 5) and dataset.pixel_max == 1.0
    assert sorted(set(dataset.y_train.tolist()) | set(dataset.y_test.tolist())) == [1, 2]
    with pytest.raises(OwnDataError, match="class folder 'cat' is neither a class number nor one of the recipe's"):
        load_own_data(tmp_path / "imgs", (3, 5, 5), 3, Split(), seed=0)
    # grey images for a grey recipe, in folders named by class number (a machine holding digits 3 and 7)
    digits = load_digits()
    for label in (3, 7):
        (tmp_path / "grey" / str(label)).mkdir(parents=True)
        for i in np.flatnonzero(digits.target == label)[:6]:
            grey = (digits.images[i] * 255 / 16).astype(np.uint8)
            Image.fromarray(grey).save(tmp_path / "grey" / str(label) / f"{i}.png")
    dataset, *_ = load_own_data(tmp_path / "grey", (1, 8, 8), 10, Split(), seed=0)
    assert dataset.input_shape == (1, 8, 8)
    assert sorted(set(dataset.y_train.tolist()) | set(dataset.y_test.tolist())) == [3, 7]
    Image.fromarray(np.zeros((9, 9), dtype=np.uint8)).save(tmp_path / "grey" / "3" / "odd.png")
    with pytest.raises(OwnDataError, match=r"images of different sizes \(8x8, 9x9\)"):
        load_own_data(tmp_path / "grey", (1, 8, 8), 10, Split(), seed=0)


@pytest.mark.parametrize(("make", "problem"), [
    (lambda p: np.savez(p, x=np.zeros((20, 28, 28)), y=np.zeros(20, dtype=int)),
     r"samples of shape \(1, 28, 28\), but the recipe's model takes \(1, 8, 8\)"),
    (lambda p: np.savez(p, x=np.zeros((20, 8, 8)), y=np.arange(20)),
     r"labels run from 0 to 19, but the recipe has 10 classes \(0 to 9, data.classes\)"),
    (lambda p: np.savez(p, x=np.zeros((5, 8, 8)), y=np.zeros(5, dtype=int)), "5 samples; a node needs at least 10"),
    (lambda p: np.savez(p, x=np.full((20, 8, 8), np.nan), y=np.zeros(20, dtype=int)), "NaN or infinite"),
    (lambda p: np.savez(p, x=np.zeros((20, 8, 8)), y=np.zeros(20)), "one integer per sample, not float64"),
    (lambda p: np.savez(p, x=np.zeros((20, 8, 8)), y=np.zeros((20, 2), dtype=int)), r"of shape \(20, 2\)"),
    (lambda p: np.savez(p, x=np.zeros((10, 8, 8)), y=np.zeros(10, dtype=int)), None),
    (lambda p: np.savez(p, images=np.zeros(3)), r"needs arrays 'x' \(samples\) and 'y' \(labels\); it has images"),
    (lambda p: np.savez(p, x=np.zeros((20, 8, 8)), y=np.zeros(19, dtype=int)), "20 samples but 19 labels"),
    (lambda p: p.write_bytes(b"not a zip"), "not a readable .npz"),
])
def test_data_that_does_not_fit_the_recipe_stops_the_node_with_one_line(tmp_path: Path, make, problem: str | None
                                                                         ) -> None:
    path = tmp_path / "mine.npz"
    make(path)
    split = Split(0.49, 0.49) if problem is None else Split()
    problem = problem or r"10 samples leave none to train on after 5 for validation and 5 for testing"
    with pytest.raises(OwnDataError, match=problem) as caught:
        load_own_data(path, (1, 8, 8), 10, split, seed=0)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def digits_csv(path: Path, columns: int = 64, n: int = 60) -> Path:
    """Digits as a CSV, one row a sample: its first columns pixels (row by row) and a label."""
    digits = load_digits()
    pixels = digits.images[:n].reshape(n, 64)[:, :columns]
    lines = [",".join([*(f"p{i}" for i in range(columns)), "label"])]
    lines += [",".join([*(str(int(v)) for v in row), str(int(y))]) for row, y in zip(pixels, digits.target[:n],
                                                                                       strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_csv_of_pixel_columns_is_images_of_the_recipes_shape(tmp_path: Path) -> None:
    dataset, train, val, test = load_own_data(digits_csv(tmp_path / "digits.csv"), (1, 8, 8), 10, Split(), seed=0)
    assert dataset.input_shape == (1, 8, 8) and len(train) + len(val) + len(test) == 60
    # each row is read as C, H, W in order (row by row): the images come back as they were, pixel for pixel
    raw = torch.cat([dataset.x_train, dataset.x_test]) * dataset.input_std + dataset.input_mean  # type: ignore[operator]
    ours = {tuple(r.round().flatten().int().tolist()) for r in raw}
    assert ours == {tuple(img.flatten().astype(int).tolist()) for img in load_digits().images[:60]}
    assert dataset.input_std is not None and dataset.input_std.shape == (1, 1, 1)  # per channel, as images are
    with pytest.raises(OwnDataError) as caught:  # sizes that do not agree are still refused, saying why
        load_own_data(digits_csv(tmp_path / "short.csv", columns=60), (1, 8, 8), 10, Split(), seed=0)
    assert str(caught.value) == (f"{tmp_path / 'short.csv'}: rows of 60 feature columns, but the recipe's model "
                                 "takes samples of shape (1, 8, 8), 64 values a row (C, H, W in order) "
                                 "(data.input_shape, or that of the recipe's data.dataset)")


def test_other_mistakes_are_named(tmp_path: Path) -> None:
    with pytest.raises(OwnDataError, match="no such file"):
        load_own_data(tmp_path / "none.npz", (1, 8, 8), 10, Split(), seed=0)
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(OwnDataError, match=r"must be an \.npz"):
        load_own_data(tmp_path / "t.txt", (1, 8, 8), 10, Split(), seed=0)
    (tmp_path / "t.csv").write_text("a,label\n1,x\n")
    with pytest.raises(OwnDataError, match="every value must be a number"):
        load_own_data(tmp_path / "t.csv", (1,), 2, Split(), seed=0)
    with pytest.raises(OwnDataError, match="fractions must each be in"):
        load_own_data(tmp_path / "t.csv", (1,), 2, Split(0.5, 0.5), seed=0)
    with pytest.raises(OwnDataError, match=r"set data\.input_shape"):
        expected_shape("my-hospital", [], 0)
    assert expected_shape("fmnist", [], 0) == ((1, 28, 28), 10)
    assert expected_shape("my-hospital", [12], 2) == ((12,), 2)


def test_the_recipe_fingerprint_covers_what_members_must_share_and_nothing_of_one_machine() -> None:
    s = Scenario()
    base = s.fingerprint("pfedlia-p2p", (1, 8, 8), 10, "classification")
    assert len(base) == 16 and base == Scenario().fingerprint("pfedlia-p2p", [1, 8, 8], 10, "classification")
    changed = [Scenario(seed=1), Scenario(rounds=5)]
    s_lr = Scenario()
    s_lr.train.lr = 0.5
    s_opt = Scenario(method_tables={"pfedlia-p2p": {"warmup_rounds": 3}})
    for other in [*changed, s_lr, s_opt]:
        assert other.fingerprint("pfedlia-p2p", (1, 8, 8), 10, "classification") != base
    assert s.fingerprint("pfedlia-p2p-paper", (1, 8, 8), 10, "classification") != base
    assert s.fingerprint("pfedlia-p2p", (1, 8, 8), 47, "classification") != base
    # the paper variant takes its base method's table: a change there changes it too
    assert s_opt.fingerprint("pfedlia-p2p-paper", (1, 8, 8), 10, "classification") != \
        s.fingerprint("pfedlia-p2p-paper", (1, 8, 8), 10, "classification")
    same = Scenario(nodes=3, method_tables={"fedavg": {"x": 1}})
    same.train.device, same.train.round_timeout, same.data.dataset = "cuda", 5.0, "fmnist"
    assert same.fingerprint("pfedlia-p2p", (1, 8, 8), 10, "classification") == base


def test_a_model_that_cannot_take_the_data_stops_the_node_before_it_joins(tmp_path: Path) -> None:
    from p2pfed.launch.member import check_model_takes

    rows = np.random.default_rng(0).normal(size=(30, 13))
    lines = ["a,b,c,d,e,f,g,h,i,j,k,l,label"] + [",".join(f"{v:.3f}" for v in r[:12]) + f",{int(r[12] > 0)}"
                                                   for r in rows]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    dataset, *_ = load_own_data(tmp_path / "t.csv", (12,), 2, Split(), seed=0)
    with pytest.raises(OwnDataError, match=r"the recipe's model 'cnn' cannot take samples of shape \(12,\).*"
                                           r"for feature rows use model = \"logreg\""):
        check_model_takes("cnn", dataset, tmp_path / "t.csv")
    check_model_takes("logreg", dataset, tmp_path / "t.csv")


def test_own_words_are_samples_for_next_token_prediction_in_the_recipes_vocabulary(tmp_path: Path) -> None:
    from p2pfed.learn.own import load_own_text
    from p2pfed.learn.text import decode, vocabulary_of

    vocabulary = vocabulary_of("abcdefghijklmnopqrstuvwxyzæøå")
    words = [f"{a}{b}{c}ø" for a in "abcdef" for b in "ghij" for c in "klm"]  # 72 distinct words
    (tmp_path / "mine.txt").write_text("\n".join([*words, "ærlig", "straße"]) + "\n")
    dataset, train, val, test = load_own_text(tmp_path / "mine.txt", vocabulary, Split(), seed=0)
    assert len(train) + len(val) + len(test) == 73  # straße is spelt with a letter the recipe lacks: left out
    assert dataset.input_shape == (17,) and dataset.num_classes == len(vocabulary) and dataset.task.name == "next-token"
    seen = {decode(x, vocabulary) for x in torch.cat([dataset.x_train, dataset.x_test])}
    assert seen == {*words, "ærlig"}
    (tmp_path / "other.txt").write_text("\n".join(f"ω{w}" for w in words) + "\n")
    with pytest.raises(OwnDataError, match=r"0 of 72 words .* letters it lacks: 'ω'"):
        load_own_text(tmp_path / "other.txt", vocabulary, Split(), seed=0)
    # sequences of 3 words (data.words_per_sample): running text keeps its order, a space is a letter too
    (tmp_path / "prose.txt").write_text(" ".join(words) + "\n")
    spaced = vocabulary_of("abcdefghijklmnopqrstuvwxyzæøå ")
    prose, train, val, test = load_own_text(tmp_path / "prose.txt", spaced, Split(), seed=0, words_per_sample=3)
    assert len(train) + len(val) + len(test) == 24 and prose.input_shape == (3 * 17,)
    assert {decode(x, spaced) for x in torch.cat([prose.x_train, prose.x_test])} == \
        {" ".join(words[i:i + 3]) for i in range(0, 72, 3)}
    with pytest.raises(OwnDataError, match=r"0 of 24 sequences of 3 words .* letters it lacks: ' '"):
        load_own_text(tmp_path / "prose.txt", vocabulary, Split(), seed=0, words_per_sample=3)
    # members with the same letters in another order, or other letters, train other recipes
    s = Scenario()
    assert s.fingerprint("fedavg-p2p", (17,), 31, "next-token", vocabulary) != \
        s.fingerprint("fedavg-p2p", (17,), 31, "next-token", vocabulary_of("abcdefghijklmnopqrstuvwxyzäöå"))
