"""The mutation score of the core paths, per module, from mutmut's stored results.

Reads ``python3 -m mutmut results --all true`` (or a saved copy of it, ``--results FILE``), groups the
mutants by module (in node/learner.py and coordinator/server.py only the resume, checkpoint and round
methods count: the rest of those files is tested by the learning runs, which are too slow to run per
mutant), and prints per module: killed, survived, timeout, total and the score, (killed + timeout) over
the mutants checked. Then it lists every surviving mutant that tests/mutation/accepted.toml does not
accept. An accepted entry must still match its mutant: the line it quotes has to be the line that
``mutmut show`` adds (for a mutant that only deletes a line, "removed: " and that line), or the entry is
stale (mutmut numbers mutants per function, so an edit to the
function renumbers them) and the survivor counts as unaccepted.

Exit code 1 if a module scores under 85 % or an unaccepted survivor remains; 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[2]
ACCEPTED = Path(__file__).with_name("accepted.toml")
THRESHOLD = 85.0

# Only these functions count in these modules (the mutants of the others are not run by run.sh).
SCOPE: dict[str, frozenset[str]] = {
    "p2pfed.node.learner": frozenset({"LearningNode.restore", "LearningNode.checkpoint", "LearningNode.run",
                                      "LearningNode.run_round"}),
    "p2pfed.coordinator.server": frozenset({"Coordinator.restore", "Coordinator.checkpoint", "Coordinator.run"}),
}

# mutmut's statuses, as the score counts them. "no tests" (no test reaches the mutant) and "suspicious" are
# survivors; a mutant that crashed the test process (mutmut's "segfault": SIGSEGV or the SIGKILL of its time
# limit) was detected. "not checked" and "skipped" are left out.
KILLED = frozenset({"killed", "caught by type check"})
TIMEOUT = frozenset({"timeout", "segfault"})
SURVIVED = frozenset({"survived", "no tests", "suspicious"})

NAME = re.compile(r"^(?P<module>[\w.]+)\.x(?:_(?P<function>.+)|ǁ(?P<cls>\w+)ǁ(?P<method>.+))__mutmut_\d+$")


@dataclass(frozen=True)
class Mutant:
    """One mutant: its name, module, function (Class.method for methods) and mutmut status."""

    name: str
    module: str
    function: str
    status: str


@dataclass
class ModuleScore:
    """The counts of one module's checked mutants."""

    killed: int = 0
    survived: int = 0
    timeout: int = 0
    survivors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Mutants checked."""
        return self.killed + self.survived + self.timeout

    @property
    def score(self) -> float:
        """Percent of checked mutants that a test detected (killed or timed out)."""
        return 100.0 * (self.killed + self.timeout) / self.total if self.total else 100.0


@dataclass(frozen=True)
class Accepted:
    """An entry of accepted.toml: a survivor judged equivalent or accepted, with the line it changes."""

    name: str
    line: str
    why: str


def parse_results(text: str) -> list[Mutant]:
    """The mutants of `mutmut results --all true` output, in scope (see SCOPE); other lines are ignored."""
    mutants = []
    for raw in text.splitlines():
        name, sep, status = raw.strip().rpartition(": ")
        match = NAME.match(name) if sep else None
        if match is None:
            continue
        module = match["module"]
        function = match["function"] or f"{match['cls']}.{match['method']}"
        if module in SCOPE and function not in SCOPE[module]:
            continue
        mutants.append(Mutant(name, module, function, status.strip()))
    return mutants


def score_modules(mutants: Iterable[Mutant]) -> dict[str, ModuleScore]:
    """Per module with at least one checked mutant, its counts and its survivors' names."""
    scores: dict[str, ModuleScore] = defaultdict(ModuleScore)
    for m in mutants:
        if m.status in KILLED:
            scores[m.module].killed += 1
        elif m.status in TIMEOUT:
            scores[m.module].timeout += 1
        elif m.status in SURVIVED:
            scores[m.module].survived += 1
            scores[m.module].survivors.append(m.name)
    return dict(sorted(scores.items()))


def load_accepted(path: Path) -> dict[str, Accepted]:
    """accepted.toml's entries by mutant name; an entry without name, line and why is an error."""
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("mutant", [])
    accepted = {}
    for i, entry in enumerate(entries):
        missing = [k for k in ("name", "line", "why") if not str(entry.get(k, "")).strip()]
        if missing:
            raise SystemExit(f"{path}: mutant entry {i + 1} has no {', '.join(missing)}")
        if entry["name"] in accepted:
            raise SystemExit(f"{path}: {entry['name']} is listed twice")
        accepted[entry["name"]] = Accepted(entry["name"], entry["line"], entry["why"])
    return accepted


def added_lines(name: str) -> list[str]:
    """The lines a mutant adds, stripped, from `mutmut show NAME` (empty if mutmut does not know it); a mutant
    that only deletes (an argument dropped) gives its deleted lines as "removed: LINE"."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=ROOT, capture_output=True,
                         text=True, check=False).stdout
    added = [line[1:].strip() for line in out.splitlines() if line.startswith("+") and not line.startswith("+++")]
    removed = [f"removed: {line[1:].strip()}" for line in out.splitlines()
               if line.startswith("-") and not line.startswith("---")]
    return added if any(added) else removed


def still_matches(entries: list[Accepted]) -> dict[str, bool]:
    """For each entry, whether its quoted line is a line its mutant adds (False: a stale entry)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        lines = dict(zip([e.name for e in entries], pool.map(added_lines, [e.name for e in entries]),
                         strict=True))
    return {e.name: " ".join(e.line.split()) in {" ".join(x.split()) for x in lines[e.name]} for e in entries}


def main(argv: list[str] | None = None) -> int:
    """Print the score table and the unaccepted survivors; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, help="a saved `mutmut results --all true` output "
                                                      "(default: ask mutmut, in the repository root)")
    parser.add_argument("--accepted", type=Path, default=ACCEPTED, help="the accepted survivors (TOML)")
    args = parser.parse_args(argv)
    if args.results is not None:
        text = args.results.read_text()
    else:
        text = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout
    scores = score_modules(parse_results(text))
    if not scores:
        print("no checked mutants in scope: run `bash tests/mutation/run.sh` first")
        return 1
    accepted = load_accepted(args.accepted)
    survivors = [name for s in scores.values() for name in s.survivors]
    matches = still_matches([accepted[n] for n in survivors if n in accepted])

    rows = []
    for module, s in scores.items():
        taken = sum(1 for n in s.survivors if matches.get(n, False))
        rows.append([module, s.killed, s.survived, s.timeout, s.total, f"{s.score:.1f}", taken])
    print(tabulate(rows, headers=["module", "killed", "survived", "timeout", "total", "score %", "accepted"],
                   floatfmt=".1f"))

    failed = False
    low = [m for m, s in scores.items() if s.score < THRESHOLD]
    if low:
        failed = True
        print(f"\nunder {THRESHOLD:.0f} %: {', '.join(low)}")
    stale = [n for n, ok in matches.items() if not ok]
    if stale:
        failed = True
        print("\naccepted entries whose line no longer matches their mutant (renumbered? see `mutmut show`):")
        print("\n".join(f"  {n}: {accepted[n].line}" for n in stale))
    open_ = [n for n in survivors if not matches.get(n, False)]
    if open_:
        failed = True
        print(f"\n{len(open_)} survivors not in {args.accepted.name} (kill them with a test or accept them):")
        print("\n".join(f"  {n}" for n in open_))
    gone = sorted(n for n in accepted if n not in set(survivors))
    if gone:
        print(f"\nnote: {len(gone)} accepted mutants did not survive this run (killed, or not run): "
              + ", ".join(gone))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
