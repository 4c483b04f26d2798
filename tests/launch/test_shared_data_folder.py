"""The folder of the dataset a run shares with its worker processes: a run killed by SIGKILL cannot remove its own,
so the next run removes the folders of runs that are gone (issue 29: the folder stayed behind)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from p2pfed.launch.runner import data_folder_prefix, sweep_data_folders


def test_a_run_removes_the_dataset_folders_of_runs_that_are_gone_and_keeps_live_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = tmp_path / f"p2pfed-data-{gone.stdout.strip()}-abc"  # a run killed by SIGKILL: its process is gone
    live = tmp_path / f"{data_folder_prefix()}xyz"  # this process's own, in use
    other = tmp_path / "p2pfed-data-notapid"  # not named by the runner: left alone
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "dataset.json").write_text("{}")
    assert live.name.startswith(f"p2pfed-data-{os.getpid()}-")
    sweep_data_folders()
    assert not dead.exists() and live.exists() and other.exists()
