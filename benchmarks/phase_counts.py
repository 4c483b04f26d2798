"""What a pFedLIA-p2p run's logs say of its influence phase: a sampling node's sample, the partial models it
scored, whom it chose, and how long it waited for peers behind it.

Reads each node's "lazy influence of X of Y sampled peers; chose Z" line and "waited S s for ... partial models
of ... peers behind" line from the group logs of a run folder (`benchmarks/scale.py --work DIR` keeps them), so
that runs of different code are counted alike.

Run: python3 benchmarks/phase_counts.py --run CODE=RUN_FOLDER [--run ...] [--json FILE [--append]]
(--append keeps the columns FILE has, for runs whose folders are gone, and adds these runs' after them)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

LIA = re.compile(r"(n\d+): lazy influence of (\d+) of (\d+) sampled peers; chose (\d+)")
WAITED = re.compile(r"(n\d+): waited (\d+) s for (?:the )?partial models of (?:paired )?peers behind")


def counts(folder: Path) -> dict[str, float]:
    """The influence phase's figures of the run in folder (its pfedlia-p2p group logs)."""
    phase: dict[str, tuple[int, int, int]] = {}
    waits: list[int] = []
    for log in sorted((folder / "pfedlia-p2p").glob("*-group.log")):
        for line in log.read_text(errors="replace").splitlines():
            if m := LIA.search(line):
                phase[m[1]] = (int(m[2]), int(m[3]), int(m[4]))
            elif m := WAITED.search(line):
                waits.append(int(m[2]))
    if not phase:
        raise SystemExit(f"{folder}: no node's influence phase in its logs")
    return {"nodes": len(phase),
            "sample_mean": statistics.mean(p[1] for p in phase.values()),
            "drew_none": sum(p[1] == 0 for p in phase.values()),
            "scored_mean": statistics.mean(p[0] for p in phase.values()),
            "scored_none": sum(p[0] == 0 for p in phase.values()),
            "chose_none": sum(p[2] == 0 for p in phase.values()),
            "waited": len(waits), "waited_median_s": statistics.median(waits) if waits else 0,
            "waited_max_s": max(waits, default=0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, help="CODE=RUN_FOLDER (a label, then the folder)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--append", action="store_true", help="keep the runs --json already holds, add these after")
    args = ap.parse_args()
    if args.append and not (args.json and args.json.is_file()):
        raise SystemExit("--append needs --json naming a file that exists")
    try:
        kept = json.loads(args.json.read_text()) if args.append else {"command": "", "rows": []}
        kept_command, kept_rows = str(kept["command"]), list(kept["rows"])
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{args.json}: not a file phase_counts.py wrote ({e!s:.80})") from None
    rows = []
    for run in args.run:
        code, _, folder = run.partition("=")
        if not folder:
            raise SystemExit(f"--run {run!r:.80}: want CODE=RUN_FOLDER")
        rows.append({"code": code, **counts(Path(folder))})
        print(json.dumps(rows[-1]))
    if args.json:
        command = "python3 benchmarks/phase_counts.py " + " ".join(f"--run {r['code']}=DIR" for r in rows)
        if args.append:  # every column keeps the command that counted it
            command = f"{kept_command}; then {command} --append"
        args.json.write_text(json.dumps({"command": command, "rows": kept_rows + rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
