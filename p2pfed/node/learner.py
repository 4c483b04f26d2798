"""A learning node: its shard, its model, and the round loop that a method steers.

One round, top to bottom (``run_round``), each step the method's (methods/base.py): its pre-round work →
its local training if this node takes part → its outgoing model to its subscribers if it sends → collect its expected
sources' models until they are all in (dead peers excused) or the deadline passes → its aggregate of them →
its settling of that model → evaluate → record → checkpoint.
Training, scoring and evaluation run in worker threads; the event loop keeps answering heartbeats.

What peers say is checked before it is believed: a model is taken only if its method expects that kind
from that sender for that round (``Method.accepts``), for a round from the current one to ``AHEAD``
rounds ahead, once per sender (a second copy is acknowledged and logged, never kept, and never a reason to
refuse the sender's own); and a node skips rounds to catch up only to a round that a quorum of the peers
it averages with report and that at least two members with distinct keys have reached (one member, forged
or not, can claim any round), never past the scenario's last round, and records the skip.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from p2pfed.learn.checkpoint import SUFFIX, load_own, refuse_old, save_atomic
from p2pfed.learn.train import describe_device, evaluate
from p2pfed.methods import make_method
from p2pfed.methods.central import participates
from p2pfed.net.endpoint import Endpoint
from p2pfed.net.membership import ALIVE, DEAD, JOINING, LEFT, SUSPECT, Change
from p2pfed.net.throttle import remember
from p2pfed.net.transport import DeliveryError, Refusal
from p2pfed.net.waits import first_of
from p2pfed.node.conduct import Conduct
from p2pfed.node.local import LocalNode, NodeData
from p2pfed.scenario.config import Scenario
from p2pfed.wire import Message, ModelIn, NoteIn, TryLater, WireError, check_tensors
from p2pfed.wire.messages import cut

log = logging.getLogger(__name__)

# How far ahead of this node's round a peer's model may be, and be kept for later: a peer that does not
# wait for this node (it did not choose it) runs ahead; beyond this, this node catches up instead.
AHEAD = 8
WAIT_TOLD_EVERY = 10.0  # seconds between "waiting for peers" lines while a node waits to start
START_WAIT = 120.0  # seconds a node waits, by default, for the peers it expects before its first round
START_PER_PEER = 1.0  # seconds a node waits, at most, for each peer it expects before its first round
# seconds between counts of the peers heard while a node waits to start, for each 100 it expects (a count reads
# the whole table: 250 nodes of a 1,000-node mesh counting every 0.1 s spent a fifth of their process on it)
START_POLL_PER_100 = 0.1
# Under lazy introduction a node waiting to know the mesh asks a bootstrap for its table this often (a second more
# for each 50 peers it waits for: at 1,000, a bootstrap answers some 50 tables of 1,000 members a second)
TABLE_ASK_EVERY = 5.0
TABLE_ASK_PER_PEER = 0.02
MAX_SAID_ROUNDS = 4096  # peers whose "not yet" round a node keeps (the most recently heard; a table holds 1,024)
NAMES_SHOWN = 6  # peers named in a round's line (the rest counted)


def names(peers: dict[str, Any] | set[str]) -> str:
    """Up to NAMES_SHOWN of peers' names, sorted, and how many more."""
    shown = sorted(peers)[:NAMES_SHOWN]
    more = len(peers) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


class LearningNode(LocalNode):
    """One node of a scenario: trains its shard and exchanges models through its endpoint."""

    def __init__(self, scenario: Scenario, given: NodeData, method: str, endpoint: Endpoint, out_dir: Path,
                 state_dir: Path | None = None, *, conduct: Conduct | None = None) -> None:
        super().__init__(scenario, given, method, endpoint, out_dir, state_dir, conduct=conduct)
        self.method = make_method(method, self, scenario)
        self.inbox: dict[tuple[str, int], dict[str, ModelIn | NoteIn]] = {}
        self.kept: dict[str, dict[str, torch.Tensor]] = {}
        self.known = {self.name}  # every learning member it has known of (members())
        self.arrivals = asyncio.Event()
        # the round each peer said it was at as it answered "not yet" to a fetch (peer_round)
        self.said_rounds: OrderedDict[str, int] = OrderedDict()
        self.send_delay = 0.0
        self.out_dir = out_dir
        endpoint.serve({"model": self._on_model, "request": self._on_request, "note": self._on_note},
                       self._on_peer_change)
        self.background: set[asyncio.Task[None]] = set()

    # -- what peer-to-peer methods may use besides what every node offers (methods/base.py: PeerContext) ----
    def live_peers(self) -> list[str]:
        """Learning peers (not the bootstrap) that are alive or suspect."""
        return self.endpoint.peers.live_names("node")

    @property
    def lazy(self) -> bool:
        return self.endpoint.lazy

    def members(self) -> list[str]:
        self.known.update(p.name for p in self.endpoint.peers.peers.values() if p.role == "node")
        return sorted(self.known)

    def gone(self, name: str) -> bool:
        peer = self.endpoint.peers.peers.get(name)
        if peer is None:  # met once, then forgotten by the table (dead or gone long enough), or never met
            return name in self.known and name != self.name
        # dead only because it never answered its introduction: a request introduces it again (Endpoint.introduces)
        return peer.state in (DEAD, LEFT) and not self.endpoint.introduces(peer)

    def peer_round(self, name: str) -> int:
        peer = self.endpoint.peers.peers.get(name)
        return max(peer.round if peer is not None else 0, self.said_rounds.get(name, 0))

    def drawn(self, name: str, rnd: int) -> bool:
        return participates(self.scenario.seed, name, rnd, self.cfg.participation)

    def keep(self, models: dict[str, dict[str, torch.Tensor]]) -> None:
        """Keep models by kind, to give any peer that requests that kind (a late joiner); written at once with
        the checkpoint's kept file, so a restarted node still has them."""
        self.kept.update(models)
        save_atomic(self.kept, self.kept_path)

    @property
    def kept_path(self) -> Path:
        """The file of the models kept for peers, beside the checkpoint (n01.kept.safetensors)."""
        return self.checkpoint_path.with_name(self.name + ".kept" + SUFFIX)

    def kept_model(self, kind: str) -> dict[str, torch.Tensor] | None:
        """A model this node keeps, None if none of that kind."""
        return self.kept.get(kind)

    def _outgoing(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A model as it leaves this node, sent or served (through its conduct: a scripted member's may not
        be the model it has)."""
        return self.conduct.outgoing(state, self.round_seed)

    async def send_model(self, to: set[str], kind: str, state: dict[str, torch.Tensor],
                         meta: dict[str, Any] | None = None) -> int:
        if self.send_delay:
            await asyncio.sleep(self.send_delay)  # a scripted slow link
        state = self._outgoing(state)
        body = {"kind": kind, "samples": self.samples, "meta": meta or {}}

        async def one(peer: str) -> bool:
            try:
                await self.endpoint.request(peer, self.endpoint.message("model", body, state),
                                            self.cfg.round_timeout)
                return True
            except DeliveryError as exc:
                log.warning("%s: round %d: %s to %s not delivered: %s", self.name, self.round, kind, peer, exc)
                return False

        results = await asyncio.gather(*(one(p) for p in sorted(to)))
        return sum(results)

    async def collect(self, kind: str, rnd: int, expected: set[str], timeout: float | None
                      ) -> dict[str, ModelIn | NoteIn]:
        deadline = time.monotonic() + (timeout or self.cfg.round_timeout)
        while True:
            got = self.inbox.get((kind, rnd), {})
            # A peer already past this round has sent this node what it had for it (a sender moves on only
            # once its sends are acknowledged): what has not come will not (e.g. it went to this node's
            # process before a restart). Waiting for it would only hold both sides one round apart.
            moved_on = {p.name for p in self.endpoint.peers.peers.values() if p.round > rnd}
            waiting = (expected - set(got)) & set(self.live_peers()) - moved_on
            if not waiting or time.monotonic() >= deadline:
                break
            # (rounds_moved: a peer past the round leaves nothing more to wait for from it; its heartbeat says so)
            await first_of(self.arrivals, self.endpoint.changed, self.endpoint.rounds_moved,
                           timeout=max(0.0, deadline - time.monotonic()))
        if waiting:
            log.warning("%s: round %d: no %s from %s by the deadline; going on without", self.name, rnd, kind,
                        names(waiting))
        return dict(self.inbox.pop((kind, rnd), {}))

    async def fetch(self, peer: str, kind: str) -> dict[str, torch.Tensor] | None:
        try:
            reply = await self.endpoint.request(peer, self.endpoint.message("request", {"kind": kind, "meta": {}}),
                                                self.cfg.round_timeout)
        except DeliveryError as exc:
            if isinstance(exc, Refusal) and exc.retry:  # "not yet", from the peer itself: it said its round
                remember(self.said_rounds, peer, max(exc.round, self.said_rounds.get(peer, 0)), MAX_SAID_ROUNDS)
            log.info("%s: %s has no %s for us: %s", self.name, peer, kind, exc)
            return None
        if reply.type != "model":
            return None
        check_tensors(reply.tensors, self.reference)
        return reply.tensors  # views of the received frames (kept alive by the tensors); never written to

    def _on_peer_change(self, change: Change) -> None:
        """Let the method react to a learning peer that (re)appeared (method.on_peer_back)."""
        peer = self.endpoint.peers.peers.get(change.name)
        if (peer is None or peer.role != "node" or change.new not in (ALIVE, "rejoined")
                or change.old in (ALIVE, SUSPECT)):
            return  # only a learning peer that (re)appeared: not the bootstrap, not a coordinator
        task = asyncio.get_running_loop().create_task(self.method.on_peer_back(change.name))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def send_note(self, to: list[str], kind: str, values: dict[str, float]) -> int:
        """Send a note of kind (names and their values, no tensors) to peers, acknowledged; return how many
        acknowledged it."""
        names = sorted(values)
        body = {"kind": kind, "names": names, "values": [values[n] for n in names], "meta": {}}

        async def one(peer: str) -> bool:
            try:
                await self.endpoint.request(peer, self.endpoint.message("note", body), self.cfg.round_timeout)
                return True
            except DeliveryError as exc:
                log.warning("%s: %s not delivered to %s: %s", self.name, kind, peer, exc)
                return False

        return sum(await asyncio.gather(*(one(p) for p in to)))

    # -- handlers (every received message is validated before it is used) ------------------------
    async def _on_model(self, msg: Message) -> Message | None:
        kind = msg.body["kind"]
        if msg.round < self.round:
            return None  # a straggler's model of a round this node has finished: of no use any more
        self._check_expected(msg, kind)
        check_tensors(msg.tensors, self.reference)
        if msg.body["samples"] <= 0:
            raise WireError("a model needs a positive sample count")
        if msg.sender in self.inbox.get((kind, msg.round), {}):
            # The sender's key was checked (net/endpoint.py): this is its own second copy (a resend after a lost
            # acknowledgement, or a fault of its own). Keeping the first and saying yes means no copy, however
            # it came, can make the sender's model be refused.
            self.endpoint.complaints.info(f"again:{msg.sender}", "%s: %s sent its %s of round %d again; kept the "
                                          "first", self.name, msg.sender, cut(kind, 40), msg.round)
            return None
        # The tensors are read-only views of the received frames (no copy): averaging and load_state_dict
        # read them, nothing writes to them.
        self.inbox.setdefault((kind, msg.round), {})[msg.sender] = ModelIn(msg.sender, msg.tensors, msg.body["samples"])
        self.arrivals.set()
        self.arrivals = asyncio.Event()
        return None

    def _check_window(self, rnd: int, what: str) -> None:
        """Refuse a round past current + AHEAD: a forged or far-future message must not fill the inbox."""
        if rnd > self.round + AHEAD:
            raise WireError(f"{what} beyond this node's rounds {self.round}..{self.round + AHEAD}")

    def _check_expected(self, msg: Message, kind: str) -> None:
        """Refuse what this node's method does not expect: the kind from this sender for this round, or a round
        past current + AHEAD."""
        self._check_window(msg.round, f"{kind} for round {msg.round} is")
        if not self.method.accepts(kind, msg.sender, msg.round):
            raise WireError(f"{self.name} does not expect a {cut(kind, 40)} from {msg.sender} in round {msg.round}")

    async def _on_request(self, msg: Message) -> Message | None:
        kind = msg.body["kind"]
        state = self.kept.get(kind)
        if state is None:  # not yet, perhaps: a peer scoring a sample asks before this node trained its partial
            raise TryLater(f"{self.name} keeps no {kind} model", quiet=True, round=self.round)
        return self.endpoint.message("model", {"kind": kind, "samples": self.samples, "meta": {}},
                                     self._outgoing(state))

    async def _on_note(self, msg: Message) -> Message | None:
        kind, names, values = msg.body["kind"], msg.body["names"], msg.body["values"]
        if kind not in self.method.notes:
            raise WireError(f"{self.name} takes no {cut(kind, 40)} note")
        if len(names) != len(values):
            raise WireError(f"{kind}: names and values differ in length")
        peer = self.endpoint.peers.peers.get(msg.sender)
        if peer is None or peer.role != "node":
            raise WireError(f"{msg.sender} is not a learning peer {self.name} knows")
        # A note of another round may still matter (a late joiner's choice of peers, or a restarted node's
        # announced again; a peer far ahead telling a newcomer or a restarted node whom it chose): the method
        # takes it; only the inbox, which serves rounds still to be collected (up to AHEAD), skips it.
        note = NoteIn(msg.sender, dict(zip(names, values, strict=True)))
        self.method.on_note(kind, msg.sender, msg.round, note.values)
        if self.round <= msg.round <= self.round + AHEAD:
            self.inbox.setdefault((kind, msg.round), {})[msg.sender] = note
        self.arrivals.set()
        self.arrivals = asyncio.Event()
        return None

    # -- the round loop --------------------------------------------------------------------------
    async def run(self, start_round: int = 0, wait_for_peers: int = 0, start_timeout: float | None = None) -> None:
        """Run rounds start_round .. rounds−1 (resuming from a checkpoint if there is one)."""
        resumed = self.restore()
        if resumed is not None:
            start_round = max(start_round, resumed + 1)
        # Peers may send this round's models while this node waits to start: take them.
        self.round = start_round
        # By default 120 s, or, for a mesh of many members, which takes longer to form (one process's 150 took a
        # minute, benchmarks/membership.py), a second a peer awaited.
        if start_timeout is None:
            start_timeout = max(START_WAIT, START_PER_PEER * wait_for_peers)
        deadline = time.monotonic() + start_timeout
        # A restarted node does not wait for the run to start: the others have (some may have finished). Under lazy
        # introduction ([mesh] introduce_up_to) a node hears directly from about that many peers, not from all it
        # expects: it waits to know of them all, heard from or heard of (what a method decides at its start, e.g.
        # a large mesh's warm-up aggregators, is drawn over the members known: every node must know the same).
        told = asked = 0.0
        every = max(TABLE_ASK_EVERY, TABLE_ASK_PER_PEER * wait_for_peers)  # (between asks for a bootstrap's table)
        while resumed is None and self.peers_seen() < wait_for_peers and time.monotonic() < deadline:
            if self.endpoint.lazy and time.monotonic() - asked > every:
                asked = time.monotonic()
                await self.endpoint.ask_table()
                continue
            if time.monotonic() - told > WAIT_TOLD_EVERY:
                told = time.monotonic()
                log.info("%s: waiting for %d more peers to start (%d of %d heard; %.0f s left)", self.name,
                         wait_for_peers - self.peers_seen(), self.peers_seen(), wait_for_peers, deadline - told)
            await asyncio.sleep(START_POLL_PER_100 * max(1.0, wait_for_peers / 100))
        others = self.endpoint.other_recipes
        if resumed is None and self.peers_seen() < wait_for_peers and others:
            # the peers it waited for came, with another recipe: a mistake to say, not a run alone to start
            raise ValueError(f"{self.name}: waited {start_timeout:.0f} s for {wait_for_peers} peers of its recipe "
                             f"{self.endpoint.recipe} and heard {self.peers_seen()}; these train another: "
                             + ", ".join(f"{name} (recipe {recipe})" for name, recipe in others.items())
                             + ": start every node with the same scenario or recipe file and --method")
        # Late: told so (a scripted join, a restart), or started by hand into a mesh whose learning members
        # report rounds its first catch-up would skip to (two or more ahead; it is then recorded as a skip).
        late = start_round > 0 or (resumed is None and any(
            p.role == "node" and p.round >= 2 for p in self.endpoint.peers.peers.values()))
        if late:
            # A late (or restarted) node first hears from the members its join introduced to it (those that
            # have left since fall silent and are declared dead within a few heartbeats; under lazy introduction,
            # those it introduces itself to now).
            lazy, introducing = self.endpoint.lazy, self.endpoint.introducing_to
            while time.monotonic() < deadline and any(p.state == JOINING and (not lazy or introducing(p))
                                                      for p in self.endpoint.peers.peers.values()):
                await asyncio.sleep(0.1)
        rnd = start_round
        if start_round > 0 and resumed is None:  # a late joiner starts at the mesh's round (not a skip)
            rnd = max(start_round, min(self.mesh_round(start_round), self.scenario.rounds - 1))
        while rnd < self.scenario.rounds:
            rnd = await self.run_round(self.catch_up(rnd))
            rnd += 1
        self.record("final", **self.final_metrics())
        # Finished: past the last round, as its heartbeats now say. A peer that chose it late waits for no
        # model of it (collect: a peer past the round has sent what it had), where, in a process of several
        # nodes that all leave together, it waited out the round timeout.
        self.round = self.scenario.rounds

    def peers_seen(self) -> int:
        """Learning peers this node has heard from directly (even if they have since finished and left), or, under
        lazy introduction, those it knows of (it hears directly only from the peers it introduces itself to)."""
        lazy = self.endpoint.lazy
        return sum(1 for p in self.endpoint.peers.peers.values() if p.role == "node" and (lazy or p.state != JOINING))

    def mesh_round(self, rnd: int) -> int:
        """The highest round that a quorum of the live peers this node averages with in rnd report having
        reached (one of one, both of two, half of more), and that at least two live learning members with
        distinct keys report: only the peers it averages with make the quorum (other groups may run ahead
        freely), but no one member, whatever it claims in its heartbeats, moves a node alone (a pair's
        partner has its claim confirmed by some other member)."""
        names = set(self.live_peers())  # once a call, not once a peer in the test below (N² steps)
        live = [p for p in self.endpoint.peers.peers.values() if p.name in names]
        among = self.method.sources(rnd)
        rounds = sorted((p.round for p in live if p.name in among), reverse=True)
        quorum = max(min(len(rounds), 2), (len(rounds) + 1) // 2)
        if not rounds:
            return 0
        # the second-highest round among distinct keys (names, in an insecure mesh: there a name is its word)
        by_key: dict[str, int] = {}
        for p in live:
            who = p.pubkey or p.name
            by_key[who] = max(by_key.get(who, 0), p.round)
        witnessed = sorted(by_key.values(), reverse=True)
        return min(rounds[quorum - 1], witnessed[1] if len(witnessed) > 1 else 0)

    def catch_up(self, rnd: int) -> int:
        """The round to run next: rnd, or the mesh's round if that is two or more ahead (a straggler, a
        restarted node or a late joiner catches up instead of timing out), never past the scenario's last
        round. A skip is logged and recorded."""
        ahead = min(self.mesh_round(rnd), self.scenario.rounds - 1)
        if ahead < rnd + 2:
            return rnd
        log.info("%s: catching up from round %d to the mesh's round %d", self.name, rnd, ahead)
        self.record("skip", skipped_from=rnd, skipped_to=ahead)
        for key in [k for k in self.inbox if k[1] < ahead]:
            del self.inbox[key]
        return ahead

    async def run_round(self, rnd: int) -> int:
        """One round: pre-round work, train, send, collect, average, settle, evaluate, record, checkpoint. Return the
        round it ran: a later one if the pre-round work took so long that the mesh went on meanwhile."""
        self.round = rnd
        for key in [k for k in self.inbox if k[1] < rnd]:
            del self.inbox[key]  # models of rounds gone (stragglers' late sends)
        decided = self.method.state()
        await self.method.before_round(rnd)
        if self.method.state() != decided:
            # The method decided something before the round (e.g. a choice of peers, already announced to
            # them): keep it now, so a crash later in this round resumes with it instead of choosing again.
            self.checkpoint(rnd - 1)
            # A late joiner's choice took its fetches' time: its chosen peers may be far ahead by now.
            rnd = self.round = self.catch_up(rnd)
        # Who counts in this round, as the round starts: a source that sends its model and then finishes
        # the run (and leaves) before this node collects still counts.
        counted = self.method.sources(rnd)
        train_loss = None
        took_part = self.method.takes_part(rnd)
        if took_part:  # (through its conduct: a scripted member may train nothing)
            train_loss = await self.conduct.train(lambda: self.method.train(rnd))
        sent = self.method.sends(rnd)
        if sent:
            await self.send_model(self.method.subscribers(rnd), "model", self.method.outgoing(rnd))
        expected = self.method.expected(rnd)
        collected = await self.collect("model", rnd, expected, self.cfg.round_timeout)
        arrived = {p: m for p, m in collected.items()
                   if p in counted | self.method.sources(rnd) and isinstance(m, ModelIn)}
        own = ModelIn(self.name, self.current_state(), self.samples) if sent else None
        new = self.method.aggregate(rnd, own, arrived)
        if new is not None:
            self.load_state(new)
        await self.method.settle(rnd)  # (what it changes is what the round evaluates and keeps)
        metrics: dict[str, Any] = {}
        if (rnd + 1) % self.cfg.eval_every == 0 or rnd == self.scenario.rounds - 1:
            ev = await asyncio.to_thread(evaluate, self.model, self.data.x_test, self.data.y_test, self.device,
                                         task=self.task)
            metrics = {"accuracy": ev.accuracy, "loss": ev.loss, "macro_f1": ev.macro_f1}
        self.record("round", participated=took_part, train_loss=train_loss, sources=len(expected),
                    received=len(arrived), bytes_sent=self.endpoint.transport.bytes_sent, **metrics)
        self.checkpoint(rnd)
        log.info("%s: round %d of %d done%s; averaged %d of %d peers' models%s", self.name, rnd + 1,
                 self.scenario.rounds, f", accuracy {metrics['accuracy']:.1%}" if metrics else "", len(arrived),
                 len(expected), f" ({names(arrived)})" if arrived else "")
        return rnd

    def final_metrics(self) -> dict[str, Any]:
        """Test metrics of the personalised model and the traffic of this node."""
        ev = evaluate(self.model, self.data.x_test, self.data.y_test, self.device, task=self.task)
        membership, membership_bytes = self.endpoint.membership_sent()
        return {"accuracy": ev.accuracy, "macro_f1": ev.macro_f1, "loss": ev.loss, "test_samples": ev.samples,
                "bytes_sent": self.endpoint.transport.bytes_sent, "membership_messages": membership,
                "membership_bytes": membership_bytes, "true_cluster": self.true_cluster_of(self.name),
                "device": describe_device(self.device), **self.method.report()}

    # -- crash safety ----------------------------------------------------------------------------
    def checkpoint(self, rnd: int) -> None:
        """Write model, round and method state atomically (tmp file, then rename). The models the method keeps
        for its peers, which seldom change, are written when they change (see keep)."""
        save_atomic({"round": rnd, "model": self.current_state(), "method": json.dumps(self.method.state())},
                    self.checkpoint_path, self.card_metadata(rnd))

    def restore(self) -> int | None:
        """Load this node's own checkpoint if there is one; return its round."""
        refuse_old(self.checkpoint_path)
        refuse_old(self.kept_path)
        if not self.checkpoint_path.exists():
            return None
        ckpt = load_own(self.checkpoint_path)  # our own file, never network data
        self.model.load_state_dict(ckpt["model"])
        self.method.restore(json.loads(ckpt["method"]))
        if self.kept_path.exists():
            self.kept = load_own(self.kept_path)
        log.info("%s: resumed from its checkpoint at round %d", self.name, ckpt["round"])
        return int(ckpt["round"])
