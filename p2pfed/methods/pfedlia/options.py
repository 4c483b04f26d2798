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
STARTS = ("partials", "w0")  # what pfedlia-p2p's cluster rounds start from (P2POptions.start)
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
    """pFedLIA-p2p's: the phase's, the selection rule, how much of the scores' variance a 2-means split must
    explain under our rule, and how the choice keeps learning after the phase (p2p.py; beyond the paper)."""

    gap: float = 0.8  # influence/selection.py: below it, a node keeps every peer with positive influence
    selection: str = "ours"  # influence/selection.py: "paper" is plain 2-means, the higher group
    # the one-sided level of every test of a peer's effect (influence/evidence.py): choose, drop, add, fall
    # back only when the effect is beyond its uncertainty at this level; 0: the mean alone decides
    confidence: float = 0.9
    # rounds of evidence behind a verdict on a chosen peer, a probed one and collaboration; 0: the choice is
    # made once and never looked at again (the paper's), with no probes and no fallback
    window: int = 3
    # the least harm that drops a peer, takes its model of a round back, undoes a round or gives up
    # collaborating, as a share of w0's validation loss; and the least gain (beyond uncertainty) that has a peer
    # chosen in the influence phase, as a share of the most helpful peer's
    margin: float = 0.1
    probe_every: int = 4  # rounds between probes of a peer the node has not chosen (a late joiner first); 0: none
    fallback: bool = True  # keep a local track and go back to it when collaboration does worse
    # what the cluster rounds start from: "partials", the mean of the node's own partial model and its chosen
    # peers' (its local track: its own partial), unless it does worse than w0 on the validation split in the
    # loss and the errors both; "w0", the paper's
    start: str = "partials"
    # in a mesh of more than all_pairs_up_to members, a node scores about this many peers drawn at random in the
    # influence phase, then each round up to as many more, those its chosen peers chose first, up to 4 times
    # this many in all (p2p.py; beyond the paper); 0: all pairs whatever the mesh's size, as the paper does
    sample: int = 16
    # the largest mesh (members a node knows of in the influence phase) in which every node scores every peer
    all_pairs_up_to: int = 100

    def validate(self, where: str) -> None:
        super().validate(where)
        if not 0 <= self.gap <= 1:
            raise ConfigError(f"{where}gap must be in [0, 1] (got {self.gap})")
        if not 0 <= self.confidence < 1:
            raise ConfigError(f"{where}confidence must be in [0, 1) (got {self.confidence})")
        if not 0 <= self.margin <= 10:
            raise ConfigError(f"{where}margin must be in [0, 10] (got {self.margin})")
        if not 0 <= self.window <= 50 or not 0 <= self.probe_every <= 1000:
            raise ConfigError(f"{where}window must be in 0..50 and probe_every in 0..1000 (got {self.window}, "
                              f"{self.probe_every})")
        if self.window == 0 and (self.probe_every or self.fallback):
            raise ConfigError(f"{where}probe_every and fallback need evidence over rounds: set window >= 1, or "
                              "probe_every = 0 and fallback = false")
        if self.start not in STARTS:
            raise ConfigError(f"{where}start must be one of {', '.join(STARTS)} (got {self.start!r})")
        if self.selection not in SELECTION_RULES:
            raise ConfigError(f"{where}selection must be one of {', '.join(SELECTION_RULES)} (got "
                              f"{self.selection!r})")
        if not 0 <= self.sample <= 1000 or not 1 <= self.all_pairs_up_to <= 1_000_000:
            raise ConfigError(f"{where}sample must be in 0..1000 and all_pairs_up_to in 1..1000000 (got "
                              f"{self.sample}, {self.all_pairs_up_to})")


@dataclass(frozen=True)
class PaperP2POptions(P2POptions):
    """pFedLIA-p2p-paper's: pFedLIA-p2p's table but the rule and what it adds after the choice, which are the
    paper's (plain 2-means, one choice) unless told otherwise."""

    selection: str = "paper"
    confidence: float = 0.0
    window: int = 0  # the paper chooses once
    probe_every: int = 0
    fallback: bool = False
    start: str = "w0"
    sample: int = 0  # the paper scores every peer
    base: ClassVar[str] = "pfedlia-p2p"
    own: ClassVar[frozenset[str]] = frozenset({"selection", "confidence", "window", "margin", "probe_every",
                                               "fallback", "start", "sample"})


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
