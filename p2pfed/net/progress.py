"""A learning member's progress as its status tells it to whoever asks (``p2pfed dashboard``): the method,
the last evaluations, the peers it chose (and those it dropped from its choice) and its scores of them, or a
coordinator's grouping of nodes. Fed from the member's own records (the same events its metrics file holds),
bounded as the wire's LEARNING schema is; nothing of the member's data."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from p2pfed.wire.messages import CURVE, MAX_PEERS_LISTED

NO_LOSS = -1.0  # a round evaluated without a loss (or with one that is not finite)
MAX_LOSS = 1e9


class Progress:
    """What a member announces of its learning, kept up to date by note()."""

    def __init__(self, method: str = "", groups: Callable[[], Mapping[str, int]] | None = None,
                 keep: int | None = CURVE) -> None:
        self.method = method
        # the last `keep` evaluations (the wire's bound); None keeps all (a run folder read afterwards)
        self.curve: deque[tuple[int, float, float]] = deque(maxlen=keep)
        self.chosen: list[str] = []
        self.dropped: list[str] = []  # peers dropped from the choice, as its "choice" record says
        self.scores: dict[str, float] = {}
        self.groups = groups  # a coordinator's grouping of nodes, read when asked

    def note(self, event: str, rnd: int, fields: Mapping[str, Any], method: str | None = None) -> None:
        """Take in one record of the member's (its event, round and fields)."""
        if method:
            self.method = method
        accuracy = fields.get("accuracy")
        if event in ("round", "final") and isinstance(accuracy, (int, float)) and 0 <= accuracy <= 1:
            loss = fields.get("loss")
            finite = isinstance(loss, (int, float)) and math.isfinite(loss) and 0 <= loss <= MAX_LOSS
            point = (rnd, float(accuracy), float(loss) if finite else NO_LOSS)  # type: ignore[arg-type]
            if self.curve and self.curve[-1][0] == rnd:
                self.curve[-1] = point  # the final evaluation of the last round replaces that round's
            else:
                self.curve.append(point)
        if "chosen" in fields and event in ("choice", "final"):
            self.chosen = sorted(str(p) for p in fields["chosen"])[:MAX_PEERS_LISTED]
        if event == "choice" and isinstance(fields.get("dropped"), list):
            self.dropped = sorted(str(p) for p in fields["dropped"])[:MAX_PEERS_LISTED]
        if event == "choice" and isinstance(fields.get("scores"), Mapping):
            self.scores = dict(list(fields["scores"].items())[:MAX_PEERS_LISTED])
        if event == "scores":  # a node's scores, asked for by its coordinator
            self.scores = dict(list(zip(fields["peers"], fields["values"], strict=True))[:MAX_PEERS_LISTED])

    def body(self) -> dict[str, Any]:
        """The status's LEARNING part."""
        groups = dict(list((self.groups() if self.groups else {}).items())[:MAX_PEERS_LISTED])
        scores = {k: v for k, v in self.scores.items() if math.isfinite(v) and abs(v) <= 1e9}
        return {
            "method": self.method[:64],
            "rounds": [r for r, _, _ in self.curve], "accuracy": [a for _, a, _ in self.curve],
            "loss": [x for _, _, x in self.curve], "chosen": self.chosen,
            "names": sorted(scores) if not groups else sorted(groups),
            "values": [scores[n] for n in sorted(scores)] if not groups else [],
            "groups": [int(groups[n]) for n in sorted(groups)],
            **({"dropped": self.dropped} if self.dropped else {}),
        }
