"""A run folder made fit to commit beside the results it shows (``p2pfed report RUN --ship DEST``).

DEST keeps what the report is drawn from and nothing else: partition.json, scenario.toml, each method's
run.json and its members' metrics files, compressed (``n00.jsonl.gz``); for a run over seeds, the same for every
seed-S folder. Checkpoints, exported models and the log stay behind (megabytes a reader cannot check a table
with). The report is then redrawn in DEST from those files alone, and must come out as the run's own did: so
``p2pfed report DEST`` redraws every shipped table and plot from shipped files.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any

from p2pfed.report.records import record_files
from p2pfed.report.results import write_report
from p2pfed.report.seeds import is_seeds_folder, seed_folders, write_seeds_report

KEPT = ("partition.json", "scenario.toml")  # a run folder's files the report reads, beside the method folders
KEPT_PER_METHOD = ("run.json",)


def ship_run(run_dir: Path, dest: Path) -> dict[str, Any]:
    """Copy what run_dir's report is drawn from into dest, redraw the report there and return its summary;
    ValueError if the redrawn summary is not the run's own (then dest is not fit to ship)."""
    if not (run_dir / "partition.json").exists() and not is_seeds_folder(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a run folder (no partition.json, no seed-S folders)")
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty: ship into a new folder")
    seeds = is_seeds_folder(run_dir)
    own = write_seeds_report(run_dir) if seeds else write_report(run_dir)
    folders = {f"seed-{s}": f for s, f in seed_folders(run_dir).items()} if seeds else {"": run_dir}
    for name, folder in folders.items():
        _copy_run(folder, dest / name if name else dest)
    shipped = write_seeds_report(dest) if seeds else write_report(dest)
    if shipped != own:
        raise ValueError(f"the report redrawn in {dest} is not {run_dir}'s own: a file it reads was not shipped")
    return shipped


def _copy_run(run_dir: Path, dest: Path) -> None:
    """One run folder's partition, scenario, and per method its run.json and compressed metrics files."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (run_dir / name).exists():
            shutil.copyfile(run_dir / name, dest / name)
    for method in sorted(p for p in run_dir.iterdir() if p.is_dir() and record_files(p)):
        (dest / method.name).mkdir()
        for name in KEPT_PER_METHOD:
            if (method / name).exists():
                shutil.copyfile(method / name, dest / method.name / name)
        for path in record_files(method):
            data = path.read_bytes()
            if path.suffix != ".gz":
                # mtime 0 and no file name: the same records compress to the same bytes (a re-ship shows no diff)
                data = gzip.compress(data, compresslevel=9, mtime=0)
                path = path.with_name(path.name + ".gz")
            (dest / method.name / path.name).write_bytes(data)

