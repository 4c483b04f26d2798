"""A node's personalised model out: exported from a real run's checkpoint, it predicts raw inputs (arrays or
image files) as the node's own model did on its standardised data; p2pfed export / predict say what is wrong."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from sklearn.datasets import load_digits

from p2pfed.cli import main
from p2pfed.launch.runner import run_scenario
from p2pfed.learn.checkpoint import CheckpointError, load_own
from p2pfed.learn.datasets import load_dataset
from p2pfed.learn.export import CARD, ExportedModel, export_model
from p2pfed.learn.models import build_model
from p2pfed.scenario.config import load_scenario

SCENARIO = """
[scenario]
name = "export"
nodes = 2
rounds = 3
methods = ["local"]
[data]
dataset = "digits"
partition.kind = "iid"
class_names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
[train]
model = "cnn"
lr = 0.1
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short run of two nodes training on digits (their checkpoints carry model cards)."""
    tmp = tmp_path_factory.mktemp("export")
    (tmp / "s.toml").write_text(SCENARIO)
    run_scenario(load_scenario(tmp / "s.toml"), tmp / "run")
    return tmp / "run" / "local"


def test_an_exported_model_predicts_raw_inputs_as_the_node_did_on_its_own(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "n01-model.safetensors"
    card = export_model(run / "n01.safetensors", out)
    assert (card.node, card.method, card.round, card.model, card.input_shape) == ("n01", "local", 2, "cnn", (1, 8, 8))
    # the file is a plain state dict another program loads with two calls
    plain = build_model("cnn", (1, 8, 8), 10)
    plain.load_state_dict(load_file(str(out)))
    node_model = build_model("cnn", (1, 8, 8), 10)
    node_model.load_state_dict(load_own(run / "n01.safetensors")["model"])
    dataset = load_dataset("digits")
    with torch.no_grad():
        expected = node_model.eval()(dataset.x_test).argmax(dim=1)
    model = ExportedModel.load(out)
    # raw digits (0-16 pixels, as scikit-learn gives them) in the same test order: the card standardises them
    raw = torch.tensor(load_digits().images, dtype=torch.float32)
    raw_test = dataset.x_test * model.std + model.mean  # type: ignore[operator]
    assert torch.allclose(raw_test.squeeze(1)[:5].round(), raw_test.squeeze(1)[:5], atol=1e-3)  # whole pixels
    assert float(raw_test.min()) >= -1e-3 and float(raw_test.max()) <= 16 + 1e-3
    assert torch.equal(model.predict(raw_test), expected)
    assert float((model.predict(raw) == torch.tensor(load_digits().target)).float().mean()) > 0.8
    assert torch.equal(model.predict(raw[:3]), model.predict(raw[:3].unsqueeze(1)))  # (N, H, W) too


def test_export_and_predict_from_the_command_line(run: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(run), str(tmp_path)]) == 2
    assert "holds checkpoints of n00, n01: pick one with --node NAME" in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path), "--node", "n09"]) == 2
    assert "no checkpoint of n09 (it has: n00, n01)" in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path), "--node", "n00"]) == 0
    model = tmp_path / "n00-model.safetensors"
    assert str(model) in capsys.readouterr().out
    digits = load_digits()
    np.savez(tmp_path / "some.npz", x=digits.images[:50], y=digits.target[:50])
    assert main(["predict", str(model), str(tmp_path / "some.npz"), "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert len(rows) == 50 and {"input", "class", "probability", "label"} <= set(rows[0])
    accuracy = float(captured.err.split()[1].rstrip("%")) / 100
    assert accuracy == pytest.approx(np.mean([r["class"] == r["label"] for r in rows]), abs=1e-3)
    assert accuracy > 0.7
    # image files: 8x8 grey PNGs, pixels 0-255 standing for digits' 0-16
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        Image.fromarray((digits.images[i] * 255 / 16).round().astype(np.uint8)).save(folder / f"d{i}.png")
    assert main(["predict", str(model), str(folder), "--json"]) == 0
    by_image = [r["class"] for r in json.loads(capsys.readouterr().out)]
    assert by_image == [r["class"] for r in rows[:3]]
    Image.fromarray(np.zeros((10, 10), dtype=np.uint8)).save(tmp_path / "big.png")
    assert main(["predict", str(model), str(tmp_path / "big.png")]) == 2
    assert "10x10 pixels; this model takes 8x8" in capsys.readouterr().err
    np.save(tmp_path / "wrong.npy", np.zeros((2, 3, 8, 8)))
    assert main(["predict", str(model), str(tmp_path / "wrong.npy")]) == 2
    assert "inputs of shape (3, 8, 8); this cnn takes (1, 8, 8)" in capsys.readouterr().err


def test_what_cannot_be_exported_or_loaded_is_named(run: Path, tmp_path: Path) -> None:
    coordinator = _coordinatorlike(tmp_path)
    with pytest.raises(CheckpointError, match="not a node's checkpoint with a model card"):
        export_model(coordinator, tmp_path / "x.safetensors")
    with pytest.raises(CheckpointError, match="has no model card"):
        ExportedModel.load(coordinator)
    card = json.loads(load_file_metadata(run / "n00.safetensors")[CARD])
    assert card["node"] == "n00" and len(card["input_std"]) == 1 and card["pixel_max"] == 16.0
    # what predict checks inputs against: the training inputs' range in raw units, and the recipe's class names
    assert card["input_range"] == [0.0, 16.0] and card["class_names"][:3] == ["zero", "one", "two"]


def _coordinatorlike(tmp_path: Path) -> Path:
    from p2pfed.learn.checkpoint import save_atomic

    path = tmp_path / "coordinator.safetensors"
    save_atomic({"round": 1, "models": {"0": {"w": torch.ones(1)}}}, path)
    return path


def load_file_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata())


def test_a_forged_card_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    from dataclasses import asdict

    from p2pfed.learn.checkpoint import save_atomic
    from p2pfed.learn.export import ModelCard

    good = ModelCard("logreg", (12,), 2, "classification", [0.5] * 12, [2.0] * 12)
    for change, problem in [({"num_classes": 10**9}, "has 1000000000 classes"),
                            ({"input_shape": [10**6, 10**6]}, "input shape out of bounds"),
                            ({"model": "rm -rf"}, "unknown model"),
                            ({"input_std": [0.0] * 12}, "std above 0"),
                            ({"input_mean": [1.0] * 5}, "do not fit its input shape")]:
        card = json.dumps({**asdict(good), **change})
        save_atomic({"w": torch.zeros(1)}, tmp_path / "m.safetensors", metadata={CARD: card})
        with pytest.raises(CheckpointError, match=problem):
            ExportedModel.load(tmp_path / "m.safetensors")
    # a model on feature rows standardises each feature (per element, not per channel)
    module = build_model("logreg", (12,), 2)
    save_atomic(dict(module.state_dict()), tmp_path / "ok.safetensors", metadata={CARD: good.to_json()})
    model = ExportedModel.load(tmp_path / "ok.safetensors")
    x = torch.randn(4, 12)
    with torch.no_grad():
        assert torch.equal(model.predict(x), module((x - 0.5) / 2.0).argmax(dim=1))
    np.savez(tmp_path / "few.npz", x=np.zeros((3, 12)), y=np.zeros(2, dtype=int))
    with pytest.raises(ValueError, match="3 inputs but 2 labels"):
        from p2pfed.learn.export import read_inputs

        read_inputs(tmp_path / "few.npz", model.card)


@pytest.fixture
def text_model(tmp_path: Path) -> tuple[Path, torch.nn.Module, str]:
    """A char-gru trained (as a node trains it) on made-up words that all end in "en", exported with its card;
    its vocabulary also holds the letters of the ending "ar", which it never saw end a word."""
    from p2pfed.learn.checkpoint import save_atomic
    from p2pfed.learn.export import ModelCard
    from p2pfed.learn.tasks import NEXT_TOKEN
    from p2pfed.learn.text import encode_words, vocabulary_of
    from p2pfed.learn.train import train_epochs

    words = [f"{a}{b}{c}en" for a in "bdfgk" for b in "aeiou" for c in "lmnrs"]
    vocabulary = vocabulary_of("".join(words) + "ar")
    x, y = encode_words(words, vocabulary, 8)
    module = build_model("char-gru", (9,), len(vocabulary))
    train_epochs(module, x, y, epochs=30, batch_size=16, lr=0.5, seed=0, device=torch.device("cpu"), task=NEXT_TOKEN)
    card = ModelCard("char-gru", (9,), len(vocabulary), "next-token", vocabulary=vocabulary)
    path = tmp_path / "words-model.safetensors"
    save_atomic(dict(module.state_dict()), path, metadata={CARD: card.to_json()})
    return path, module.eval(), vocabulary


def test_a_next_token_model_scores_and_continues_text(text_model: tuple[Path, torch.nn.Module, str]) -> None:
    from p2pfed.learn.tasks import NEXT_TOKEN
    from p2pfed.learn.text import encode_words
    from p2pfed.learn.train import evaluate

    path, module, vocabulary = text_model
    model = ExportedModel.load(path)
    # lowercased, as the node's text; "balen" is a word it ends there; a full width leaves nothing to write
    assert model.complete(["bal", "Kus", "balen", "balenbal"]) == ["en", "en", "", ""]
    alone = {t: model.complete([t])[0] for t in ("bal", "d", "kusen", "")}
    mixed = ["bal", "d", "kusen", ""] * 700  # texts of different lengths, over more than one batch
    assert model.complete(mixed) == [alone[t] for t in mixed]
    (seen, seen_acc, n), (other, other_acc, _) = model.score(["balen", "balar"])
    assert n == 6 and seen < other and seen_acc > other_acc  # five letters and the end
    # the loss per character is the node's own evaluation's: the same encoding, the end token counted
    texts = ["balen", "kumar", "d"]
    scores = model.score(texts)
    x, y = encode_words(texts, vocabulary, 8)
    expected = evaluate(module, x, y, torch.device("cpu"), task=NEXT_TOKEN)
    characters = sum(c for *_, c in scores)
    assert characters == 6 + 6 + 2
    assert sum(s * c for s, _, c in scores) / characters == pytest.approx(expected.loss, rel=1e-5)
    assert sum(a * c for _, a, c in scores) / characters == pytest.approx(expected.accuracy, rel=1e-5)
    with pytest.raises(ValueError, match=r"'xé' not in this model's letters"):
        model.score(["béx"])
    with pytest.raises(ValueError, match="a space: this model was trained on one word a sample"):
        model.score(["bal en"])
    with pytest.raises(ValueError, match=r"text 2 \('balenbalen'\) has 10 characters; this model takes at most 8"):
        model.score(["balen", "balenbalen"])
    with pytest.raises(ValueError, match="this model is for next-token, not classification"):
        model.predict(torch.zeros(1, 9))
    from dataclasses import replace

    from p2pfed.learn.checkpoint import save_atomic

    card = model.card
    for forged, problem in [(replace(card, vocabulary=vocabulary.replace("\x03", "z")), "vocabulary or width"),
                            (replace(card, vocabulary=vocabulary[:-1] + "a"), "vocabulary or width"),  # "a" twice
                            (replace(card, num_classes=len(vocabulary) + 1), "vocabulary or width"),
                            (replace(card, input_shape=(50_000,)), "vocabulary or width"),
                            (replace(card, task="rm -rf"), "unknown task"),
                            (replace(card, task="classification"), "a char-gru for classification"),
                            (replace(card, model="logreg"), "a logreg for next-token"),
                            (replace(card, num_classes=str(card.num_classes)), "wrong kind: num_classes"),  # type: ignore[arg-type]
                            (replace(card, model=5), "wrong kind: model")]:  # type: ignore[arg-type]
        save_atomic(dict(module.state_dict()), path, metadata={CARD: forged.to_json()})
        with pytest.raises(CheckpointError, match=problem):
            ExportedModel.load(path)


def test_predict_on_text_from_the_command_line(text_model: tuple[Path, torch.nn.Module, str], run: Path,
                                               tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(text_model[0])
    assert main(["predict", path, "--text", "bal", "--text", "balen", "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [(r["text"], r["continues as"]) for r in rows] == [("bal", "en"), ("balen", "")]
    assert rows[1]["loss/char"] < rows[0]["loss/char"]  # "bal" ends where no trained word ends
    assert "nats/char (perplexity" in captured.err and "on 10 characters of 2 texts" in captured.err
    (tmp_path / "words.txt").write_text("balen\n\nkumen\nfosar\n")
    assert main(["predict", path, str(tmp_path / "words.txt")]) == 0
    table = capsys.readouterr().out
    assert "continues as" in table and "fosar" in table and "of 3 texts" in table
    for args, message in [([], "give a text file (one word or sequence a line) or --text, one of them"),
                          ([str(tmp_path / "words.txt"), "--text", "bal"], "one of them"),
                          (["--text", "b e"], "a space: this model was trained on one word a sample"),
                          ([str(tmp_path / "none.txt")], "none.txt is not a file: give a text file")]:
        assert main(["predict", path, *args]) == 2
        assert message in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path), "--node", "n00"]) == 0
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "n00-model.safetensors"), "--text", "bal"]) == 2
    assert "classifies inputs of shape (1, 8, 8): give a file of them" in capsys.readouterr().err


# -- what predict takes, and what it refuses or warns about -----------------------------------------------------

def _digits_model(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """A cnn for digits' raw 0-16 pixels (untrained: these tests are about inputs, not answers), exported with a
    card as a node writes it."""
    from p2pfed.learn.checkpoint import save_atomic
    from p2pfed.learn.export import ModelCard

    card = ModelCard.of("cnn", load_dataset("digits"), node="n00")
    module = build_model("cnn", (1, 8, 8), 10, seed=0)
    path = tmp_path / "digits-model.safetensors"
    save_atomic(dict(module.state_dict()), path, metadata={CARD: card.to_json()})
    return path, module.eval()


def _class_folder(root: Path, folders: dict[str, int], each: int = 3) -> Path:
    """An ImageFolder of digits' 8x8 grey PNGs (0-255 standing for 0-16): folder name -> which digit it holds."""
    from PIL import Image

    digits = load_digits()
    for name, label in folders.items():
        (root / name).mkdir(parents=True)
        for i in np.flatnonzero(digits.target == label)[:each]:
            Image.fromarray((digits.images[i] * 255 / 16).round().astype(np.uint8)).save(root / name / f"d{i}.png")
    return root


def test_predict_reads_a_class_folder_a_node_trains_on_its_labels_from_the_cards_class_names(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from p2pfed.learn.export import read_inputs

    assert main(["export", str(run), str(tmp_path), "--node", "n00"]) == 0
    model_path = tmp_path / "n00-model.safetensors"
    model = ExportedModel.load(model_path)
    folder = _class_folder(tmp_path / "named", {"three": 3, "seven": 7})
    x, y, names = read_inputs(folder, model.card)
    assert y is not None and y.tolist() == [7, 7, 7, 3, 3, 3]  # the card's numbers, not the folder's order
    assert names[0].startswith("seven/") and names[-1].startswith("three/")
    assert x.shape == (6, 1, 8, 8) and float(x.max()) == pytest.approx(16.0)  # raw units, as image files are read
    first = int(names[0].removeprefix("seven/d").removesuffix(".png"))  # each input is its file's image
    assert torch.allclose(x[0, 0], torch.tensor(load_digits().images[first], dtype=torch.float32), atol=0.04)
    capsys.readouterr()
    assert main(["predict", str(model_path), str(folder), "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [r["label"] for r in rows] == [7, 7, 7, 3, 3, 3] and "accuracy" in captured.err
    # folders named by class number too; a folder name the card does not know is named
    numbered = read_inputs(_class_folder(tmp_path / "numbered", {"3": 3}), model.card)[1]
    assert numbered is not None and numbered.tolist() == [3, 3, 3]
    with pytest.raises(ValueError, match="class folder 'cat' is neither a class number nor one of"):
        read_inputs(_class_folder(tmp_path / "odd", {"cat": 3}), model.card)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_infinite_inputs_are_refused_saying_how_many_and_where(tmp_path: Path, bad: float,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _digits_model(tmp_path)
    model = ExportedModel.load(path)
    x = torch.tensor(load_digits().images[:5], dtype=torch.float32)
    x[2, 3, 4] = x[4, 0, 0] = x[4, 1, 1] = bad
    with pytest.raises(ValueError) as caught:
        model.predict(x)
    assert str(caught.value) == "3 input values are NaN or infinite, the first in row 2 (rows count from 0)"
    with pytest.raises(ValueError, match=r"^1 input value is NaN or infinite, the first in row 0 "):
        model.predict(x[2:3])
    np.savez(tmp_path / "bad.npz", x=x.numpy())
    assert main(["predict", str(path), str(tmp_path / "bad.npz")]) == 2
    assert "p2pfed: 3 input values are NaN or infinite, the first in row 2" in capsys.readouterr().err


def test_inputs_far_from_the_trained_range_warn_and_old_cards_are_not_checked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    raw = torch.tensor(load_digits().images[:50], dtype=torch.float32)  # 0-16, as the model was trained on
    path, module = _digits_model(tmp_path)
    model = ExportedModel.load(path)
    assert model.card.input_range == [0.0, 16.0]
    caplog.set_level(logging.WARNING)
    model.predict(raw)
    model.predict(raw[:1] * 0.9)  # one sample, a little darker: still the same units
    assert not caplog.records
    for other, said in [(raw * 255 / 16, "inputs run from 0 to 255"), (raw / 16, "inputs run from 0 to 1"),
                        (raw - 100, "inputs run from -100 to -84")]:
        caplog.clear()
        model.predict(other)  # a warning, not a refusal: the answers still come
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert caplog.records[0].getMessage().startswith(
            f"{said}, but this model was trained on inputs from 0 to 16: in other units?")
    # a card written before cards held the range still loads, and its inputs are not checked
    card = json.loads(load_file_metadata(path)[CARD])
    del card["input_range"], card["class_names"]
    from p2pfed.learn.checkpoint import save_atomic

    save_atomic(dict(module.state_dict()), tmp_path / "old.safetensors", metadata={CARD: json.dumps(card)})
    old = ExportedModel.load(tmp_path / "old.safetensors")
    assert old.card.input_range == [] and old.card.class_names == []
    expected = model.predict(raw * 255 / 16)
    caplog.clear()
    assert torch.equal(old.predict(raw * 255 / 16), expected)
    assert not caplog.records
    # a forged range is refused as any other forged field
    for forged in ([16.0, 0.0], [0.0, math.inf], [1.0], ["a", "b"]):
        save_atomic(dict(module.state_dict()), tmp_path / "forged.safetensors",
                    metadata={CARD: json.dumps({**card, "input_range": forged})})
        with pytest.raises(CheckpointError, match="input range"):
            ExportedModel.load(tmp_path / "forged.safetensors")


def test_a_file_that_is_not_an_exported_model_is_named_for_what_it_is(run: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "x.npz", x=np.zeros((2, 8, 8)))
    np.save(tmp_path / "x.npy", np.zeros((2, 8, 8)))
    torch.save({"w": torch.zeros(2)}, tmp_path / "old.ckpt")
    (tmp_path / "notes.txt").write_text("hello")
    takes = "predict takes a model file written by `p2pfed export` (.safetensors)"
    for name, what in [("x.npz", "a NumPy .npz archive (inputs?)"), ("x.npy", "a NumPy .npy array (inputs?)"),
                       ("old.ckpt", "a torch.save (pickle) file, as an earlier p2pfed's checkpoints were"),
                       ("notes.txt", "not a safetensors file"), (".", "a folder")]:
        with pytest.raises(CheckpointError) as caught:
            ExportedModel.load(tmp_path / name)
        # an old checkpoint is told how it becomes a model file; inputs and the rest are not told to convert
        old = "; an earlier p2pfed's checkpoint becomes one by `p2pfed convert`, then `p2pfed export`"
        said = f"{tmp_path / name} is {what}: {takes}{old if name == 'old.ckpt' else ''}"
        assert str(caught.value) == said
        assert main(["predict", str(tmp_path / name), str(tmp_path / "x.npz")]) == 2
        assert capsys.readouterr().err == f"p2pfed: {said}\n"
    # a node's checkpoint is a safetensors file with a card, but not the model alone: export it first
    with pytest.raises(CheckpointError) as caught:
        ExportedModel.load(run / "n00.safetensors")
    assert str(caught.value) == (f"{run / 'n00.safetensors'} is a node's checkpoint, not an exported model: write "
                                 f"its model with `p2pfed export {run / 'n00.safetensors'} OUT.safetensors`")
    with pytest.raises(FileNotFoundError, match=r"none\.safetensors: no such model file"):
        ExportedModel.load(tmp_path / "none.safetensors")


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder nothing may be written in: a read-only tmpfs mounted on it (root, who may write in any folder
    of the disk), or a folder without write permission (anyone else)."""
    import os
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a read-only folder: {mounted.stderr.decode()[:200]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_export_makes_missing_folders_and_names_a_place_it_cannot_write(
        run: Path, tmp_path: Path, read_only: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = run / "n00.safetensors"
    deep = tmp_path / "models" / "today" / "n00.safetensors"  # folders that do not exist yet are made
    assert export_model(checkpoint, deep).node == "n00" and ExportedModel.load(deep).card.node == "n00"
    (tmp_path / "a-file").write_text("")
    mounted = read_only.stat().st_dev != tmp_path.stat().st_dev
    for out, why in [(read_only / "n00.safetensors",
                      f"cannot write there ({'Read-only file system' if mounted else 'Permission denied'})"),
                     (tmp_path / "a-file" / "n00.safetensors", f"{tmp_path / 'a-file'} is a file, not a folder"),
                     (tmp_path / "a-file" / "x" / "n00.safetensors",
                      f"cannot make its folder {tmp_path / 'a-file' / 'x'} (Not a directory)")]:
        with pytest.raises(OSError) as caught:
            export_model(checkpoint, out)
        assert str(caught.value) == f"{out}: {why}"
        # the command line says it in one line, with no traceback
        assert main(["export", str(checkpoint), str(out)]) == 2
        assert capsys.readouterr().err == f"p2pfed: {out}: {why}\n"
    assert main(["export", str(checkpoint), str(read_only)]) == 2  # a folder as out: NAME-model.safetensors in it
    assert capsys.readouterr().err.startswith(f"p2pfed: {read_only / 'n00-model.safetensors'}: cannot write there")
    assert list(read_only.iterdir()) == []  # no temporary file left behind either
