"""Checkpoints: what is saved is what is loaded, a crash while saving never costs the last good checkpoint,
and loading runs no code from the file."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from p2pfed.learn import checkpoint
from p2pfed.learn.checkpoint import load_own, save_atomic


def test_a_checkpoint_is_loaded_as_it_was_saved_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "n01.ckpt"
    weights = torch.arange(6.0).reshape(2, 3)
    state = {"round": 4, "model": {"w": weights}, "method": '{"chosen": ["n00"]}'}
    save_atomic(state, path)
    save_atomic({**state, "round": 5}, path)  # the next round's replaces it
    loaded = load_own(path)
    assert loaded["round"] == 5 and loaded["method"] == state["method"]
    assert torch.equal(loaded["model"]["w"], weights)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n01.ckpt"]


def test_a_crash_while_saving_keeps_the_last_good_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "n01.ckpt"
    save_atomic({"round": 4}, path)
    real_save = torch.save

    def killed_halfway(obj: Any, f: Any) -> None:
        real_save(obj, f)
        Path(f).write_bytes(Path(f).read_bytes()[:20])  # the process dies with the file half written
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.torch, "save", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_atomic({"round": 5}, path)
    assert load_own(path) == {"round": 4}


class Payload:
    """An object whose unpickling would run code of the file's choosing."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("this ran while loading a checkpoint",))


def test_loading_a_checkpoint_takes_tensors_and_plain_data_only(tmp_path: Path) -> None:
    path = tmp_path / "n01.ckpt"
    torch.save({"round": 4, "evil": Payload()}, path)  # a file someone swapped in
    with pytest.raises(pickle.UnpicklingError):
        load_own(path)


def test_our_checkpoints_stay_weights_only_when_the_environment_asks_torch_for_full_pickles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (set, say, to read some old file) turns torch.load's default to full
    # unpickling; this program's own checkpoints must not follow it.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    path = tmp_path / "n01.ckpt"
    torch.save({"round": 4, "evil": Payload()}, path)
    with pytest.raises(pickle.UnpicklingError):
        load_own(path)
