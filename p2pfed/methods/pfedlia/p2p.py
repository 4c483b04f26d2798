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
joiners to fetch) and "choices" notes (the peers that are to send it their models, with their influence).

Beyond the paper (``pfedlia-p2p``; ``pfedlia-p2p-paper`` is the paper's, none of this): with 5 to 22
validation samples one influence score is mostly noise, and one wrong peer chosen once drags a node down for
the rest of the run. So the choice keeps learning, from the models the node receives anyway:

- Scores with their uncertainty: a peer is chosen only if its influence is positive beyond its uncertainty
  over the node's validation samples (a one-sided paired t-test at ``confidence``; influence/evidence.py).
- The cluster rounds start from the choice's partial models: the node's model from the mean of its own
  partial model and its chosen peers' (each found to lower w0's loss on its validation split), its local
  track from its own partial, each unless it does worse than w0 on the validation split in the loss and the
  errors both (begin). The paper goes on from w0, a model of the whole mesh's warm-up, and the nodes then
  ran some three rounds behind the Oracle's to the end.
- Each round, on its validation split, the node compares its aggregate with the aggregate without each
  chosen peer; a peer that hurts beyond its uncertainty over ``window`` rounds is dropped. A peer whose one
  model of the round did so is taken back at once: the node averages that round's models again without it
  (a rare sender's one model weighs a lot: at 10 % participation a node that did not train averages only
  the one or two models that came); where no one model did but all of them together did, all are taken
  back. A round its own training broke (one epoch can break a small model), where the round did harm, is
  undone: the node goes back to the model it began the round with.
- A verdict against a peer or the group (a drop, a take-back, a fallback) also needs more errors on the
  validation samples, not only a higher loss: on 5 samples the loss reads a surer model of the same
  answers as the better one, and a model trained alone is surer than an average of models.
- Every ``probe_every`` rounds it watches one peer it has not chosen (a late joiner first, then the one
  looked at longest ago, the best scored first): that peer sends it its models, which the node does not
  average but weighs (its aggregate with the peer's model, against without); a peer that helps beyond its
  uncertainty over ``window`` rounds is chosen (a watch lasts 2·window+1 rounds the peer is drawn to train
  in: it sends only then). So late joiners are chosen by the nodes they help. One peer at a time: at
  most one model more per round, and one forward pass per model weighed.
- Never worse than alone: while it collaborates, the node trains a local track beside (a second model,
  from w0, on its own data only); when its aggregate does worse than the local track beyond uncertainty over
  ``window`` rounds it trained in (and a chosen peer's model came), it falls back to the local track, drops
  its peers (the record says "fallback") and goes on alone, probing as before.
Round r's models are weighed as soon as the node holds their average (``settle``: before the round is
evaluated and kept, the last round's too; in a worker thread, as the influence phase's scoring), and the
verdicts over windows are drawn as round r+1 starts. Any change of the chosen peers
starts every window afresh: a peer's effect is measured against the group it is averaged with.

Also beyond the paper, for large meshes: all pairs cost N² partial models and N² "choices" notes. In a mesh of
more than ``all_pairs_up_to`` members a node scores a sample instead (``sample``, s):
- In the influence phase it fetches the partial models (kept by every node, as for late joiners) of the peers
  a shared draw pairs it with: a pair of nodes is drawn with probability s/N, the same on both sides, so two
  nodes score each other or neither, and so choose each other when alike: clusters are groups of mutual
  choices (report/results.py).
- A paired peer behind this node (it has not trained its partial model yet) is waited for while it moves on,
  by the rounds it says it is at (``fetch_patiently``, ``behind``); one that gives none in the phase is asked
  again each round after.
- It tells only the peers it names (now or before) of its choice. Whom a chosen peer chose is a recommendation
  (friends of friends, likely of the same cluster), and so is the chooser itself: it may not have been drawn
  with this node.
- Each round after the phase it scores up to s more peers, the most recommended first (with none recommended,
  s drawn at random, up to 2·s in all), and chooses again from every score so far (the same w0 and the same
  partial models, so the scores add up to the vector all pairs would give, one part at a time). It stops when
  nothing is recommended and its random draws are spent, or when it has scored 4·s: O(N·s) partial models over
  the mesh, not N². A peer that chose it is scored in any case, so that a choice can be mutual (one made after
  a random draw, which its chooser's draw may not have held).
A peer newly chosen is not waited for in that round: it may send its model before it hears it was chosen.
The warm-up, too, costs N² at that size (every participant sends its model to every node), so there each round's
participants send theirs to WARMUP_AGGREGATORS nodes a shared draw names for the round; each of them averages
what came (in one order: those that received the same models hold the same average) and keeps it, and every
other node fetches it from one of them as its next round starts: O(N) models a round, and every node still
starts the phase from one w0. Whether the mesh is that large each node decides once, as it starts its first
round (a scenario's nodes all start once they have all met), and keeps.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from p2pfed.influence.evidence import Estimate, Window, estimate, paired_differences
from p2pfed.influence.lazy_influence import sample_losses, sample_losses_and_errors, score_peers
from p2pfed.influence.selection import select_peers
from p2pfed.learn.train import state_of, weighted_average
from p2pfed.methods.base import Method, PeerContext, group_average, shared_number, shared_rng
from p2pfed.methods.pfedlia.options import P2POptions, PaperP2POptions
from p2pfed.wire import ModelIn

log = logging.getLogger(__name__)

LOCAL = ""  # the key of the local track's comparison (no peer is named "")
HELD = "=held"  # the key of the comparison with the model held as the round began ("=": in no name)
OWN = "=own"  # the key of its own trained model's comparison with the model held as the round began
SCORED_PER_SAMPLE = 4  # a sampling node scores at most this many times `sample` peers (but its choosers)
RANDOM_PER_SAMPLE = 2  # of which drawn at random after the phase's draw, at most this many times `sample`
RECOMMENDED_KEPT = 1024  # recommendations kept at most (they come in peers' notes): the least named go first
FETCH_RETRY = (0.25, 2.0)  # the first and the longest wait before asking again for a model not yet kept
WARMUP_AGGREGATORS = 3  # a large mesh's warm-up round: the nodes that average its participants' models
# a large mesh's [mesh] introduce_up_to when the scenario leaves it to the method: the K measured at 250 and at
# 1,000 nodes (docs/performance.md)
LARGE_MESH_INTRODUCE = 64


class PFedLIAP2P(Method):
    """Lazy influence, local 2-means peer selection, then FedAvg with the chosen peers, a choice that keeps
    learning (options ``window``, ``probe_every``, ``fallback``)."""

    name = "pfedlia-p2p"
    notes: ClassVar[frozenset[str]] = frozenset({"choices"})

    options_type = P2POptions
    options: P2POptions

    def __init__(self, node: PeerContext, options: P2POptions) -> None:
        super().__init__(node, options)
        self.chosen: set[str] | None = None  # None until the influence phase ran
        self.choosers: set[str] = set()  # peers that chose (or watch) this node: they get its model
        self.scores: dict[str, float] = {}  # every score of the choice, for its records
        self.watched: dict[str, int] = {}  # a probed peer: the round its watch began
        self.looked: dict[str, int] = {}  # every peer scored, probed or dropped: the round it last was
        self.refused: dict[str, int] = {}  # a peer watched and kept out, or dropped: how many times
        self.released: dict[str, int] = {}  # a peer dropped or no longer watched: the round it was
        self.dropped: set[str] = set()  # peers dropped from the choice and not chosen again (its records say)
        self.local: nn.Module | None = None  # the local track, while the node collaborates
        self.windows: dict[str, Window] = {}  # a chosen or watched peer's evidence, and LOCAL's
        # the round's averaging, until settle weighs it: own model, the chosen peers' and watched peers' that
        # arrived, and the model the node held as the round began (what it goes back to when the round did harm)
        self.last: tuple[ModelIn | None, dict[str, ModelIn], dict[str, ModelIn], dict[str, torch.Tensor]] | None = None
        self.began: tuple[int, dict[str, torch.Tensor]] | None = None  # a round it trained in: its model before
        self.scale = 1.0  # w0's mean validation loss: what margin is a share of
        # scoring a sample (a mesh of more than all_pairs_up_to members; see the module's text)
        self.expanding = False  # still scoring more peers, a step each round
        self.estimates: dict[str, Estimate] = {}  # every peer scored, with its bounds
        self.tried: set[str] = set()  # every peer whose partial model was scored
        self.pending: set[str] = set()  # peers asked for their partial model that gave none yet: asked each round
        self.randomly = 0  # peers drawn at random by the search after the phase
        self.recommended: dict[str, int] = {}  # a peer not scored: how many chosen peers named it
        self.added: set[str] = set()  # peers chosen by a probe: kept when the choice is made again
        self.audience: set[str] = set()  # sampling: every peer a choice of this node named (so told since)
        self.since: dict[str, int] = {}  # sampling: a peer newly chosen, the round it was
        self._aggregators: dict[tuple[int, int], list[str]] = {}  # (round, members) -> its warm-up aggregators
        self.is_large: bool | None = None  # a mesh past all_pairs_up_to (None: not decided yet; see large)
        self.alone = False  # fell back to its local track: no search chooses peers again (a probe still may)

    @classmethod
    def introduce_up_to(cls, options: P2POptions, nodes: int) -> int:
        # Past all_pairs_up_to, a node works with its sample, its chosen peers and their choosers, not every live
        # peer; it reaches the rest through known() (a request introduces the peer). Introducing every peer
        # costs N²/2 pings while the mesh forms: at 1,000 nodes LARGE_MESH_INTRODUCE took 0.51 of the wall time,
        # with ARI 1.000 against 0.991 (docs/performance.md, "Lazy introduction at 1,000 nodes")
        return LARGE_MESH_INTRODUCE if options.sample > 0 and nodes > options.all_pairs_up_to else 0

    @property
    def chosen_scores(self) -> dict[str, float]:
        """The chosen peers' influence."""
        return {p: self.scores.get(p, 0.0) for p in sorted(self.chosen or ())}

    def told(self) -> dict[str, float]:
        """What the node's "choices" note says: the peers that are to send it their models (the chosen and the
        watched), with their influence (0 for a peer never scored)."""
        return {p: self.scores.get(p, 0.0) for p in sorted((self.chosen or set()) | set(self.watched))}

    @property
    def sampling(self) -> bool:
        """Whether this node scores a sample (its mesh is large, as it decided when its first round began)."""
        return self.is_large is True

    @property
    def keeps_learning(self) -> bool:
        return self.options.window > 0

    def sources(self, rnd: int) -> set[str]:
        live = set(self.node.live_peers())
        if self.chosen is None:
            if self.large_warmup(rnd) and self.node.name not in self.aggregators(rnd):
                return set()  # its round's average is fetched, not gathered
            return live
        return (self.chosen | set(self.watched)) & live

    def subscribers(self, rnd: int) -> set[str]:
        if self.chosen is None:
            if self.large_warmup(rnd):
                return (set(self.aggregators(rnd)) - {self.node.name}) & self.known()
            return set(self.node.live_peers())
        return self.choosers & set(self.node.live_peers())

    # -- the warm-up of a large mesh (beyond the paper; see the module's text) --------------------------
    def large(self) -> bool:
        """Whether the mesh is past all_pairs_up_to members (and the method samples at that size): decided once, as
        the node starts its first round (a scenario's nodes start once they have all met), and kept, so that no
        node changes its way in the middle of the warm-up. Asked before (a peer's model come early), the members
        known now say, and nothing is kept."""
        if self.is_large is not None:
            return self.is_large
        return self.options.sample > 0 and len(self.node.members()) > self.options.all_pairs_up_to

    def large_warmup(self, rnd: int) -> bool:
        return rnd < self.options.warmup_rounds and self.large()

    def aggregators(self, rnd: int) -> list[str]:
        """The nodes that average warm-up round rnd's models: a shared draw over every member, the same on every
        node that knows the same members (a node's members differ only while the mesh forms)."""
        members = self.node.members()
        key = (rnd, len(members))  # members only grow: their count says whether they changed
        if key not in self._aggregators:
            seed = self.node.seed
            if len(self._aggregators) >= 4:
                self._aggregators.pop(next(iter(self._aggregators)))
            self._aggregators[key] = sorted(members, key=lambda p: shared_number(seed, "warmup", rnd, p))[
                :WARMUP_AGGREGATORS]
        return self._aggregators[key]

    async def fetch_average(self, rnd: int) -> None:
        """Take warm-up round rnd's average from one of its aggregators (asked again while they still gather it,
        for up to a round's timeout); without one, the node goes on with its own model, and says so."""
        kind = f"warmup-{rnd}"
        if self.node.name in self.aggregators(rnd) and self.node.kept_model(kind) is not None:
            return  # it made the average itself
        # each node asks them in an order of its own (one aggregator does not serve everyone), for twice a
        # round's timeout: an aggregator waits up to one for a slow participant before it has the average
        chosen = self.aggregators(rnd)
        start = shared_number(self.node.seed, self.node.name, "warmup", rnd) % len(chosen)
        order = chosen[start:] + chosen[:start]
        got = await self.fetch_patiently(order, kind, 2 * self.node.cfg.round_timeout, first=True)
        if got:
            self.node.load_state(next(iter(got.values())))
        else:
            log.warning("%s: no aggregator of warm-up round %d gave its average (%s); going on with this node's "
                        "own model", self.node.name, rnd, ", ".join(chosen))

    def expected(self, rnd: int) -> set[str]:
        """The sources that take part, but a peer watched (or, sampling, chosen) from this round on: it may have
        sent this round's model before it heard, and is not waited for."""
        return {p for p in super().expected(rnd) if self.watched.get(p) != rnd and self.since.get(p) != rnd}

    def accepts(self, kind: str, sender: str, rnd: int) -> bool:
        """Partial models only in the influence phase (round W, before choosing), from live peers."""
        if kind == "partial":
            return self.chosen is None and rnd == self.options.warmup_rounds and sender in self.node.live_peers()
        # a peer dropped or no longer watched may have sent before it heard: taken (not averaged), not refused
        return super().accepts(kind, sender, rnd) or (kind == "model" and rnd <= self.released.get(sender, -3) + 2)

    def recommend(self, peers: list[str]) -> None:
        """Count peers named by a peer that chose this node, members it knows and has not scored only; past
        RECOMMENDED_KEPT the least named go (a note of made-up names fills nothing for good)."""
        known = set(self.node.members())
        for peer in peers:
            if peer != self.node.name and peer in known and peer not in self.tried and peer not in self.pending:
                self.recommended[peer] = self.recommended.get(peer, 0) + 1
        if len(self.recommended) > RECOMMENDED_KEPT:
            kept = sorted(self.recommended.items(), key=lambda kv: -kv[1])[:RECOMMENDED_KEPT]
            self.recommended = dict(kept)

    def on_note(self, kind: str, sender: str, rnd: int, values: dict[str, float]) -> None:
        """A peer announced its choice ("choices": the peers it chose or watches, with their influence); if it
        named this node, send it this node's models from now on. A choice of a past round still holds."""
        if self.node.name in values:
            self.choosers.add(sender)
            if self.large():  # whom it chose, and itself, are likely of this node's cluster: worth scoring
                self.recommend([sender, *values])
        else:
            self.choosers.discard(sender)

    async def before_round(self, rnd: int) -> None:
        if self.is_large is None:
            self.is_large = self.large()
        if 0 < rnd <= self.options.warmup_rounds and self.chosen is None and self.large_warmup(rnd - 1):
            await self.fetch_average(rnd - 1)
        if rnd < self.options.warmup_rounds:
            return
        if self.chosen is not None:
            if self.keeps_learning:
                await self.review(rnd)
            if self.sampling and not self.alone:
                await self.expand(rnd)
            return
        if rnd > self.options.warmup_rounds:
            await self.join_late()
            return
        if self.sampling:
            await self.sample_phase(rnd)
            return
        peers = set(self.node.live_peers())
        partial = await self.train_partial()
        delivered = await self.node.send_model(peers, "partial", partial)
        received = await self.node.collect("partial", rnd, peers, timeout=None)
        partials = {name: item.state for name, item in received.items() if isinstance(item, ModelIn)}
        scores = await self.score(partials)
        await self.choose(scores)
        await self.begin(partial, partials)
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
        self.expanding = self.sampling
        asked = self.paired() if self.sampling else sorted(peers)
        # together: a paired peer not heard from yet costs its introduction's ping, not one after another
        states = await asyncio.gather(*(self.node.fetch(p, "partial") for p in asked))
        partials = {p: state for p, state in zip(asked, states, strict=True) if state is not None}
        self.answered(asked, partials)
        partial = await self.train_partial()  # keeps w0 and this node's partial for later joiners
        scores = await self.score(partials)
        await self.choose(scores)
        await self.begin(partial, partials)
        log.info("%s: joined late; scored %d partial models, chose %s", self.node.name, len(scores),
                 ", ".join(sorted(self.chosen or ())))

    async def train_partial(self) -> dict[str, torch.Tensor]:
        """This node's partial model: w0 (its current model) trained on a batch of its data. Both are kept for
        peers that join later."""
        w0 = self.node.current_state()
        partial = await self.node.train_copy(w0, self.options.lia_batch, self.options.lia_epochs, self.options.lia_lr)
        self.node.keep({"w0": w0, "partial": partial})
        return partial

    async def score(self, partials: dict[str, dict[str, torch.Tensor]]) -> dict[str, Estimate]:
        """The lazy influence of each peer's partial model on this node's validation split (eq. 1), with its
        bounds at the options' confidence (the mean alone, as the paper scores, at confidence 0)."""
        names = sorted(partials)
        w0 = self.node.kept_model("w0") or self.node.current_state()
        states = [partials[n] for n in names]
        if self.options.confidence <= 0:
            values = await self.node.on_validation(
                lambda model, x_val, y_val, device, task: score_peers(model, w0, states, x_val, y_val, device,
                                                                      task=task))
            return {n: Estimate(v, v, v, 0) for n, v in zip(names, values, strict=True)}
        losses = await self.node.on_validation(
            lambda model, x_val, y_val, device, task: sample_losses(model, [w0, *states], x_val, y_val, device,
                                                                    task))
        self.scale = float(losses[0].mean()) if losses.size else self.scale
        return {n: estimate(paired_differences(losses[0], losses[1 + i]), self.options.confidence)
                for i, n in enumerate(names)}

    async def begin(self, own: dict[str, torch.Tensor], partials: dict[str, dict[str, torch.Tensor]]) -> None:
        """Start the cluster rounds from the partial models of the choice, not from w0: the node's model from
        the mean of its own partial model and its chosen peers' (under our selection rule each one lowered w0's
        loss on its validation split beyond uncertainty; with none chosen, its own partial alone), its local
        track from its own partial model, each unless it does worse than w0 on the validation split, in the
        mean loss and in the errors both (else it keeps w0). Once, at the first choice: peers a sampling node
        chooses later do not change its start.
        Why: a partial model is w0 trained lia_epochs epochs on up to lia_batch samples of its node's data,
        sent and scored anyway, and w0 is a model of the whole mesh's warm-up. On the quickstart (10 seeds,
        every node choosing exactly its true cluster) the nodes started from w0 ran some three rounds behind
        the Oracle's to the end (93.94 % against 96.12 at round 30). The errors, because the loss alone reads
        a model unsure of everything as the better one: on feature-digits-mixed (seed 1) w0 misclassified 5 of
        a node's 9 validation digits and its own partial model 3, at a loss higher by 0.02 (a sure mistake
        costs more than an unsure one); kept on w0 (15 % on its test digits), it ended at 69 %, where training
        alone ended at 92 %. The mean is unweighted: a partial's samples are not known to the node (each is
        trained on up to lia_batch)."""
        if self.options.start == "w0":
            return  # the paper's: every node goes on from w0
        w0 = self.node.current_state()
        mates = [partials[p] for p in sorted(self.chosen or ()) if p in partials]
        start = weighted_average([own, *mates], [1.0] * (len(mates) + 1))

        def judge(model: nn.Module, x_val: torch.Tensor, y_val: torch.Tensor, device: torch.device,
                  task: Any) -> tuple[np.ndarray, np.ndarray]:
            if not len(y_val):
                return np.zeros(0), np.zeros(0)
            losses, errors = sample_losses_and_errors(model, [w0, start, own], x_val, y_val, device, task)
            return losses.mean(axis=1), errors.sum(axis=1)

        losses, errors = await self.node.on_validation(judge)
        if not len(losses):
            return  # no validation split to judge a start by: it keeps w0

        def worse(i: int) -> bool:  # worse than w0 in the loss and in the errors
            return bool(losses[i] > losses[0] and errors[i] > errors[0])

        if not worse(1):
            self.node.load_state(start)
        if self.local is not None and not worse(2):
            self.local.load_state_dict(own)
        log.info("%s: starts from %s (validation loss %.3g, errors %d; w0's %.3g, %d)", self.node.name,
                 "w0" if worse(1) else f"the mean of {len(mates) + 1} partial models", losses[1], errors[1],
                 losses[0], errors[0])
        self.node.record("start", partials=0 if worse(1) else len(mates) + 1, loss=float(losses[1]),
                         errors=int(errors[1]), w0_loss=float(losses[0]), w0_errors=int(errors[0]),
                         local=self.local is not None and not worse(2))

    async def choose(self, scored: dict[str, Estimate]) -> None:
        """Select peers from scores, remember and announce the choice (a choice made again, as a sampling node
        does with more scores, only if it changed)."""
        before = set(self.chosen) if self.chosen is not None else None
        new = set(scored) - set(self.estimates)
        self.estimates = dict(scored)
        scores = {p: e.mean for p, e in scored.items()}
        # A validation split of one sample has no variance to bound a score with: every bound is infinite and no
        # peer would ever be chosen (250 nodes sharing the bundled digits hold 7 samples each, 1 to validate on).
        # The mean alone decides there, as the paper's rule does.
        sure = self.options.confidence > 0 and any(e.samples >= 2 for e in scored.values())
        lower = {p: e.lower for p, e in scored.items()} if sure else None
        # Chosen only if it lowers w0's loss beyond uncertainty by more than margin of what the most helpful peer
        # does: from a w0 barely trained, a model of noise of each tensor's scale lowered it by 0.13 and was
        # chosen by three of its cluster mates on adversaries-digits, where a peer of the node's cluster
        # lowers it by 1.6 to 2.3 (2-means split the helpful from the far negative, not the noise from the
        # mates). A share of the best gain, not of the loss: on next-character prediction a same-language peer
        # lowers it by 0.01 to 0.07 of 2.2, and a share of the loss chose no one. (A probe adds a peer on any
        # gain beyond uncertainty: on a trained aggregate the gains are small.)
        best = max([e.mean for e in scored.values()], default=0.0)
        floor = {p: b - self.options.margin * max(best, 0.0) for p, b in lower.items()} if lower is not None else None
        chosen = select_peers({p: v for p, v in scores.items() if p not in self.dropped}, self.options.gap,
                              self.options.selection, floor)
        self.chosen = set(chosen) | (self.added - self.dropped)
        self.scores = scores
        self.looked.update(dict.fromkeys(new, self.node.round))
        if self.sampling:
            self.since.update(dict.fromkeys(self.chosen - (before or set()), self.node.round))
            if len(self.tried) + len(self.pending) >= SCORED_PER_SAMPLE * self.options.sample:
                self.expanding = False
        # a peer no longer chosen may have sent this round's model before it hears: taken, not refused
        self.released.update(dict.fromkeys((before or set()) - self.chosen, self.node.round))
        if before == self.chosen:
            return
        if before is not None:
            self.windows = {}  # a peer's effect is measured against the group it is averaged with
        self.start_local()
        fields: dict[str, Any] = {"lower": lower} if lower is not None else {}
        fields.update({"dropped": sorted(self.dropped), "why": "sampled"} if before is not None else {})
        self.node.record("choice", scores=scores, chosen=sorted(self.chosen), **fields)  # what the report reads
        await self.announce()

    async def announce(self) -> None:
        """Tell peers whom this node chose (and watches): every live peer, or, sampling, the peers it names now
        or named before (the others never heard they were chosen)."""
        told = self.told()
        if not self.sampling:
            await self.node.send_note(self.node.live_peers(), "choices", told)
            return
        self.audience |= set(told)
        live = set(self.node.live_peers())
        await self.node.send_note(sorted(self.audience & live), "choices", told)

    # -- scoring a sample (a large mesh; beyond the paper) ---------------------------------------------
    def reachable(self) -> set[str]:
        """The peers this node may ask for a model: every member it knows of that is not gone, the live ones and
        those it has not heard from itself (known from gossip, or dead only because it never answered its
        introduction: the request introduces it first). Beyond the paper: at 1,000 nodes on one machine a node's
        table held few of its peers alive while the mesh formed (most of the others declared dead that way, only
        slow to answer), and a sample drawn from the live ones held 3.8 peers, not 16."""
        return {p for p in self.node.members() if p != self.node.name and not self.node.gone(p)}

    def known(self) -> set[str]:
        """The peers this node sends its warm-up models to (a large mesh's aggregators among them) and takes
        recommended peers from: its live peers, or, under lazy introduction ([mesh] introduce_up_to), where it hears
        directly from few of them, every peer reachable (sending or asking introduces it first)."""
        return self.reachable() if self.node.lazy else set(self.node.live_peers())

    def paired(self) -> list[str]:
        """The reachable peers a shared draw pairs this node with for scoring: each pair with probability
        sample / members, the same draw on both sides (they may count the members a little differently)."""
        me, members = self.node.name, max(len(self.node.members()), 1)
        return [p for p in sorted(self.reachable())
                if shared_number(self.node.seed, "lia-pair", *sorted((me, p))) % members < self.options.sample]

    def answered(self, asked: list[str], got: dict[str, dict[str, torch.Tensor]]) -> None:
        """Note who of the peers asked for their partial model gave it (scored) and who did not (asked again each
        round, until it gives it or is gone: at 1,000 nodes on one machine more than half the nodes reached the
        influence phase before their paired peers had trained theirs, and, asked once, those were never scored)."""
        self.tried.update(got)
        self.pending = (self.pending | set(asked)) - self.tried - {self.node.name}

    async def fetch_partials(self, peers: list[str], patience: float, behind: int | None = None
                             ) -> dict[str, dict[str, torch.Tensor]]:
        """The partial models of peers, fetched together; a peer that keeps none yet (it is still training it) is
        asked again, waiting longer each time, for up to patience seconds (behind: see fetch_patiently)."""
        got = await self.fetch_patiently(peers, "partial", patience, behind=behind)
        self.answered(peers, got)
        return got

    async def fetch_patiently(self, peers: list[str], kind: str, patience: float, first: bool = False,
                              behind: int | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """The models of kind the reachable ones of peers keep, asked of all together (first: of one at a time, in
        order, until one gives it); those that keep none yet are asked again, waiting longer each time, for up to
        patience seconds. (Peers are asked while they are not yet known alive too, as a large mesh may still be
        forming, but not once known dead or gone: a node behind the mesh would wait out the patience for peers
        that finished the run. Asked one at a time, one that does not answer is asked again; asked together, one
        that is not alive once asked, its introduction unanswered, is not asked again in this call, so that a peer
        that is not there holds nobody for the patience: a pending peer is asked again the next round.)
        behind (a round): a peer is waited for patience seconds more each time it is heard to have moved on to a
        later round up to behind (its answer "not yet" says its round): a peer on its way is waited for, one stuck
        or gone is not. Beyond the paper: at 1,000 nodes on one machine the nodes reached the influence phase up
        to an hour apart, and more than half of them, having waited a round's timeout, chose from none of their
        sample. Each move counts once, so a peer that says ever later rounds holds the node behind + 1 times the
        patience at most."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        got: dict[str, dict[str, torch.Tensor]] = {}
        until = dict.fromkeys(peers, start + patience)
        seen = {p: self.node.peer_round(p) for p in peers} if behind is not None else {}
        wait, asked_once, moved = FETCH_RETRY[0], False, False
        while True:
            reach = self.reachable()
            missing = [p for p in peers if p not in got and p in reach and (not asked_once or loop.time() <= until[p])]
            asked_once = True
            if first:
                for peer in missing:
                    state = await self.node.fetch(peer, kind)
                    if state is not None:
                        return {peer: state}
            else:
                states = await asyncio.gather(*(self.node.fetch(p, kind) for p in missing))
                got.update({p: s for p, s in zip(missing, states, strict=True) if s is not None})
                live = set(self.node.live_peers())
                until.update({p: -math.inf for p in missing if p not in got and p not in live})
            left = [p for p in missing if p not in got and loop.time() <= until[p]]
            for peer in left if behind is not None else ():
                now = self.node.peer_round(peer)
                if seen[peer] < now <= (behind or 0):  # moved on since: on its way to that round
                    seen[peer], until[peer], moved = now, loop.time() + patience, True
            if not left or loop.time() + wait > max(until[p] for p in left):
                break
            await asyncio.sleep(wait)
            wait = min(2 * wait, FETCH_RETRY[1])
        if moved:
            log.info("%s: waited %.0f s for %s models of peers behind round %s (%d of %d came)", self.node.name,
                     loop.time() - start, kind, behind, len(got), len(peers))
        return got

    async def sample_phase(self, rnd: int) -> None:
        """The influence phase on a sample: train the partial model (kept for peers to fetch), fetch the paired
        peers' partial models, score them, choose, tell the chosen."""
        partial = await self.train_partial()
        sample = self.paired()
        partials = await self.fetch_partials(sample, self.node.cfg.round_timeout, behind=rnd)
        self.expanding = True  # the search goes on each round (expand)
        await self.choose(await self.score(partials))
        await self.begin(partial, partials)
        log.info("%s: lazy influence of %d of %d sampled peers; chose %d: %s", self.node.name, len(partials),
                 len(sample), len(self.chosen or ()), ", ".join(sorted(self.chosen or ())))

    async def expand(self, rnd: int) -> None:
        """One step of a sampling node's search: score the peers that chose it and it has not scored (so a choice
        can be mutual) and the peers asked before that had no partial model then, then, while it searches, up to
        sample peers not scored yet, the most recommended first (a random draw when none is and it has chosen
        nobody, up to RANDOM_PER_SAMPLE·sample peers in all: a chosen peer scores it back and, choosing it, names
        its own choice); choose again from every score."""
        assert self.chosen is not None
        live = set(self.node.live_peers())
        callers = sorted(((self.choosers & live) | (self.pending & self.reachable())) - self.tried)
        step: list[str] = []
        if self.expanding:
            known = self.known()
            fresh = {p: n for p, n in self.recommended.items() if p in known and p not in self.tried
                     and p not in callers}
            step = sorted(fresh, key=lambda p: (-fresh[p], shared_number(self.node.seed, self.node.name, p)))
            room = SCORED_PER_SAMPLE * self.options.sample - len(self.tried) - len(self.pending)
            step = step[:min(self.options.sample, max(room, 0))]
            self.recommended = {p: n for p, n in self.recommended.items()
                                if p not in step and p not in self.tried and p not in self.pending}
            if not step and self.randomly < RANDOM_PER_SAMPLE * self.options.sample:
                # over its live peers, or, lazy, every peer it knows: its live ones are then the few it introduced
                # itself to, and 250 lazy nodes found a cluster split, two of its nodes drawing among others' only
                rest = sorted(known - self.tried - self.pending - {self.node.name})
                rng = shared_rng(self.node.seed, self.node.name, "lia-step", rnd)
                step = [rest[i] for i in sorted(rng.permutation(len(rest))[:self.options.sample])]
                self.randomly += len(step)
        if not step:
            self.expanding = False  # nothing recommended, the random draws spent: the search has run its course
        if not callers and not step:
            return
        partials = await self.fetch_partials(callers + step, 0.0)
        await self.choose({**self.estimates, **await self.score(partials)})
        log.info("%s: round %d: scored %d more peers (%d in all); chose %d%s", self.node.name, rnd, len(partials),
                 len(self.estimates), len(self.chosen), "" if self.expanding else "; search ended")

    # -- the choice that keeps learning (beyond the paper) -------------------------------------------
    def start_local(self) -> None:
        """While it collaborates, a node keeps a local track from its model as it chose (w0, or what it had
        alone); alone, its model is its local track."""
        want = self.options.fallback and bool(self.chosen)
        if want and self.local is None:
            self.local = self.node.new_model(self.node.current_state())
        elif not want:
            self.local = None

    async def train(self, rnd: int) -> float | None:
        if self.chosen is not None and self.keeps_learning:
            self.began = (rnd, self.node.current_state())  # what a round that did harm goes back to (take_back)
        loss = await self.node.fit(self.node.own)
        if self.local is not None:  # (kept only while the node has chosen peers: start_local)
            await self.node.fit(self.local)  # the local track: the same training, on the node's data only
        return loss

    def aggregate(self, rnd: int, own: ModelIn | None, arrived: dict[str, ModelIn]) -> dict[str, torch.Tensor] | None:
        """The average with the chosen peers' models (a watched peer's model is weighed, not averaged). A large
        mesh's warm-up aggregator averages the round's models in the order of their names (every aggregator the
        same, to the bit) and keeps the average for the others to fetch."""
        if self.chosen is None and self.large_warmup(rnd):
            if self.node.name not in self.aggregators(rnd):
                return None  # its model is the round's average, fetched as the next round starts
            average = group_average(None, {**arrived, **({self.node.name: own} if own is not None else {})})
            if average is not None:
                self.node.keep({f"warmup-{rnd}": average})
            return average
        group = {p: m for p, m in arrived.items() if self.chosen is None or p in self.chosen}
        if self.chosen is not None and self.keeps_learning:
            # the model it held as the round began: before its training, or, not trained, before the models came
            began = self.began[1] if own is not None and self.began is not None and self.began[0] == rnd else None
            held = began if own is not None else self.node.current_state() if group else None
            self.last = (own, group, {p: m for p, m in arrived.items() if p in self.watched}, held or {})
        self.began = None
        return group_average(own, group)

    async def settle(self, rnd: int) -> None:
        """Weigh the round's models as the node holds their average, before the round is evaluated and kept: a
        harmful one is taken back in its own round, the last one of a run included (take_back)."""
        if self.last is not None:
            last, self.last = self.last, None
            await self.weigh(*last)

    async def review(self, rnd: int) -> None:
        """Draw the verdicts that are due on the rounds weighed so far, start a probe, announce a change."""
        before = (set(self.chosen or ()), set(self.watched))
        self.verdicts(rnd)
        self.probe(rnd)
        if before != (set(self.chosen or ()), set(self.watched)):
            if before[0] != self.chosen:
                self.windows = {}  # a peer's effect is measured against the group it is averaged with
            else:
                self.windows = {k: w for k, w in self.windows.items() if k in self.chosen or k in self.watched
                                or k == LOCAL}
            self.start_local()
            await self.announce()

    async def weigh(self, own: ModelIn | None, group: dict[str, ModelIn], watched: dict[str, ModelIn],
                    held: dict[str, torch.Tensor]) -> None:
        """Add the round's evidence to the windows, from the node's validation split: for each chosen peer that
        sent, its aggregate without the peer against with it (positive: the peer helps); for each watched peer
        that sent, the aggregate with the peer's model added against without; in a round the node trained, the
        aggregate against the local track; and the aggregate against the model held as the round began (held).
        The models are built and scored in a worker thread, off the event loop.
        A chosen peer's model that did harm in that round alone, beyond uncertainty and with more errors, is
        taken back at once, and so is the whole round when it did harm together (take_back): the verdict on a
        peer still waits for its window."""
        now = self.node.current_state()  # the round's aggregate
        members = {**group, **({"": own} if own is not None else {})}  # "" is no peer's name
        # a host snapshot (state_of), as every other model weighed is: the live tensors of a track that trains on a
        # GPU lie there, and change while the scoring runs in its thread
        # The local track is weighed only in a round the node trained, where both tracks took a step on its data
        # and its aggregate holds its own step. In a round it did not train, its model is only the models that
        # came: at 10 % participation one or two peers' single steps (a step can break a small model: the round's
        # take-back judges that), not what collaborating gives it. On table1-fmnist-pathological (seed 2) 31 nodes
        # gave up their clusters on windows that held such rounds (23 on such rounds only; 8 before their first
        # step since the choice: for w0 itself) and ended 12 points below the rest of their clusters; weighed
        # only in the rounds it trains, 1 did. (At 10 % participation a fallback then takes some 30 rounds.)
        local = state_of(self.local) if self.local is not None and group and own is not None else None

        def judge(model: nn.Module, x_val: torch.Tensor, y_val: torch.Tensor, device: torch.device,
                  task: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
            states = {"": now, **variants(members, sorted(group), watched)}
            # A node that did not train took the models that came, its own left out: without the only one, or
            # without all of them, it keeps the model it held. One that trained weighs the round against the
            # model it began it with: its own training can break its model too.
            for peer in group:
                states.setdefault(f"-{peer}", held)
            if held and (own is not None or len(group) > 1):
                states[HELD] = held
                if own is not None and group:  # (without peers its aggregate is its own model)
                    states[OWN] = own.state
            if local is not None:
                states["local"] = local
            keys = list(states)
            return keys, *sample_losses_and_errors(model, [states[k] for k in keys], x_val, y_val, device, task)

        if not group and not watched and not (own is not None and held):
            return
        keys, losses, errors = await self.node.on_validation(judge)
        row = dict(zip(keys, zip(losses, errors, strict=True), strict=True))
        rounds: dict[str, Window] = {}
        for key, (value, wrong) in row.items():
            if key == "":
                continue
            name = LOCAL if key == "local" else key if key in (HELD, OWN) else key[1:]
            # positive: the peer (the models that came; collaborating) helps; an error difference is 1 where only
            # the model without it (the local track; the aggregate before a watched peer's model is added)
            # misclassifies a sample
            if key == OWN:  # positive: its own training helped (against the model it began the round with)
                diff, fewer = paired_differences(row[HELD][0], value), row[HELD][1] - wrong
            elif key[0] == "-" or key in ("local", HELD):
                diff, fewer = paired_differences(value, row[""][0]), wrong - row[""][1]
            else:
                diff, fewer = paired_differences(row[""][0], value), row[""][1] - wrong
            rounds[name] = Window(1)
            rounds[name].add(diff, fewer)
        counted = self.take_back(own, group, held, rounds)
        for name, one in rounds.items():
            if name not in (HELD, OWN) and (counted is None or name in counted):
                self.windows.setdefault(name, Window(self.options.window)).add(one.rounds[0], one.errors[0])

    def take_back(self, own: ModelIn | None, group: dict[str, ModelIn], held: dict[str, torch.Tensor],
                  rounds: dict[str, Window]) -> set[str] | None:
        """Take back the models of the round that did harm: each chosen peer's that did alone (harmful on the
        round's evidence, at the level shared among the round's tests), or, where none alone did and the round
        did harm as a whole, every model that came (two broken models each look fine beside the other); the
        node averages the rest again (its own model, if no peer's is left; not trained, the model it held).
        Where its own training broke its model (its trained model against the one it began the round with) and
        the round did harm, it goes back to the model it began the round with instead (record "undone").
        Return whose evidence of the round still counts (None: all of it, nothing was taken back). The other
        comparisons were made against an aggregate the node did not keep (without a peer, the harmful model
        weighed more; with a watched one, less): only the evidence against the peers taken back counts, and,
        every model that came given back in a round the node trained, the local track's comparison with the
        group's round as it came (the group did worse than the node alone would have); a round undone, only the
        peers' taken back.
        A rare sender's one model weighs a lot: a node that did not train averages only the models that
        arrived, and at 10 % participation that is one or two. On table1-fmnist-pathological a node that had
        left its cluster for its local track (and was still chosen by it) trained alone into a model that
        misclassified one of its two classes, sent it to the 18 cluster mates that had chosen it, and every
        one of them fell from 98 to 100 % to 50 % in that round; the verdict on the sender needs window
        rounds of its models, and it sends one every ten rounds or so.
        A node's own training breaks its model too (one epoch at lr 0.05 on a few dozen samples): on
        adversaries-fmnist-clean (seed 1) a node trained in the last round from 99 % to 67 %, and the three
        cluster mates that took its model ended at 64 to 68 %. The round is weighed before it is evaluated
        and kept (settle), so the last one is too."""
        # (the level shared among every test of the round: one more for the round as a whole, one for its own model)
        level = corrected(self.options.confidence, len(group) + (HELD in rounds) + (OWN in rounds))
        harmed = sorted(p for p in group if p in rounds and self.harmful(rounds[p].estimate(level)))
        worse = HELD in rounds and self.harmful(rounds[HELD].estimate(level))  # the round did harm as a whole
        # its own training broke its model (without peers, its own model is the round's)
        broke = own is not None and HELD in rounds and self.harmful(rounds[OWN if group else HELD].estimate(level))
        undone = broke and (worse or bool(harmed))
        if not undone and not harmed and worse:
            harmed = sorted(group)  # the models that came did harm together (each looks fine beside the other)
        if not undone and not harmed:
            return None
        rest = {p: m for p, m in group.items() if p not in harmed}
        # (no peer's model left: its own, if it trained; else the model it held)
        self.node.load_state(held if undone else group_average(own, rest) or (own.state if own is not None else held))
        for peer in harmed:
            e = rounds[peer].estimate(level)
            log.info("%s: round %d: took back %s's model of the round (effect on validation loss %+.3g, bounds "
                     "%+.3g .. %+.3g; accuracy %+.2f)", self.node.name, self.node.round, peer, e.mean, e.lower,
                     e.upper, e.accuracy or 0.0)
            self.node.record("peer", peer=peer, verdict="taken back", gain=e.mean, lower=e.lower, upper=e.upper)
        if undone:
            e = rounds[OWN if group else HELD].estimate(level)
            log.info("%s: round %d: its own training did harm (effect on validation loss %+.3g, bounds %+.3g .. "
                     "%+.3g; accuracy %+.2f): back to the model it began the round with", self.node.name,
                     self.node.round, e.mean, e.lower, e.upper, e.accuracy or 0.0)
            self.node.record("undone", gain=e.mean, lower=e.lower, upper=e.upper,
                             **({"accuracy": e.accuracy} if e.accuracy is not None else {}))
            return set(harmed)  # the others' evidence was weighed beside a broken model of its own
        # every model that came given back: the local track's comparison (in a round it trained) was with the
        # group's round as it came
        return set(harmed) | ({LOCAL} if not rest else set())

    def verdicts(self, rnd: int) -> None:
        """Drop the chosen peers that hurt; fall back to the local track when collaborating does worse than it
        (or, alone after the drops, when it did worse on average); choose a watched peer that helps, or stop
        watching it. Drops come first: a group rid of its harmful peer is judged again before it is given up."""
        assert self.chosen is not None
        hurting = self.drop(rnd, {p: self.windows.pop(p) for p in sorted(self.chosen)
                                  if p in self.windows and self.windows[p].full})
        collab = self.windows.get(LOCAL)
        if self.local is not None and collab is not None and len(collab):
            e = collab.estimate(self.options.confidence)
            if not hurting and collab.full and self.harmful(e):
                # Collaborating did worse. A chosen peer's window fills only with the rounds it sends in, and may not
                # be full yet: a chosen peer whose evidence so far shows it hurts is dropped first, and the group rid
                # of it judged again. Seen on adversaries-digits: a node gave up its two good peers with the noise
                # model, one round short of dropping it.
                hurting = self.drop(rnd, {p: w for p, w in sorted(self.windows.items()) if p in self.chosen})
                if not hurting:
                    self.fall_back(rnd, sorted(self.chosen), e)
            if hurting and not self.chosen and e.mean < 0 and (e.accuracy is None or e.accuracy < 0):
                self.fall_back(rnd, sorted(hurting), e)  # the drops left it alone, and alone did better
            elif collab.full and LOCAL in self.windows:
                del self.windows[LOCAL]
        live = set(self.node.live_peers())
        for peer, since in sorted(self.watched.items()):
            w = self.windows.get(peer)
            if w is not None and w.full:
                e = w.estimate(self.options.confidence)
                del self.watched[peer]
                self.looked[peer] = rnd
                if e.helps:
                    self.chosen.add(peer)
                    self.added.add(peer)
                    self.refused.pop(peer, None)
                else:
                    self.refused[peer] = self.refused.get(peer, 0) + 1
                self.note_change(rnd, "added" if e.helps else "kept out", peer, e)
            elif peer not in live or self.due(peer, since, rnd) > 2 * self.options.window + 1:
                del self.watched[peer]  # it left, or sent too few models to judge: look at another
                self.looked[peer] = rnd
                self.refused[peer] = self.refused.get(peer, 0) + 1
                self.note_change(rnd, "kept out", peer, None)

    def due(self, peer: str, since: int, rnd: int) -> int:
        """The rounds from since to before rnd in which peer was drawn to train: a watched peer sends its model
        only then. At 10 % participation seven rounds held less than one model, and almost every probe of
        table1-fmnist-pathological ended "kept out" for want of models (a node that fell back stayed alone)."""
        return sum(1 for r in range(since, rnd) if self.takes_part(r, peer))

    def drop(self, rnd: int, evidence: dict[str, Window]) -> dict[str, Estimate]:
        """Drop the chosen peers whose evidence shows they hurt; return them. They are tested together, at a
        level shared among them (Bonferroni): a group of k alike peers would otherwise lose one to chance every
        few windows. (A chosen peer is tested once per window of rounds: its windows do not overlap.)"""
        assert self.chosen is not None
        level = corrected(self.options.confidence, len(evidence))
        hurting = {p: e for p, w in evidence.items() if self.harmful(e := w.estimate(level))}
        for peer, e in hurting.items():
            self.chosen.discard(peer)
            self.added.discard(peer)
            # probed again late (a peer kept out once waits twice the probes' interval), after peers never looked at
            self.looked[peer] = rnd
            self.refused[peer] = self.refused.get(peer, 0) + 1
            self.note_change(rnd, "dropped", peer, e)
        return hurting

    def harmful(self, e: Estimate) -> bool:
        """Hurts beyond its uncertainty, by more than margin of w0's validation loss (a scale fixed for the run:
        the losses themselves shrink as the models learn, and a share of them would shrink too), and
        misclassifies more of the validation samples over the window. A same-cluster peer's model, a little
        less sure than the others, raised the loss by 0.03 to 0.05 on feature-digits; a peer of another
        rotation by 0.17 to 3.9; a node's local track beat its cluster's average by 0.03 under label skew,
        where the average was the more accurate.
        The errors, because the loss alone, on 5 validation samples, rewards sureness: on
        table1-fmnist-pathological (5 validation samples a node) a node's local track, trained alone on its
        2 or 3 classes, was surer of the same answers than its cluster's average (loss lower by 0.15 to 0.95,
        beyond the t bound), and a quarter of the nodes gave up their cluster for it and ended 2.6 points
        below their cluster mates, at a higher loss on their test split too: the rare sample a lone model
        gets badly wrong is what the mean loss over a population weighs, and 5 samples seldom hold one.
        A peer or a group that makes no more errors is kept: averaging makes a model less sure by itself."""
        return (e.hurts and e.mean < -self.options.margin * self.scale
                and (e.accuracy is None or e.accuracy < 0))

    def fall_back(self, rnd: int, dropped: list[str], collab: Estimate) -> None:
        """Collaborating did worse than training alone: take the local track and go on alone."""
        assert self.local is not None and self.chosen is not None
        self.node.load_state(self.local.state_dict())
        self.chosen.clear()
        self.added.clear()
        self.expanding, self.alone = False, True  # alone now; probes may still find a peer that helps
        self.released.update(dict.fromkeys(dropped, rnd))
        self.dropped.update(dropped)
        log.warning("%s: round %d: averaging with %s did worse than training alone (validation loss %+.3g, upper "
                    "bound %+.3g; accuracy %+.2f); falling back to the local track", self.node.name, rnd,
                    ", ".join(dropped), -collab.mean, -collab.lower, collab.accuracy or 0.0)
        self.node.record("fallback", dropped=dropped, gain=collab.mean, bound=collab.upper,
                         **({"accuracy": collab.accuracy} if collab.accuracy is not None else {}))
        self.note_change(rnd, "fallback", None, collab)

    def note_change(self, rnd: int, what: str, peer: str | None, e: Estimate | None) -> None:
        """Log and record a change of the choice (a "choice" record too, with the peers dropped from it: the report
        and the dashboard read the last one)."""
        if peer is not None and what != "added":
            self.released[peer] = rnd
        if peer is not None and what == "dropped":
            self.dropped.add(peer)
        elif peer is not None and what == "added":
            self.dropped.discard(peer)
        if peer is not None:
            log.info("%s: round %d: %s %s (effect on validation loss %s)", self.node.name, rnd, what, peer,
                     f"{e.mean:+.3g}, bounds {e.lower:+.3g} .. {e.upper:+.3g}" if e is not None else "unknown")
            self.node.record("peer", peer=peer, verdict=what, **({"gain": e.mean, "lower": e.lower,
                                                                  "upper": e.upper} if e is not None else {}))
        if what != "kept out":  # the choice changed
            self.node.record("choice", scores=self.scores, chosen=sorted(self.chosen or ()),
                             dropped=sorted(self.dropped), why=what)

    def probe(self, rnd: int) -> None:
        """Every probe_every rounds after the phase, watch one live peer not chosen: one never looked at (a
        late joiner) first, then the one looked at longest ago, of those the one that scored best in the
        influence phase (a bandit starts from what it knows: a node that fell back probes the peers it gave up,
        and those 2-means left out, before the rest), ties broken by a draw of the node's own."""
        since = rnd - self.options.warmup_rounds
        if not self.options.probe_every or self.watched or since <= 0 or since % self.options.probe_every:
            return
        me = self.node.name
        # a peer kept out k times waits probe_every·2^k rounds before it is looked at again (a bandit's back-off:
        # the bytes a node spends on peers that do not help shrink as the run goes on)
        candidates = [p for p in self.node.live_peers() if p not in (self.chosen or ()) and p != me
                      and rnd - self.looked.get(p, -10**9) >= self.options.probe_every * 2 ** self.refused.get(p, 0)]
        if not candidates:
            return
        peer = min(candidates, key=lambda p: (self.looked.get(p, -1), -self.scores.get(p, 0.0),
                                              shared_number(self.node.seed, me, p, rnd)))
        self.watched[peer] = rnd
        self.looked[peer] = rnd
        log.info("%s: round %d: watching %s, a peer it has not chosen", self.node.name, rnd, peer)
        self.node.record("peer", peer=peer, verdict="watched")

    async def on_peer_back(self, peer: str) -> None:
        """A peer (re)appeared, e.g. restarted from an older checkpoint: tell it again whom this node chose,
        so it knows to send this node its models."""
        if self.chosen is not None:
            await self.node.send_note([peer], "choices", self.told())

    def report(self) -> dict[str, Any]:
        return {"chosen": sorted(self.chosen) if self.chosen is not None else None}

    def state(self) -> dict[str, Any]:
        """What a restart keeps: the choice and who chose this node; not the windows of evidence nor the local
        track, which start afresh (a verdict then comes window rounds of evidence later)."""
        return {"chosen": sorted(self.chosen) if self.chosen is not None else None,
                "choosers": sorted(self.choosers), "chosen_scores": self.chosen_scores,
                "watched": dict(self.watched), "scores": self.scores, "looked": dict(self.looked),
                "refused": dict(self.refused), "scale": self.scale, "dropped": sorted(self.dropped),
                "expanding": self.expanding, "tried": sorted(self.tried), "pending": sorted(self.pending),
                "randomly": self.randomly,
                "estimates": {p: [e.mean, e.lower, e.upper, e.samples] for p, e in self.estimates.items()},
                "added": sorted(self.added), "audience": sorted(self.audience),
                "recommended": dict(self.recommended), "since": dict(self.since), "alone": self.alone,
                # (said only of a large mesh: a state that changes as the first round starts is a decision, and the
                # round loop checkpoints it; a mesh of all pairs decides nothing there)
                **({"large": True} if self.is_large else {})}

    def restore(self, state: dict[str, Any]) -> None:
        chosen = state.get("chosen")
        self.chosen = set(chosen) if chosen is not None else None
        self.choosers = set(state.get("choosers", []))
        self.watched = {str(p): int(r) for p, r in state.get("watched", {}).items()}
        # a checkpoint written before the choice kept learning has only the chosen peers' scores
        self.scores = dict(state.get("scores", state.get("chosen_scores", {})))
        self.looked = {str(p): int(r) for p, r in state.get("looked", {}).items()}
        self.refused = {str(p): int(n) for p, n in state.get("refused", {}).items()}
        self.scale = float(state.get("scale", 1.0))
        self.dropped = {str(p) for p in state.get("dropped", [])}
        self.expanding = bool(state.get("expanding", False))
        self.tried = {str(p) for p in state.get("tried", [])}
        self.pending = {str(p) for p in state.get("pending", [])}
        self.randomly = int(state.get("randomly", 0))
        self.estimates = {str(p): Estimate(float(m), float(lo), float(hi), int(n))
                          for p, (m, lo, hi, n) in state.get("estimates", {}).items()}
        self.added = {str(p) for p in state.get("added", [])}
        self.audience = {str(p) for p in state.get("audience", [])}
        self.recommended = {str(p): int(n) for p, n in state.get("recommended", {}).items()}
        self.since = {str(p): int(r) for p, r in state.get("since", {}).items()}
        self.is_large = True if state.get("large") else None
        self.alone = bool(state.get("alone", False))
        if self.chosen is not None:
            self.start_local()


def corrected(confidence: float, tests: int) -> float:
    """The level of each of tests tests run together, so that all of them together hold confidence."""
    return 1 - (1 - confidence) / tests if confidence > 0 and tests > 1 else confidence


def variants(members: dict[str, ModelIn], without: list[str], added: dict[str, ModelIn]
             ) -> dict[str, dict[str, torch.Tensor]]:
    """The sample-weighted average of members without each of ``without`` ("-NAME") and with each of ``added``
    ("+NAME"), from one weighted sum: one pass over the models, not one average per variant. (Integer buffers
    take the first member's, as weighted_average does; a variant with no weight left is left out.)"""
    if not members:
        return {f"+{p}": m.state for p, m in added.items()}
    total = float(sum(m.samples for m in members.values()))
    first = next(iter(members.values())).state
    floats = [k for k, v in first.items() if v.is_floating_point()]
    summed = {k: sum(m.state[k].to(torch.float32) * float(m.samples) for m in members.values()) for k in floats}

    def average(change: float, sign: float, model: ModelIn) -> dict[str, torch.Tensor]:
        out = {k: v.clone() for k, v in first.items() if k not in summed}
        for k, acc in summed.items():
            moved = acc + sign * model.state[k].to(torch.float32) * float(model.samples)
            out[k] = (moved / change).to(first[k].dtype)
        return out

    result = {f"-{p}": average(total - members[p].samples, -1.0, members[p]) for p in without
              if total - members[p].samples > 0}
    result.update({f"+{p}": average(total + m.samples, 1.0, m) for p, m in sorted(added.items())})
    return result


class PFedLIAP2PPaper(PFedLIAP2P):
    """pFedLIA-p2p with the paper's selection rule (plain 2-means, the higher group), chosen once: run beside
    pfedlia-p2p, it shows what the paper's method does and what our rules add."""

    name = "pfedlia-p2p-paper"
    options_type = PaperP2POptions
