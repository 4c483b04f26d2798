"""pFedLIA, peer to peer (Rokvic et al. 2025, §III-D and §III-F).

Rounds 0 .. W−1: FedAvg among all live peers to get the warm-up model w0. Every node averages the same
round's participant models, so all nodes end each warm-up round with the same model, and so hold the
same w0 (as the paper assumes) without an extra synchronisation round.
At round W, once: every node trains its partial model from w0 on a batch of its data and offers it to
every peer, scores every peer's partial model on its validation split (lazy influence),
splits the scores with 2-means (see influence/selection.py for the cases the paper leaves open), and
tells all peers whom it chose. From then on a node averages only with the peers it chose and sends its
model to the peers that chose it. A node that joins later fetches w0 and the partial models its peers
keep, picks its peers the same way, and starts, without any other node re-clustering.

What it says to its peers: "partial" models (pushed in the influence phase; "w0" and "partial" kept for late
joiners to fetch) and "choices" notes (the peers a node chose, with their influence).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch

from p2pfed.influence.lazy_influence import score_peers
from p2pfed.influence.selection import select_peers
from p2pfed.methods.base import Method, PeerContext
from p2pfed.methods.pfedlia.options import P2POptions, PaperP2POptions
from p2pfed.wire import ModelIn

log = logging.getLogger(__name__)


class PFedLIAP2P(Method):
    """Lazy influence, local 2-means peer selection, then FedAvg with the chosen peers."""

    name = "pfedlia-p2p"
    notes: ClassVar[frozenset[str]] = frozenset({"choices"})

    options_type = P2POptions
    options: P2POptions

    def __init__(self, node: PeerContext, options: P2POptions) -> None:
        super().__init__(node, options)
        self.chosen: set[str] | None = None  # None until the influence phase ran
        self.choosers: set[str] = set()  # peers that chose this node: they get its model
        self.chosen_scores: dict[str, float] = {}

    def sources(self, rnd: int) -> set[str]:
        if self.chosen is None:
            return set(self.node.live_peers())
        live = set(self.node.live_peers())
        return self.chosen & live

    def subscribers(self, rnd: int) -> set[str]:
        if self.chosen is None:
            return set(self.node.live_peers())
        return self.choosers & set(self.node.live_peers())

    def accepts(self, kind: str, sender: str, rnd: int) -> bool:
        """Partial models only in the influence phase (round W, before choosing), from live peers."""
        if kind == "partial":
            return self.chosen is None and rnd == self.options.warmup_rounds and sender in self.node.live_peers()
        return super().accepts(kind, sender, rnd)

    def on_note(self, kind: str, sender: str, rnd: int, values: dict[str, float]) -> None:
        """A peer announced its choice ("choices": the peers it chose, with their influence); if it chose this
        node, send it this node's models from now on. A choice of a past round still holds."""
        if self.node.name in values:
            self.choosers.add(sender)
        else:
            self.choosers.discard(sender)

    async def before_round(self, rnd: int) -> None:
        if self.chosen is not None or rnd < self.options.warmup_rounds:
            return
        if rnd > self.options.warmup_rounds:
            await self.join_late()
            return
        peers = set(self.node.live_peers())
        partial = await self.train_partial()
        delivered = await self.node.send_model(peers, "partial", partial)
        received = await self.node.collect("partial", rnd, peers, timeout=None)
        partials = {name: item.state for name, item in received.items() if isinstance(item, ModelIn)}
        scores = await self.score(partials)
        await self.choose(scores)
        # Wait for everyone's choice before training, so that each node knows who chose it and sends
        # them its first cluster round's model.
        await self.node.collect("choices", rnd, peers, timeout=None)
        log.info("%s: lazy influence of %d peers (partial model delivered to %d); chose %d: %s", self.node.name,
                 len(scores), delivered, len(self.chosen or ()), ", ".join(sorted(self.chosen or ())))

    async def join_late(self) -> None:
        """A node that joined after the influence phase: fetch w0 and its peers' partial models, choose."""
        peers = sorted(self.node.live_peers())
        w0 = None
        for peer in peers:
            w0 = await self.node.fetch(peer, "w0")
            if w0 is not None:
                break
        if w0 is None:
            log.warning("%s: no peer could give w0; training alone", self.node.name)
            self.chosen = set()
            return
        self.node.load_state(w0)
        partials = {}
        for peer in peers:
            state = await self.node.fetch(peer, "partial")
            if state is not None:
                partials[peer] = state
        await self.train_partial()  # keeps w0 and this node's partial for later joiners
        scores = await self.score(partials)
        await self.choose(scores)
        log.info("%s: joined late; scored %d partial models, chose %s", self.node.name, len(scores),
                 ", ".join(sorted(self.chosen or ())))

    async def train_partial(self) -> dict[str, torch.Tensor]:
        """This node's partial model: w0 (its current model) trained on a batch of its data. Both are kept for
        peers that join later."""
        w0 = self.node.current_state()
        partial = await self.node.train_copy(w0, self.options.lia_batch, self.options.lia_epochs, self.options.lia_lr)
        self.node.keep({"w0": w0, "partial": partial})
        return partial

    async def score(self, partials: dict[str, dict[str, torch.Tensor]]) -> dict[str, float]:
        """The lazy influence of each peer's partial model on this node's validation split."""
        names = sorted(partials)
        w0 = self.node.kept_model("w0") or self.node.current_state()
        states = [partials[n] for n in names]
        values = await self.node.on_validation(
            lambda model, x_val, y_val, device, task: score_peers(model, w0, states, x_val, y_val, device, task=task))
        return dict(zip(names, values, strict=True))

    async def choose(self, scores: dict[str, float]) -> None:
        """Select peers from scores, remember and announce the choice."""
        chosen = select_peers(scores, self.options.gap, self.options.selection)
        self.chosen = set(chosen)
        self.chosen_scores = {p: scores[p] for p in chosen}
        self.node.record("choice", scores=scores, chosen=sorted(chosen))  # what the report reads
        await self.node.send_note(self.node.live_peers(), "choices", self.chosen_scores)

    async def on_peer_back(self, peer: str) -> None:
        """A peer (re)appeared, e.g. restarted from an older checkpoint: tell it again whom this node chose,
        so it knows to send this node its models."""
        if self.chosen is not None:
            await self.node.send_note([peer], "choices", self.chosen_scores)

    def report(self) -> dict[str, Any]:
        return {"chosen": sorted(self.chosen) if self.chosen is not None else None}

    def state(self) -> dict[str, Any]:
        return {"chosen": sorted(self.chosen) if self.chosen is not None else None,
                "choosers": sorted(self.choosers), "chosen_scores": self.chosen_scores}

    def restore(self, state: dict[str, Any]) -> None:
        chosen = state.get("chosen")
        self.chosen = set(chosen) if chosen is not None else None
        self.choosers = set(state.get("choosers", []))
        self.chosen_scores = dict(state.get("chosen_scores", {}))



class PFedLIAP2PPaper(PFedLIAP2P):
    """pFedLIA-p2p with the paper's selection rule (plain 2-means, the higher group): run beside
    pfedlia-p2p, it shows what the paper's method does and what our rules add."""

    name = "pfedlia-p2p-paper"
    options_type = PaperP2POptions
