"""Checkpoints: what is saved is what is loaded, a crash while saving never costs the last good checkpoint,
and loading runs no code from the file (safetensors: no pickle, even for local files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from p2pfed.learn import checkpoint
from p2pfed.learn.checkpoint import CheckpointError, convert, load_own, read, refuse_old, save_atomic


def test_a_checkpoint_is_loaded_as_it_was_saved_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "n01.safetensors"
    weights = torch.arange(6.0).reshape(2, 3)
    state = {"round": 4, "model": {"w": weights, "steps": torch.tensor(7)}, "method": '{"chosen": ["n00"]}',
             "kept": {"w0": {"w": 2 * weights}, "partial/odd name": {"w": 3 * weights}}, "none": None,
             "list": [1, 2.5, "x"], "empty": {}}
    save_atomic(state, path)
    save_atomic({**state, "round": 5}, path)  # the next round's replaces it
    loaded = load_own(path)
    assert loaded["round"] == 5 and loaded["method"] == state["method"]
    assert torch.equal(loaded["model"]["w"], weights) and loaded["model"]["steps"].item() == 7
    assert torch.equal(loaded["kept"]["partial/odd name"]["w"], 3 * weights)
    assert (loaded["none"], loaded["list"], loaded["empty"]) == (None, [1, 2.5, "x"], {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n01.safetensors"]


def test_tied_weights_and_views_are_saved_as_values(tmp_path: Path) -> None:
    # safetensors refuses tensors sharing storage; a model with tied weights (a language model's embedding and
    # output layer) has them
    w = torch.randn(4, 3)
    save_atomic({"a": w, "b": w, "col": w[:, 1]}, tmp_path / "t.safetensors")
    loaded = load_own(tmp_path / "t.safetensors")
    assert torch.equal(loaded["a"], w) and torch.equal(loaded["b"], w) and torch.equal(loaded["col"], w[:, 1])


def test_a_file_another_tool_wrote_reads_as_its_tensor_table(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"fc.weight": torch.ones(2, 3), "fc.bias": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    loaded = load_own(tmp_path / "plain.safetensors")
    assert sorted(loaded) == ["fc.bias", "fc.weight"] and torch.equal(loaded["fc.weight"], torch.ones(2, 3))


def test_what_cannot_go_in_a_checkpoint_is_named(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"model/opt: a object"):
        save_atomic({"model": {"opt": object()}}, tmp_path / "t.safetensors")
    with pytest.raises(TypeError, match="keys are text"):
        save_atomic({"models": {3: {"w": torch.zeros(1)}}}, tmp_path / "t.safetensors")
    assert not list(tmp_path.iterdir())


def test_metadata_is_stored_beside_the_tree(tmp_path: Path) -> None:
    save_atomic({"model": {"w": torch.ones(2)}}, tmp_path / "m.safetensors", metadata={"recipe": "[model]"})
    _, tensors, metadata = read(tmp_path / "m.safetensors")
    assert metadata == {"recipe": "[model]"} and list(tensors) == ["model/w"]


def test_a_crash_while_saving_keeps_the_last_good_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "n01.safetensors"
    save_atomic({"round": 4}, path)
    real_save = checkpoint.save_file

    def killed_halfway(tensors: Any, filename: str, metadata: Any = None) -> None:
        real_save(tensors, filename, metadata=metadata)
        Path(filename).write_bytes(Path(filename).read_bytes()[:20])  # the process dies with the file half written
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_atomic({"round": 5}, path)
    assert load_own(path) == {"round": 4}
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_own(path.with_name("n01.safetensors.tmp"))  # the torn one


class Payload:
    """An object whose unpickling would run code of the file's choosing."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.mark,))


def test_a_pickle_swapped_in_is_refused_without_running_it(tmp_path: Path) -> None:
    path = tmp_path / "n01.safetensors"
    mark = tmp_path / "ran"
    torch.save({"round": 4, "evil": Payload(mark)}, path)  # a file someone swapped in
    with pytest.raises(CheckpointError, match="pickle format, no longer read"):
        load_own(path)
    assert not mark.exists()


def test_an_earlier_p2pfeds_checkpoint_stops_the_resume_and_converts_once(tmp_path: Path) -> None:
    old = tmp_path / "n01.ckpt"
    torch.save({"round": 4, "model": {"w": torch.ones(3)}, "method": "{}"}, old)
    torch.save({"w0": {"w": torch.zeros(3)}}, tmp_path / "n01.kept")
    new = tmp_path / "n01.safetensors"
    with pytest.raises(CheckpointError, match=r"p2pfed convert .*n01\.ckpt"):
        refuse_old(new)  # resuming from nothing would start the member afresh without a word
    assert convert(old) == new and convert(tmp_path / "n01.kept") == tmp_path / "n01.kept.safetensors"
    refuse_old(new)
    refuse_old(tmp_path / "n01.kept.safetensors")
    assert load_own(new)["round"] == 4 and torch.equal(load_own(new)["model"]["w"], torch.ones(3))
    assert torch.equal(load_own(tmp_path / "n01.kept.safetensors")["w0"]["w"], torch.zeros(3))


def test_converting_takes_tensors_and_plain_data_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (set, say, to read some old file) turns torch.load's default to full
    # unpickling; converting an old checkpoint must not follow it.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    mark = tmp_path / "ran"
    torch.save({"round": 4, "evil": Payload(mark)}, tmp_path / "n01.ckpt")
    with pytest.raises(CheckpointError, match=r"not a checkpoint p2pfed can convert"):
        convert(tmp_path / "n01.ckpt")
    assert not mark.exists() and not (tmp_path / "n01.safetensors").exists()
