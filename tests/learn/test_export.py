"""A node's personalised model out: exported from a real run's checkpoint, it predicts raw inputs (arrays or
image files) as the node's own model did on its standardised data; p2pfed export / predict say what is wrong."""

from __future__ import annotations

import json
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
