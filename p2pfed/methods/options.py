"""A method's own options: its scenario table ``[methods.NAME]``, filled into the method's dataclass and
checked by it, so an error names the key (``methods.perfedavg.inner_lr must be > 0``) and the launcher adds
the file. A method declares its options as a frozen dataclass with defaults and a ``validate(where)``.

(The older shared tables, ``[pfedlia]`` and ``[central]``, still hold the options of the methods written
before these tables existed; see README, "Where the code departs from the design notes".)
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from p2pfed.config import fill
from p2pfed.scenario.config import Scenario


class Options(Protocol):
    """What a method's options dataclass provides besides its fields (and, optionally, ``moved``: a
    ClassVar mapping a key it once had in the shared [central] table to its name here)."""

    def validate(self, where: str) -> None:
        """Raise ConfigError naming where + the key of a value that cannot work."""


OptionsT = TypeVar("OptionsT", bound=Options)


def options_of(options_type: type[OptionsT], scenario: Scenario, name: str) -> OptionsT:
    """Method name's options from the scenario's [methods.NAME] table (defaults where it has none)."""
    where = f"methods.{name}."
    options = fill(options_type, scenario.method_tables.get(name, {}), where)
    options.validate(where)
    return options

