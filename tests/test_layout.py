"""The generic layers name no method: the node, the coordinator, the network, the wire, the launchers, the
report and the scenario model run every method through the method interfaces (methods/base.py,
methods/central.py, methods/options.py), so a new method touches none of them. A method's name (or pFedLIA's
own terms) appearing there is a method's shape leaking in. (learn/ may name the algorithm a helper computes,
FedAvg's weighting or FedProx's penalty: it knows no method module.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from p2pfed.methods import METHODS

ROOT = Path(__file__).resolve().parents[1] / "p2pfed"
GENERIC = ("node", "coordinator", "net", "wire", "launch", "report", "scenario")
# every registered method by name and by its family's spelling (fedavg-p2p → fedavg), and pFedLIA's terms
FAMILIES = {m.removesuffix("-p2p").removesuffix("-central").removesuffix("-cam") for m in METHODS}
# ("local", local training, is also a plain word: its p2p form "local-p2p" is checked; so is "gossip", how the
# membership spreads what a member knows.)
TERMS = sorted({*METHODS, *FAMILIES, "pfedlia", "per-fedavg", "lazy influence", "partial model", "w0"}
               - {"local", "gossip"})
PATTERN = re.compile(r"(?<![\w-])(" + "|".join(re.escape(t) for t in TERMS) + r")(?![\w-])", re.IGNORECASE)


def named(pattern: re.Pattern[str], packages: tuple[str, ...], skip: set[Path] | None = None) -> list[str]:
    """Each line of a module of packages (but skip) that pattern matches, as path:line: match."""
    return [f"{path.relative_to(ROOT.parent)}:{number}: {match.group(0)}"
            for package in packages for path in sorted((ROOT / package).rglob("*.py")) if path not in (skip or set())
            for number, line in enumerate(path.read_text().splitlines(), 1)
            for match in [pattern.search(line)] if match]


def test_no_generic_module_names_a_method() -> None:
    found = named(PATTERN, GENERIC)
    assert found == [], "\n".join(found)


def test_the_check_sees_a_method_name() -> None:
    assert PATTERN.search("# FedAvg by sample count") and PATTERN.search('CLUSTERING = {"pfedlia-p2p"}')
    assert not PATTERN.search("weighted_average(states)")  # a word that only contains one is not one


def _modules(package: Path) -> set[str]:
    """The dotted names, relative to package, of its modules and of its sub-packages that hold code (an empty
    __init__.py imports nothing)."""
    return {".".join(path.relative_to(package).with_suffix("").parts).removesuffix(".__init__")
            for path in package.rglob("*.py")
            if path.parent != package or path.name != "__init__.py"
            if path.name != "__init__.py" or path.read_text().strip()}


def test_every_module_is_in_a_layer_of_its_contract() -> None:
    """import-linter checks only the modules a layers contract names: a module outside every layer may import
    anything, unseen. Every module of p2pfed (and of learn, for its own contract) must fall in one."""
    contracts = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    for contract in contracts:
        container = contract["containers"][0].removeprefix("p2pfed").removeprefix(".")
        package = ROOT / Path(*container.split(".")) if container else ROOT
        layers = [name.strip() for layer in contract["layers"] for name in layer.split("|")]
        outside = sorted(m for m in _modules(package)
                         if not any(m == name or m.startswith(name + ".") for name in layers))
        assert outside == [], f"{contract['name']}: {', '.join(outside)} in no layer"


# A scripted adversary is a conduct the launcher hands a node (launch/adversary.py): the node, the coordinator
# and the network run honest and scripted members alike, with no branch for either.
ADVERSARY = re.compile(r"adversar|free.rider|noise.model|label.flip|flip_labels|noise_like", re.IGNORECASE)


def test_no_node_coordinator_or_network_module_names_an_adversary() -> None:
    found = named(ADVERSARY, ("node", "coordinator", "net"))
    assert found == [], "\n".join(found)
    assert ADVERSARY.search('if self.adversary == "free-rider":') and ADVERSARY.search("noise_like(state, seed)")


# A paper's special capability (a server's indicator samples, a protocol's server-held test set, prototypes,
# anchors, MAML steps) lives in its method, with the data it needs handed over by the launcher (learn/held.py)
# and the per-task values it sends typed by the method (methods/central.py: Instructions).
CAPABILITY = re.compile(r"indicator|et al\.|\bpapers?\b|prototyp|anchor|maml|server_per_class|server_test\b",
                        re.IGNORECASE)


def test_no_node_coordinator_or_network_module_names_a_papers_capability() -> None:
    found = named(CAPABILITY, ("node", "coordinator", "net"))
    assert found == [], "\n".join(found)
    assert CAPABILITY.search("def indicator_samples(self, per_class: int)")
    assert CAPABILITY.search("# the protocol of Ye et al. 2023") and CAPABILITY.search('task.meta.get("maml")')
