"""A method's own options: its scenario table ``[methods.NAME]``, filled into the method's dataclass and
checked by it, so an error names the key (``methods.perfedavg.inner_lr must be > 0``) and the launcher adds
the file. A method declares its options as a frozen dataclass deriving from ``MethodOptions``, with defaults,
a ``validate(where)`` of its values alone and, where a value must fit the scenario (a warm-up shorter than
the run), a ``within(scenario, where)``.

Where the keys of the former shared tables ``[pfedlia]`` and ``[central]`` went is one table,
methods/former.py, which scenario/migrate.py reads a file from before 0.1 against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeVar

from p2pfed.config import ConfigError, fill
from p2pfed.scenario.config import Scenario


class MethodOptions:
    """What a method's options dataclass provides besides its fields."""

    # A variant of another method (pfedlia-p2p-paper of pfedlia-p2p) takes that method's table, but for the
    # keys in `own`, under its own: run side by side, the two differ only in what the variant is about.
    base: ClassVar[str] = ""
    own: ClassVar[frozenset[str]] = frozenset()

    def validate(self, where: str) -> None:
        """Raise ConfigError naming where + the key of a value that cannot work."""

    def within(self, scenario: Scenario, where: str) -> None:
        """Raise ConfigError naming where + the key of a value that cannot work in this scenario."""


OptionsT = TypeVar("OptionsT", bound=MethodOptions)


def options_of(options_type: type[OptionsT], scenario: Scenario, name: str, fit: bool = True) -> OptionsT:
    """Method name's options from the scenario's [methods.NAME] table (a variant's: the base method's table,
    overlaid by its own; defaults where they have none), checked, and (fit) checked against the scenario."""
    where = f"methods.{name}."
    table = scenario.method_tables.get(name, {})
    if options_type.base:
        inherited = {key: value for key, value in scenario.method_tables.get(options_type.base, {}).items()
                     if key not in options_type.own}
        base_where = f"methods.{options_type.base}."
        taken = fill(options_type, inherited, base_where)  # an error names the table the value is written in
        taken.validate(base_where)
        if fit:
            taken.within(scenario, base_where)
        table = {**inherited, **table}
    options = fill(options_type, table, where)
    options.validate(where)
    if fit:
        options.within(scenario, where)
    return options


@dataclass(frozen=True)
class ClusteredOptions(MethodOptions):
    """The option of every method that keeps K cluster models: K itself."""

    # K; 0 takes the partition's number of clusters, the true one (Rokvic et al. 2025 gave FeSEM the true K;
    # FeSEM's paper, Long et al. 2023, picks K by trying several; IFCA's and CAM's are given it)
    k: int = 0

    def validate(self, where: str) -> None:
        if self.k < 0:
            raise ConfigError(f"{where}k must be >= 0 (0: the partition's clusters; got {self.k})")

    def within(self, scenario: Scenario, where: str) -> None:
        k = self.k or scenario.data.clusters
        if k == 0:
            raise ConfigError(f"{where}k must be given: the {scenario.data.partition.kind} partition has no clusters "
                              "to take it from")
        if k > scenario.nodes:
            raise ConfigError(f"{where}k ({k}) must not exceed scenario.nodes ({scenario.nodes})")


def below_rounds(value: int, key: str, scenario: Scenario, where: str, why: str) -> None:
    """Raise ConfigError unless 0 <= value < the scenario's rounds (a warm-up that leaves rounds to run)."""
    if not 0 <= value < scenario.rounds:
        raise ConfigError(f"{where}{key} ({value}) must be in [0, scenario.rounds = {scenario.rounds}): {why}")
