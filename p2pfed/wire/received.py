"""What a member took in from a peer, typed: the messages a node's inbox holds once they were checked.

A model (``ModelIn``) is its weights, read-only views of the received frames (no copy: averaging and
``load_state_dict`` read them, nothing writes to them), and the sample count the sender weighs it by; a note
(``NoteIn``) is a number per name. Both name their sender, whose key the endpoint has checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ModelIn:
    """A peer's model of some kind for a round, as it arrived."""

    sender: str
    state: dict[str, torch.Tensor]
    samples: int  # its training samples: its weight in a sample-weighted average


@dataclass(frozen=True)
class NoteIn:
    """A peer's note of some kind for a round: a number per name (e.g. the peers it chose, with their scores)."""

    sender: str
    values: dict[str, float]
