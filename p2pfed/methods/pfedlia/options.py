"""pFedLIA's options: the influence phase's, the same for both forms, then each form's own, in the tables
``[methods.pfedlia-p2p]`` and ``[methods.pfedlia-central]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from p2pfed.config import ConfigError
from p2pfed.influence.selection import SELECTION_RULES
from p2pfed.methods.options import MethodOptions, below_rounds
from p2pfed.scenario.config import Scenario

OPTICS_RULES = ("ours", "paper")
_PHASE = ("warmup_rounds", "lia_epochs", "lia_batch", "lia_lr")


@dataclass(frozen=True)
class InfluenceOptions(MethodOptions):
    """The influence phase: its round W, and how each node trains its partial model from w0."""

    warmup_rounds: int = 5  # W: FedAvg rounds that make w0; the phase runs in round W
    lia_epochs: int = 20  # epochs of a partial model on its batch
    lia_batch: int = 100  # samples in that batch
    lia_lr: float = 0.05

    def validate(self, where: str) -> None:
        if self.lia_epochs < 1 or self.lia_batch < 1 or not self.lia_lr > 0:
            raise ConfigError(f"{where}lia_epochs, lia_batch and lia_lr must be positive (got {self.lia_epochs}, "
                              f"{self.lia_batch}, {self.lia_lr})")

    def within(self, scenario: Scenario, where: str) -> None:
        below_rounds(self.warmup_rounds, "warmup_rounds", scenario, where, "the influence phase runs in that round")


@dataclass(frozen=True)
class P2POptions(InfluenceOptions):
    """pFedLIA-p2p's: the phase's, the selection rule, and how much of the scores' variance a 2-means split
    must explain under our rule."""

    gap: float = 0.8  # influence/selection.py: below it, a node keeps every peer with positive influence
    selection: str = "ours"  # influence/selection.py: "paper" is plain 2-means, the higher group

    def validate(self, where: str) -> None:
        super().validate(where)
        if not 0 <= self.gap <= 1:
            raise ConfigError(f"{where}gap must be in [0, 1] (got {self.gap})")
        if self.selection not in SELECTION_RULES:
            raise ConfigError(f"{where}selection must be one of {', '.join(SELECTION_RULES)} (got "
                              f"{self.selection!r})")


@dataclass(frozen=True)
class PaperP2POptions(P2POptions):
    """pFedLIA-p2p-paper's: pFedLIA-p2p's table but the rule, which is the paper's unless told otherwise."""

    selection: str = "paper"
    base: ClassVar[str] = "pfedlia-p2p"
    own: ClassVar[frozenset[str]] = frozenset({"selection"})


@dataclass(frozen=True)
class CentralOptions(InfluenceOptions):
    """pFedLIA-central's: the phase's, OPTICS's own parameters and the scoring deadline."""

    optics: str = "ours"  # central.py: "paper" is OPTICS on the raw matrix, noise points on their own
    optics_min_samples: int = 3
    optics_xi: float = 0.05
    lia_timeout: float = 300.0  # every node scores every partial model: longer than a round's task

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.optics_min_samples < 2 or not 0 < self.optics_xi < 1:
            raise ConfigError(f"{where}optics_min_samples must be >= 2 and optics_xi in (0, 1) (got "
                              f"{self.optics_min_samples}, {self.optics_xi})")
        if not self.lia_timeout > 0:
            raise ConfigError(f"{where}lia_timeout must be > 0 (got {self.lia_timeout})")
        if self.optics not in OPTICS_RULES:
            raise ConfigError(f"{where}optics must be one of {', '.join(OPTICS_RULES)} (got {self.optics!r})")


@dataclass(frozen=True)
class PaperCentralOptions(CentralOptions):
    """pFedLIA-central-paper's: pFedLIA-central's table but the rule, which is the paper's unless told
    otherwise."""

    optics: str = "paper"
    base: ClassVar[str] = "pfedlia-central"
    own: ClassVar[frozenset[str]] = frozenset({"optics"})
