"""A member of a mesh: its transport, its peer table, and the tasks that keep the table true.

Joining: a hello to any known address (the bootstrap or any live member) returns a welcome with the
responder's peer list, and the newcomer introduces itself to each of those peers (with ``introduce_up_to``, while
it has fewer live peers than that: the rest when it first works with them, lazy introduction). From then on,
under the probing membership (the default, ``membership = "probe"``), a member sends each heartbeat period:
- a heartbeat to its partners (the peers it sent a request to or answered one of, or heard a model or request
  from, in the last ``partner_window`` periods) and to the bootstrap. A partner whose own contact says it knows
  (and so heartbeats back) is suspect after ``suspect_after`` periods of silence and dead after ``dead_after``;
  a bootstrap, which every member heartbeats, times everyone so;
- a ping to one other peer whose silence it does not time, in a shuffled round-robin order, and to every
  suspect; an unanswered ping makes a peer suspect, and the silence that follows dead. A ping travels on a
  connection of its own (the transport's probe lane), opened for it and closed once answered, so it never
  queues behind a model on its way to the same peer. The ping and its pong carry the changes of membership
  their sender saw itself (SWIM's piggybacking): a new member is introduced to, and word that a member is
  failing makes the hearer ping that member itself;
- every ``sync_every`` periods, its table (up to SYNC_LISTED of it, drawn) to one random peer (what the news
  missed: members that joined through different members at once).
So the messages and connections of a member are flat in the mesh's size, where ``membership = "all"``
(which members of one mesh must share with each other: a member of the other form is refused) heartbeats every peer
and gossips the whole table to ``gossip_fanout`` peers each period (linear in it; benchmarks/membership.py
measures both). All of this runs on the event loop; the learning code runs in worker threads and never
delays a heartbeat or a pong.

Every member has a CURVE key pair unless it runs ``insecure`` (a warning says what that gives away): all
traffic is encrypted, every message carries its sender's key, and a name is bound to the key that first
spoke for it (an open mesh, net/membership.py) or to its allow-listed key (a closed mesh,
net/security.py). A member is joined through its ticket, ``tcp://HOST:PORT/KEY``.

No message about one peer may stop a member: contact the peer table refuses (a live member's name taken
from elsewhere, more than ``max_peers`` members) is refused with a log line, a peer whose address cannot be
dialled is dropped, and the heartbeat loop survives any error of one period. A join that the other side
refuses for a reason it can tell (another mesh, a key it does not allow, keys on one side only) ends
after ``join_refusals`` tries with that reason; a join nobody answers ends after ``join_give_up`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from p2pfed.net import security
from p2pfed.net.membership import (
    ALIVE,
    DEAD,
    JOINING,
    LEFT,
    MAX_PERIOD_RATIO,
    SUSPECT,
    Change,
    Peer,
    PeerTable,
    Refused,
)
from p2pfed.net.throttle import LogLimiter, remember
from p2pfed.net.transport import (
    PROBE_LANE,
    BadAddress,
    DeliveryError,
    Handler,
    Refusal,
    Transport,
    TransportOptions,
    Unanswered,
    out_of_files,
)
from p2pfed.net.waits import first_of
from p2pfed.wire import DEFAULT_LIMITS, NO_REPLY, NO_TENSORS, SCHEMAS, Message, TryLater, WireError, encode
from p2pfed.wire.messages import (
    LEARNING,
    MAX_HEARTBEAT,
    MAX_NEWS,
    MAX_PEERS_LISTED,
    MEMBERSHIP_FORMS,
    SchemaError,
    check_address,
    check_value,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeshOptions:
    """Timing of membership, in seconds or heartbeat periods."""

    mesh: str = "default"
    heartbeat: float = 1.0
    suspect_after: float = 3.0  # heartbeat periods
    dead_after: float = 6.0  # heartbeat periods
    probe_dead_every: float = 5.0  # heartbeat periods between probes of a dead peer (it may be back)
    gossip_fanout: int = 2
    request_timeout: float = 30.0
    join_timeout: float = 3.0  # seconds to wait for each hello's answer
    join_give_up: float = 300.0  # seconds of unanswered hellos before the join ends with an error
    join_refusals: int = 3  # refusals with the same reason before the join ends with it
    max_peers: int = 1024  # members known at once; more are refused (one log line per sender and window)
    insecure: bool = False  # plain TCP, names trusted on their word: only on a network where every host is trusted
    # "probe": heartbeat only the peers worked with, probe one other peer a period (messages per member flat in
    # the mesh's size); "all": heartbeat every peer and gossip the whole table each period (N per member)
    membership: str = "probe"
    partner_window: float = 30.0  # heartbeat periods a peer stays a partner after the last model or request
    sync_every: float = 10.0  # heartbeat periods between table syncs to one random peer ("probe")
    # "probe": pings to peers heard of go out while the member has fewer live peers than this (counting the pings on
    # their way); past it, a peer heard of waits, neither pinged nor timed, until a request introduces it or it
    # reaches out itself (lazy introduction). At max_peers or more, every peer heard of is pinged (eager)
    introduce_up_to: int = 1024


# Running out of open files is the whole process's trouble: one line a minute for all its members, not a
# line per member and peer (250 nodes of one process would write thousands)
OUT_OF_FILES_EVERY = 60.0
_out_of_files_told = [-math.inf]  # when this process last said so (time.monotonic)

KEY_FILE_WAIT = 10.0  # seconds a join waits for the key file of a member named by --join-key to appear
# A hello not answered within join_timeout is asked again with twice the wait, up to this many times join_timeout
# (and never past join_give_up): a bootstrap given 1,000 hellos at once answers each late, and each hello asked
# again on a new connection is one more handshake and hello for it, its answer to the old one going nowhere
JOIN_BACKOFF = 16
MEMBERSHIP = frozenset({"hello", "heartbeat", "gossip", "leave", "status_req", "ping"})  # what the endpoint answers
KEEPING = MEMBERSHIP - {"status_req"} | {"welcome", "pong"}  # what members send each other to keep their tables
VERIFY_PER_PERIOD = 4  # peers a member probes a period because another member said they were suspect or dead
VERIFY_QUEUED = 64  # such peers waiting to be probed, at most (the rest of a flood of such news is ignored)
# a probing member's goodbye goes to its partners, its bootstraps and coordinators, and this many other peers; the
# rest learn of it from a probe it does not answer (SWIM), as they would of a crash
GOODBYE_OTHERS = 3
NEWS_KEPT = 256  # first-hand membership changes waiting to be told on pings and pongs, newest kept
# Live peers a probing member's table sync lists, drawn at random: the cost of a sync is flat in the mesh's size,
# where the whole table cost each of N members N entries to send, check and learn every sync_every periods (N²
# in all). Up to 64 members a sync lists everyone; past that a missed join heals more slowly, after some
# N/64 syncs (1,000 members: about 16, each member's every sync_every periods), the news on pings healing most.
SYNC_LISTED = 64
# Pings of one member in flight at once; the rest wait their turn. A newcomer introduces itself to every member
# its welcome lists, each ping on a connection of its own: all at once, a mesh of 100 joining in one process
# opened some 10,000 connections and spent its two cores on handshakes until nothing was answered in time.
MAX_PINGING = 16
# Pings in flight in one process, all its members together: a scripted run's members share the process's loop and
# cores, and past what those serve, pongs wait in the queue until pings time out and answered members turn suspect
# (80 keyed members in one process: 1,465 suspicions in forming, then more pings to clear them). A process of one
# member never meets the cap.
PINGS_PER_CORE = 32
# A peer's told period stretches a ping's wait at most this much: past it, a member that tells a long period and
# falls silent would hold the process's pings (and a connection) for up to request_timeout each
PING_STRETCH = 3.0
PACE_EASE = 0.1  # the share of the way back to its configured period a busy member's told period eases each period
NOT_KNOWN = "a member this member does not know"  # why a message from a name with no key known here is refused
OTHER_RECIPES_KEPT = 8  # members of other recipes remembered, to name in "no peer of this recipe came"


class _PingSlots:
    """The pings this process may have in flight, and the members waiting for one, first come first served."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.used = 0
        self.waiting: OrderedDict[Endpoint, None] = OrderedDict()

    def take(self) -> bool:
        if self.used >= self.most:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used -= 1
        while self.waiting and self.used < self.most:
            member, _ = self.waiting.popitem(last=False)
            member._next_queued()

    def wait(self, member: Endpoint) -> None:
        self.waiting.setdefault(member)

    def leave(self, member: Endpoint) -> None:
        """A stopped member waits no more (and is not kept alive by the queue)."""
        self.waiting.pop(member, None)


# One set of slots per event loop (the members of one loop share its thread; a test's loop ends with the test)
_ping_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _PingSlots] = weakref.WeakKeyDictionary()


def ping_slots() -> _PingSlots:
    loop = asyncio.get_running_loop()
    slots = _ping_slots.get(loop)
    if slots is None:
        slots = _ping_slots[loop] = _PingSlots(PINGS_PER_CORE * (os.cpu_count() or 1))
    return slots


class JoinError(ConnectionError):
    """The mesh could not be joined: the reason the other side gave, or that nobody answered."""


def _route_ip(host: str) -> str | None:
    """The local IP of the route towards host (a UDP connect sends nothing; it only picks a route)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return str(s.getsockname()[0])
    return None


def advertised_address(bound: str, toward: str | None = None) -> str:
    """The address peers should dial: bound, with a wildcard host replaced by the IP of this host's route
    towards the join address, else of its default route (a bootstrap joins nobody), else of its host name.
    Loopback while bound to a wildcard is a warning: members on other machines could not reach it."""
    url = urlparse(bound)
    if url.hostname not in ("0.0.0.0", "*", "::", None):
        return bound
    target = urlparse(toward).hostname if toward else None
    ip = _route_ip(target) if target else None
    if ip is None:
        ip = _route_ip("192.0.2.1")  # TEST-NET-1: never on a local link, so its route is the default route
    if ip is None:
        try:
            ip = socket.gethostbyname(socket.gethostname())
        except OSError:
            ip = "127.0.0.1"
    if ip.startswith("127.") and not (target or "").startswith("127."):
        log.warning("bound to %s but the only address found for this host is %s: members on other machines "
                    "cannot reach it; pass --advertise tcp://HOST:%s", bound, ip, url.port)
    return f"tcp://{ip}:{url.port}"


class Endpoint:
    """One member of a mesh (a node, the bootstrap, a coordinator): join, heartbeat, gossip, dispatch."""

    def __init__(
        self,
        name: str,
        role: str = "node",
        *,
        options: MeshOptions | None = None,
        keys: security.Keys | None = None,
        join_key: str | None = None,
        transport_options: TransportOptions | None = None,
        recipe: str = "",
    ) -> None:
        """recipe: the fingerprint of what this member trains (Scenario.fingerprint), which a member of another
        recipe is refused for; "" for a member that trains nothing (a bootstrap) or does not know yet (a node told
        its method by its coordinator, which sets it then). What the member does with the messages it takes, and
        with changes of its peers, it gives once, through serve()."""
        self.name = name
        self.recipe = recipe
        self.role = role
        self.options = options or MeshOptions()
        if self.options.insecure:
            if keys is not None:
                raise ValueError(f"{name}: keys and insecure exclude each other")
            log.warning("%s: INSECURE: plain TCP without keys: anyone who can reach this member can read its "
                        "models and send it messages in any member's name", name)
        elif keys is None:
            keys = security.ephemeral_keys()  # safe by default: a key pair for this process
        self.keys = keys
        self.join_key = join_key
        self.incarnation = time.time_ns()
        self.round = 0
        hb = self.options.heartbeat
        self.peers = PeerTable(
            me=name, suspect_after=self.options.suspect_after * hb, dead_after=self.options.dead_after * hb, period=hb,
            max_peers=self.options.max_peers,
        )
        self._handlers: dict[str, Handler] = {}
        # members refused for training another recipe: name -> their fingerprint (the last few), so a node that
        # waits for peers can say why none came
        self.other_recipes: OrderedDict[str, str] = OrderedDict()
        self._on_change: list[Callable[[Change], None]] = []
        self.changed = asyncio.Event()
        self.rounds_moved = asyncio.Event()  # set when a peer's own word says its round rose (and made anew)
        # A bootstrap moves no model: a message with tensors is refused before its frames are read, so that a
        # stray one makes it neither import torch (seconds of a stalled loop, some 500 MB) nor hold the tensors.
        self.transport = Transport(name, self._dispatch, keys=keys, options=transport_options,
                                   limits=NO_TENSORS if role == "bootstrap" else DEFAULT_LIMITS, mesh=self.options.mesh)
        # At the connection cap, keep the connections to the peers heard from most recently (never-heard first out).
        self.transport.keep_scores = lambda: {p.address: p.last_seen if p.state != JOINING else float("-inf")
                                              for p in self.peers.peers.values()}
        self.address = ""
        self.tasks: list[asyncio.Task[None]] = []
        self.joined = asyncio.Event()
        self.join_error: JoinError | None = None  # set when the join ended without a welcome
        self._last_join_problem = ""
        self.join_ended = asyncio.Event()  # a welcome came, or the join gave up
        # the members this one joined through (their welcome came over the connection dialled with the ticket's key):
        # the lists they give are vouched for (a lazy member's table keeps them outside news's quarter of it)
        self.vouchers: set[str] = set()
        self.stopped = False
        self._last_probe: dict[str, float] = {}
        self.complaints = LogLimiter(log, what="complaints about peers")
        if self.options.membership not in MEMBERSHIP_FORMS:
            raise ValueError(f"{name}: membership must be one of {', '.join(MEMBERSHIP_FORMS)} "
                             f"(got {self.options.membership!r})")
        # the probing membership: whom to probe next (each live peer once per pass, in a shuffled order), the
        # probes waiting for their answer, the peers others said were suspect or dead (to probe ourselves), the
        # first-hand changes still to tell (name -> entry, how many more messages carry it), the last table sync
        self._probe_order: list[str] = []
        self._probing: set[str] = set()
        # peers waiting for a free ping: name -> (a dead one, its state when queued)
        self._queued: OrderedDict[str, tuple[bool, str]] = OrderedDict()
        self._probes: set[asyncio.Task[None]] = set()
        self._syncing: set[str] = set()  # peers a table sync is on its way to (their connection is kept meanwhile)
        self._verify: OrderedDict[str, None] = OrderedDict()
        self._news: OrderedDict[str, tuple[dict[str, Any], int]] = OrderedDict()
        self._last_sync = 0.0
        # Lazy introduction ("probe", introduce_up_to under max_peers): introductions this member may still start
        # (introduce_up_to less its live peers and the introductions on their way, counted each period)
        self.lazy = self.options.membership == "probe" and self.options.introduce_up_to < self.options.max_peers
        self.peers.patient = self.lazy
        self._introduce_room = self.options.introduce_up_to
        self.kept_period = self.options.heartbeat  # the period it keeps, told in its identity (_keep_pace)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, bind: str, join: list[str] | None = None, advertise: str | None = None) -> None:
        """Bind, then join through the given addresses or tickets (tcp://HOST:PORT/KEY) in the background (see
        wait_joined). Raise ValueError at once for a join that cannot work (a keyed member given no key)."""
        targets = [self._join_target(a) for a in (join or []) if a]
        bound = self.transport.bind(bind)
        join = [address for address, _ in targets]
        self.address = advertise or advertised_address(bound, join[0] if join else None)
        problem = check_address(self.address)
        if problem:  # peers would refuse every message that carries it: say so now, not in every heartbeat
            await self.transport.close()
            raise ValueError(f"{self.name}: the address to advertise, {self.address!r}, {problem}; "
                             "pass --advertise tcp://HOST:PORT")
        log.info("%s: %s listening on %s (mesh %s, %s); join it with --join %s", self.name, self.role, self.address,
                 self.options.mesh, "closed, CURVE" if self.keys and self.keys.closed else
                 "CURVE" if self.keys else "INSECURE", self.ticket)
        loop = asyncio.get_running_loop()
        self.tasks.append(loop.create_task(self._heartbeat_loop(), name=f"{self.name}-heartbeat"))
        if targets:
            self.tasks.append(loop.create_task(self._join_loop(targets), name=f"{self.name}-join"))
        else:
            self.joined.set()
            self.join_ended.set()
        for task in self.tasks:
            task.add_done_callback(self._report_crash)

    @property
    def ticket(self) -> str:
        """What a joiner passes to reach this member: tcp://HOST:PORT/KEY (the address alone if insecure)."""
        return security.ticket(self.address, self.keys.public if self.keys else None)

    def _join_target(self, value: str) -> tuple[str, bytes | None]:
        """The address and server key of a join ticket or address (the key of --join-key if the address has
        none, None if that names a member whose key file is not there yet); ValueError for a key part that is
        not a key."""
        address, key = security.split_ticket(value)
        if self.keys is not None and key is None:
            key = security.resolve_key(self.join_key or "bootstrap", self.keys)
        return address, key

    def _missing_join_key(self, address: str) -> JoinError:
        return JoinError(f"{self.name}: {security.missing_key(address)}")

    def _report_crash(self, task: asyncio.Task[None]) -> None:
        """A background task must never die silently: log its exception with the traceback."""
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s crashed", self.name, task.get_name(), exc_info=task.exception())

    async def wait_joined(self, timeout: float) -> None:
        """Wait until a join address has welcomed this member; raise JoinError if the join failed or did not
        succeed within timeout seconds, saying why."""
        try:
            async with asyncio.timeout(timeout):
                await self.join_ended.wait()
        except TimeoutError:
            raise JoinError(f"{self.name} could not join mesh {self.options.mesh!r} within {timeout:g} s: "
                            f"{self._last_join_problem or 'no answer'}") from None
        if self.join_error is not None:
            raise self.join_error

    async def stop(self, leave: bool = True) -> None:
        """Say goodbye to live peers (unless leave is False, as in a simulated crash) and close."""
        if self.stopped:
            return
        self.stopped = True
        ping_slots().leave(self)
        tasks = [*self.tasks, *self._probes]  # first, so that no period closes a goodbye's connection meanwhile
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a crashed task was reported already
                await task
        sent = 0
        if leave and self.transport.router is not None:
            sent = sum(await asyncio.gather(*(self._goodbye(peer) for peer in self._told_goodbye())))
        # Give the goodbyes up to half a second to reach the wire before the sockets close.
        await self.transport.close(linger_ms=500 if sent else 0)

    # -- what the member's runtime attaches ------------------------------------------------------
    # what a learning member adds to its status (wire LEARNING: its curve, its choice), None if it learns nothing
    progress: Callable[[], dict[str, Any]] | None = None

    def serve(self, handlers: Mapping[str, Handler] | None = None, on_change: Callable[[Change], None] | None = None,
              progress: Callable[[], dict[str, Any]] | None = None) -> None:
        """Attach what the member's runtime does (a node's, a coordinator's): a handler for each message type it
        takes beyond membership, a callback for each change of a peer's state, and what its status tells of its
        learning. A runtime and the layers it builds on (a node and its kind) may each serve their part; a message
        type served twice, a membership type or a second progress is refused (ValueError): one member, one
        answer to each message."""
        for mtype, handler in (handlers or {}).items():
            if mtype not in SCHEMAS or mtype in NO_REPLY or mtype in MEMBERSHIP:
                raise ValueError(f"{self.name}: {mtype!r} is not a message type a member's runtime answers")
            if mtype in self._handlers:
                raise ValueError(f"{self.name}: {mtype} messages are served already")
            self._handlers[mtype] = handler
        if on_change is not None:
            self._on_change.append(on_change)
        if progress is not None:
            if self.progress is not None:
                raise ValueError(f"{self.name}: its learning progress is served already")
            self.progress = progress

    def membership_sent(self) -> tuple[int, int]:
        """The messages and bytes this member has sent so far to keep the mesh's tables (joins, heartbeats,
        probes, gossip), not models or notes."""
        sent, sizes = self.transport.sent, self.transport.sent_bytes
        return sum(sent[k] for k in KEEPING), sum(sizes[k] for k in KEEPING)

    # -- talking to peers ------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """This member as the IDENTITY schema carries it."""
        pubkey = self.keys.public.decode() if self.keys else ""
        return {"address": self.address, "role": self.role, "incarnation": self.incarnation,
                "pubkey": pubkey, "round": self.round, "heartbeat": round(self.kept_period, 3), "recipe": self.recipe,
                "membership": self.options.membership}

    def message(self, mtype: str, body: dict[str, Any], tensors: dict[str, Any] | None = None) -> Message:
        """A message from this member in its mesh at its current round."""
        return Message(mtype, self.name, mesh=self.options.mesh, round=self.round, body=body,
                       tensors=tensors or {})

    def _server_key(self, peer: Peer) -> bytes | None:
        """The key to dial peer with (CURVE checks that the member there holds it), None without keys."""
        if not self.keys:
            return None
        if self.keys.closed:
            key = self.keys.key_of(peer.name)
            if key is None or key != peer.pubkey.encode():
                raise DeliveryError(f"{peer.name}'s public key is not the one allowed as {peer.name}.key")
            return key
        if not peer.pubkey:
            raise DeliveryError(f"{peer.name} has no public key (it runs --insecure; this member does not)")
        return peer.pubkey.encode()

    def _send(self, peer: Peer, mtype: str, body: dict[str, Any],
              encoded: tuple[Message, list[Any]] | None = None) -> bool:
        """Send peer a message that needs no reply, now, or not at all (False). encoded: the message and its frames,
        made once for several peers (a period's heartbeat to its partners: one schema check, id and packing, not one
        a partner)."""
        try:
            msg, frames = encoded if encoded is not None else (self.message(mtype, body), None)
            return self.transport.send_nowait(peer.address, msg, self._server_key(peer), frames)
        except DeliveryError as exc:
            if not isinstance(exc, BadAddress):
                return False  # not now (no key for it, connections busy): the next period tries again
            problem: Exception = exc
        except Exception as exc:  # anything else about this one peer: drop it, never the caller's loop
            problem = exc
        if out_of_files(problem):  # this process's trouble, not the peer's: keep it, and say so once a minute
            self._say_out_of_files()
            return False
        self._drop(peer, problem)
        return False

    def _drop(self, peer: Peer, problem: Exception) -> None:
        """Forget a peer that cannot be reached at all (an address libzmq cannot dial), saying why."""
        self.complaints.warning(peer.name, "%s: dropping peer %s: %s", self.name, peer.name, problem)
        self.peers.peers.pop(peer.name, None)
        self.transport.forget(peer.address)

    def _say_out_of_files(self) -> None:
        if time.monotonic() - _out_of_files_told[0] >= OUT_OF_FILES_EVERY:
            _out_of_files_told[0] = time.monotonic()
            log.warning("%s: cannot reach peers: too many open files (ulimit -n; said once a minute)", self.name)

    def _told_goodbye(self) -> list[Peer]:
        """Whom a leaving member tells: every live peer where each has a connection anyway (membership "all");
        probing, the peers it has a connection to (its partners of late: those that may wait on it), the
        bootstraps and coordinators (they keep the table and run the rounds) and GOODBYE_OTHERS more. A goodbye
        to everyone would open a connection to most peers, and a mesh that stops at once (a scenario's end) would
        open N² of them to say so."""
        live = self.peers.by_state(ALIVE, SUSPECT, JOINING)
        if self.options.membership != "probe":
            return live
        partners = self.peers.partners(self.options.partner_window * self.options.heartbeat)
        told = [p for p in live if p.address in self.transport.dealers or p.role != "node" or p.name in partners]
        # (lazy introduction: not to the peers it let wait, strangers to it, which may refuse a stranger's word)
        rest = [p for p in live if p not in told and not (self.lazy and p.state == JOINING)]
        return told + random.sample(rest, min(GOODBYE_OTHERS, len(rest)))

    async def _goodbye(self, peer: Peer) -> bool:
        """Tell peer this member leaves, over a connection opened for it if there is none (a bootstrap, one of the
        others a probing member tells): half a second at most."""
        try:
            key = self._server_key(peer)
        except DeliveryError:
            return False
        return await self.transport.send(peer.address, self.message("leave", {}), 0.5, key)

    async def ask_table(self) -> int:
        """Ask a bootstrap for the members it knows (its status, as `p2pfed mesh status` asks) and take them as
        news; return how many this member did not know (0 without an answer). Under lazy introduction the members
        that joined after this one reach it as news on pings, few of which it and its peers then send (at 250
        nodes with introduce_up_to = 64 the first to join started up to four minutes after the last):
        every member heartbeats its bootstraps, which know them all."""
        live = [p for p in self.peers.peers.values() if p.state in (ALIVE, SUSPECT)]
        # a member it joined through, else one that says it is a bootstrap (whose list is then news, not vouched for:
        # any member may say so)
        boots = [p for p in live if p.name in self.vouchers] or [p for p in live if p.role == "bootstrap"]
        if not boots or self.stopped:
            return 0
        peer = random.choice(boots)
        try:
            reply = await self.transport.request(peer.address, Message("status_req", self.name, mesh=self.options.mesh),
                                                 self.options.request_timeout, self._server_key(peer))
        except DeliveryError:
            return 0
        before = len(self.peers.peers)
        if reply.type == "status" and reply.sender == peer.name:
            self.learn(reply.body["peers"], vouched=peer.name in self.vouchers)
        return len(self.peers.peers) - before

    def introducing_to(self, peer: Peer) -> bool:
        """Whether this member is introducing itself to peer, a joining one: its ping is out, or waits its turn."""
        return peer.state == JOINING and (peer.introduced is not None or peer.name in self._queued)

    def introduces(self, peer: Peer) -> bool:
        """Whether a request to peer pings it first: probing, a peer known from gossip alone (it may not know this
        member: in a mesh still forming its introduction waits its turn, and it refuses a stranger's request), or
        one dead only because its introduction went unanswered (at 1,000 nodes on one machine members declared
        some 600 peers each dead so while the mesh formed, most of them only slow to answer, and no request could
        reach those). A member of the "all" form heartbeats every peer it knows, and pings none."""
        return self.options.membership == "probe" and (
            peer.state == JOINING or (peer.state == DEAD and peer.unintroduced))

    async def request(self, peer_name: str, msg: Message, timeout: float | None = None) -> Message:
        """Send msg to a peer by name and wait for its reply (ack); raise DeliveryError if it does not come,
        at once when the mesh declares the peer dead, gone or restarted meanwhile (not at the timeout)."""
        peer = self.peers.peers.get(peer_name)
        introduce = peer is not None and self.introduces(peer)
        if peer is None or (peer.state in (DEAD, LEFT) and not introduce):
            raise DeliveryError(f"{peer_name} is not a live peer")
        if introduce and peer.name not in self._probing:
            self._probing_now(peer.name)
            await self._probe(peer)
            peer = self.peers.peers.get(peer_name)
        if peer is None or peer.state in (DEAD, LEFT):  # its ping unanswered, or one under way already
            raise DeliveryError(f"{peer_name} is not a live peer")
        # (a joining peer whose ping went unanswered stays joining until the sweep: the request goes, and the
        # peer may refuse a stranger's, or not answer it)
        self.peers.asked(peer_name)  # a partner from now: not probed while this may be on its way
        try:
            reply = await self._asked(peer, msg, timeout)
        except Refusal as exc:
            if not exc.reason.endswith(f"{self.name} is {NOT_KNOWN}") or peer.name in self._probing:
                raise
            # It forgot this member (seen at 1,000 lazy nodes: it took this one for dead when its introduction went
            # unanswered, and dropped its key) while this one heard it: introduce this member, and ask once more.
            self._probing_now(peer.name)
            await self._probe(peer)
            peer = self.peers.peers.get(peer_name) or peer
            if peer.state in (DEAD, LEFT):
                raise
            reply = await self._asked(peer, msg, timeout)
        if (reply.key and self.keys is not None and not self.keys.closed and peer_name not in self.peers.bound
                and reply.sender == peer_name and reply.key == peer.pubkey):
            # its first word, maybe (its introduction unanswered in time, the request went anyway): the answer
            # came over the connection dialled with its key, which is proved. Unbound, the peer's own requests
            # were refused as from "a member this member does not know" (14 at 250 lazy nodes).
            self.peers.bind(peer_name, reply.key)
        change = self.peers.touched(peer_name)  # its answer is contact, and makes it a partner
        if change:
            self._changed(change)
        return reply

    async def _asked(self, peer: Peer, msg: Message, timeout: float | None) -> Message:
        """Send msg to peer and wait for its reply; raise DeliveryError at once when the mesh declares the peer
        dead, gone or restarted meanwhile."""
        incarnation, name = peer.incarnation, peer.name
        request = asyncio.ensure_future(self.transport.request(
            peer.address, msg, timeout or self.options.request_timeout, self._server_key(peer)))
        try:
            while not request.done():
                await first_of(request, self.changed)
                now = self.peers.peers.get(name)
                if not request.done() and (now is None or now.state in (DEAD, LEFT) or now.incarnation != incarnation):
                    state = "gone" if now is None else now.state if now.incarnation == incarnation else "restarted"
                    # (the reason alone: every caller says what was not delivered, and to whom)
                    raise DeliveryError(f"{name} is {state}")
            return request.result()
        finally:
            request.cancel()

    async def _join_loop(self, targets: list[tuple[str, bytes | None]]) -> None:
        delay = 0.5
        give_up = time.monotonic() + self.options.join_give_up
        refusals: dict[str, int] = {}
        waits = {address: self.options.join_timeout for address, _ in targets}
        addresses = [address for address, _ in targets]
        # A key named by a member's name (--join-key bootstrap, the default) is that member's key file in this
        # machine's key folder: a member started at the same moment writes it at its start, so wait a little.
        key_wait = time.monotonic() + KEY_FILE_WAIT
        try:
            while not self.joined.is_set():
                for i, (address, key) in enumerate(targets):
                    if key is None and self.keys is not None:
                        key = self._join_target(address)[1]
                        if key is None:
                            if time.monotonic() >= key_wait:
                                raise self._missing_join_key(address)
                            self._last_join_problem = f"no key for {address} yet"
                            continue
                        targets[i] = (address, key)
                    hello = self.message("hello", self.identity())
                    self.transport.watch(address, key)
                    try:
                        wait = min(waits[address], max(self.options.join_timeout, give_up - time.monotonic()))
                        reply = await self.transport.request(address, hello, wait, key)
                    except Refusal as exc:  # the other side told why
                        self._last_join_problem = f"{address}: {exc.reason}"
                        self.transport.forget(address)
                        if exc.retry:  # e.g. our previous process is not silent yet: it will be
                            log.info("%s: join through %s not yet: %s; retrying", self.name, address, exc.reason)
                            continue
                        refusals[exc.reason] = refusals.get(exc.reason, 0) + 1
                        log.warning("%s: join through %s refused: %s", self.name, address, exc.reason)
                        if refusals[exc.reason] >= self.options.join_refusals:
                            raise JoinError(f"{self.name} could not join mesh {self.options.mesh!r} through "
                                            f"{address}: {exc.reason}") from None
                        continue
                    except DeliveryError as exc:
                        self._last_join_problem = str(exc)
                        if isinstance(exc, Unanswered) and address not in self.transport.handshakes:
                            # no connection refused nor handshake failed: there, but busy; wait longer next time
                            waits[address] = min(2 * waits[address], JOIN_BACKOFF * self.options.join_timeout)
                        self.transport.forget(address)
                        log.info("%s: join through %s not answered yet (%s); retrying", self.name, address, exc)
                        continue
                    if reply.type != "welcome":
                        log.warning("%s: %s answered hello with %s, not welcome", self.name, address, reply.type)
                        continue
                    if reply.key and reply.body["pubkey"] != reply.key:
                        log.warning("%s: %s answered as %s with a key other than the one it advertises", self.name,
                                    address, reply.sender)
                        continue
                    self._heard(reply)  # the reply's key is the one we dialled: the welcomer's name is bound to it
                    self.vouchers.add(reply.sender)
                    self.learn(reply.body["peers"], vouched=True)
                    log.info("%s: joined mesh %s through %s (%s), %d peers known", self.name, self.options.mesh,
                             address, reply.sender, len(self.peers.live()) + len(self.peers.by_state(JOINING)))
                    self.joined.set()
                    # The dealer to the join address is now also the dealer of a named peer only if the
                    # addresses match; otherwise drop it so it does not linger.
                    if address not in {p.address for p in self.peers.peers.values()}:
                        self.transport.forget(address)
                    return
                if time.monotonic() >= give_up:
                    raise JoinError(f"{self.name} could not join mesh {self.options.mesh!r}: no answer from "
                                    f"{', '.join(addresses)} in {self.options.join_give_up:g} s "
                                    f"({self._last_join_problem or 'no answer'})")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        except JoinError as exc:
            self.join_error = exc
            log.error("%s", exc)
        except Exception as exc:  # anything else ends the join too, and says so (it is not a success)
            self.join_error = JoinError(f"{self.name} could not join mesh {self.options.mesh!r}: {exc}")
            if out_of_files(exc):  # this process's limit, not a bug: one line (the runner says what helps)
                log.error("%s", self.join_error)
            else:
                log.exception("%s: the join failed", self.name)
        finally:
            self.join_ended.set()

    async def _heartbeat_loop(self) -> None:
        period = self.options.heartbeat
        last = time.monotonic()
        while True:
            pause = period * random.uniform(0.9, 1.1)
            before = time.monotonic()
            await asyncio.sleep(pause)
            now = time.monotonic()
            self._keep_pace(now - last - pause + period)  # less this period's jitter: on time, it is the period
            last = now
            try:
                self._beat(now, now - before - pause)
            except Exception:  # one period's error (a bug, a peer's odd entry) must not end the heartbeats
                log.exception("%s: heartbeat period failed; carrying on", self.name)

    def _keep_pace(self, interval: float) -> None:
        """Take the time since the last heartbeat period began: the period this member keeps (and tells in its
        identity) is its configured one, or longer while its process is too busy to keep that (the longest
        interval of late, easing back a tenth of the way each period). Peers time its silence by what it tells
        (PeerTable's ratio), so a member whose process runs late is not taken for silent by peers whose process
        does not (each such suspicion is told on and probed). (Lifeguard's local health, told by the member
        itself; SWIM says nothing of a member's own load.)"""
        period = self.options.heartbeat
        eased = self.kept_period - (self.kept_period - period) * PACE_EASE
        self.kept_period = min(MAX_PERIOD_RATIO * period, MAX_HEARTBEAT, max(period, interval, eased))

    def _beat(self, now: float, lag: float) -> None:
        """One heartbeat period: sweep the table, heartbeat and probe peers, gossip, close stale connections."""
        period = self.options.heartbeat
        if lag > 0.5 * period:
            # This loop was not listening (a stall of our own): peers' heartbeats may be waiting in the
            # socket, so do not count the stall as their silence.
            for peer in self.peers.peers.values():
                peer.last_seen = min(now, peer.last_seen + lag)
                if peer.introduced is not None:  # a joining peer's silence is timed from our first word to it
                    peer.introduced = min(now, peer.introduced + lag)
        probing = self.options.membership == "probe"
        if probing:
            # A partner heartbeats us until its own window ends; we stop timing its silence a margin earlier
            # (the two windows start a message's flight apart), so a partnership that ends ends quietly.
            # Only a partner whose own contact says it knows is timed (it heartbeats us from then on); a bootstrap
            # times everyone, as every member heartbeats it.
            window = self.options.partner_window * period
            partners = self.peers.partners(window)
            watched = None if self.role == "bootstrap" else self.peers.partners(
                window - 2 * self.options.suspect_after * period, heard=True)
        for change in self.peers.sweep(watched if probing else None):
            # a joining peer's silence is forming's trouble, not a member lost
            self._changed(change, " (it never answered its introduction)" if change.old == JOINING else "")
        # The rest of the period from one comprehension over the table and a pass over what it keeps (each pass over
        # a table is paid by every member of a process each period: at 1,000 nodes in 4 processes, 250 tables of
        # 1,000; benchmarks/beat.py): whom to heartbeat, the dead (probed now and then), the suspect and joining
        # (probed), the bootstraps (their connections kept).
        # A bootstrap hears every member's heartbeat under either form: it is where a mesh is watched from (a
        # scripted run reads the members' rounds there, `mesh status` asks it), at one message per member and
        # period, so the mesh's total stays linear in its size.
        beat: list[Peer] = []
        dead: list[Peer] = []
        unsettled: list[str] = []
        unheard: list[str] = []  # (lazy) joining peers not spoken to yet, introduced while there is room
        bootstraps: set[str] = set()
        listed = [p for p in self.peers.peers.values()  # (under "probe", an alive peer not a partner needs nothing)
                  if not probing or p.state != ALIVE or p.role == "bootstrap" or p.name in partners]
        # (lazy) its live members (a bootstrap among them) and the introductions on their way
        heard, pending = len(self.peers.peers) - len(listed), 0
        for peer in listed:
            state = peer.state
            if peer.role == "bootstrap":
                bootstraps.add(peer.name)
            if state == DEAD:
                dead.append(peer)
            elif state != LEFT:
                if not probing or peer.name in partners or peer.role == "bootstrap":
                    beat.append(peer)
                if self.lazy:
                    if state != JOINING:
                        heard += 1
                    elif self.introducing_to(peer):
                        pending += 1
                    else:
                        unheard.append(peer.name)
                        continue
                if state != ALIVE:
                    unsettled.append(peer.name)
        if self.lazy:
            room = max(0, self.options.introduce_up_to - heard - pending)
            unsettled += unheard[:room]
            self._introduce_room = room - min(room, len(unheard))
        if beat:
            heartbeat = self.message("heartbeat", self.identity())
            try:
                encoded = (heartbeat, encode(heartbeat))
            except ValueError as exc:  # this member's own identity broke the wire's rules: a bug, said; the period
                # goes on (its probes, sync and connections), and no partner is dropped for it
                self.complaints.warning("heartbeat", "%s: its heartbeat cannot be sent: %s", self.name, exc)
            else:
                for peer in beat:
                    self._send(peer, "heartbeat", heartbeat.body, encoded)
        for peer in dead:
            # A dead peer may only have been cut off: probe it now and then so a healed partition heals.
            if now - self._last_probe.get(peer.name, 0.0) > self.options.probe_dead_every * period:
                self._last_probe[peer.name] = now
                if probing:
                    self._start_probe(peer, dead=True)
                else:
                    self._send(peer, "heartbeat", self.identity())
        for name in [n for n in self._last_probe if n not in self.peers.peers]:
            del self._last_probe[name]
        if probing:
            self._probe_some(watched or set(), unsettled)
        live = self.peers.live() if not probing or now - self._last_sync >= self.options.sync_every * period else []
        if live:
            # "all": the whole table to a few peers every period; "probe": SYNC_LISTED of it, drawn, to one peer now
            # and then, which heals what the news on pings missed (members that joined through different members)
            self._last_sync = now
            if probing:  # over a connection opened for it (most peers have none), kept until the sync is out
                listed = random.sample(live, min(SYNC_LISTED, len(live)))
                clock = self.peers.clock()
                self._start_sync(random.choice(live), {**self.identity(),
                                                       "peers": [p.as_wire(clock) for p in listed]})
            else:
                gossip = {**self.identity(), "peers": [p for p in self.peers.snapshot()
                                                       if p["state"] in (ALIVE, SUSPECT)][:MAX_PEERS_LISTED]}
                for peer in random.sample(live, min(self.options.gossip_fanout, len(live))):
                    self._send(peer, "gossip", gossip)
        if probing:  # connections only to the peers it works with, the bootstrap, and those being probed
            table = self.peers.peers
            kept = {table[n].address for n in partners | bootstraps | self._probing | self._syncing if n in table}
        else:
            kept = {p.address for p in self.peers.peers.values()}
        for address in set(self.transport.dealers) - kept:
            if not self.transport.in_flight.get(address):  # e.g. a join request still waiting
                self.transport.forget(address)  # connections of forgotten peers (and, probing, of idle ones)

    # -- the probing membership ------------------------------------------------------------------
    # SWIM's failure detector (Das, Gupta and Motivala, DSN 2002) without its trust in third parties: a member
    # probes one peer a period, in a shuffled round-robin order, and every suspect each period; the changes it
    # saw itself ride on its pings and pongs a few times each (SWIM's piggybacking). Where SWIM believes news of
    # a suspect or dead member (and lets the member refute it by raising its incarnation), a member here only
    # probes that member itself: in an open mesh nobody can prove news about a third member, so such news may
    # cost a probe, never a member's entry. An incarnation here is a process start, not a refutation counter.

    def _probe_some(self, watched: set[str], unsettled: list[str]) -> None:
        """Start this period's probes: every suspect and every peer not heard from yet (an introduction, until it
        answers), up to VERIFY_PER_PERIOD peers others said were failing, and the next alive peer of the
        round-robin whose silence is not timed already (a partner that heartbeats us is heard from anyway). None
        to a peer being pinged already. unsettled: the suspect and joining peers' names (the period has them)."""
        targets = list(unsettled)
        for _ in range(min(VERIFY_PER_PERIOD, len(self._verify))):
            targets.append(self._verify.popitem(last=False)[0])
        refilled = False
        while True:
            if not self._probe_order:
                if refilled:
                    break  # a whole pass found nobody to probe
                refilled = True
                self._probe_order = [p.name for p in self.peers.live() if p.name not in watched]
                random.shuffle(self._probe_order)
                continue
            name = self._probe_order.pop()
            peer = self.peers.peers.get(name)
            if peer is not None and peer.state == ALIVE and name not in watched:
                targets.append(name)
                break
        for name in dict.fromkeys(targets):
            peer = self.peers.peers.get(name)
            if peer is not None:
                self._start_probe(peer)

    def _start_probe(self, peer: Peer, dead: bool = False) -> None:
        """Ping peer in the background, unless it is gone, dead (but for the now-and-then probe of a dead peer)
        or being pinged already."""
        if (peer.state not in (ALIVE, SUSPECT, JOINING, *((DEAD,) if dead else ())) or peer.name in self._probing
                or self.stopped):
            return
        slots = ping_slots()
        if len(self._probing) >= MAX_PINGING or not slots.take():
            if peer.name not in self._queued and len(self._queued) < self.options.max_peers:
                self._queued[peer.name] = (dead, peer.state)
            if len(self._probing) < MAX_PINGING:  # the process's pings are all out: its turn comes
                slots.wait(self)
            return
        self._probing_now(peer.name)
        task = asyncio.get_running_loop().create_task(self._probe(peer), name=f"{self.name}-probe")
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)
        task.add_done_callback(self._report_crash)
        # given back when the task ends, however (one cancelled before its first step never runs its finally)
        task.add_done_callback(lambda _: slots.give())

    def _start_sync(self, peer: Peer, gossip: dict[str, Any]) -> None:
        """Send this member's table to peer in the background, over a connection opened for it if need be."""
        if peer.name in self._syncing or self.stopped:
            return
        try:
            key = self._server_key(peer)
        except DeliveryError:
            return
        self._syncing.add(peer.name)

        async def sync() -> None:
            try:
                await self.transport.send(peer.address, self.message("gossip", gossip), self.options.heartbeat, key)
            finally:
                self._syncing.discard(peer.name)

        task = asyncio.get_running_loop().create_task(sync(), name=f"{self.name}-sync")
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)
        task.add_done_callback(self._report_crash)

    async def _probe(self, peer: Peer) -> None:
        """Ping peer and take its pong as direct contact; an unanswered ping makes an alive peer suspect. A ping
        travels on the peer's probe lane, a connection of its own (never behind a model on the way to the same peer),
        opened for it and closed once answered: connections stay as few as the peers this member works with,
        whatever the mesh's size (the peer expects that close: it is no news there)."""
        name, incarnation, address = peer.name, peer.incarnation, peer.address
        # as long as suspect_after periods: of the slower of the two, as either tells it (_keep_pace), a peer's
        # counted up to PING_STRETCH of ours
        hb = self.options.heartbeat
        slower = max(self.kept_period, min(peer.period, PING_STRETCH * hb))
        timeout = min(self.options.request_timeout, self.options.suspect_after * slower)
        started = time.monotonic()
        try:
            try:
                body = {**self.identity(), "news": self._news_out()}
                reply = await self.transport.request(address, self.message("ping", body), timeout,
                                                     self._server_key(peer), lane=PROBE_LANE)
            except Refusal as exc:  # it answered: alive, though it will not take us (another mesh, recipe, ...)
                log.debug("%s: %s refused a ping: %s", self.name, name, exc.reason)
                return
            except Unanswered as exc:
                # Only silence counts, not a stall of our own loop (the timeout fired late).
                if time.monotonic() - started > 1.5 * timeout:
                    return
                change = self.peers.suspect(name, incarnation)
                if change:
                    log.debug("%s: ping to %s unanswered: %s", self.name, name, exc)
                    self._changed(change)
                return
            except BadAddress as exc:  # an address nobody can dial: drop the peer, as a heartbeat would
                if out_of_files(exc):  # this process's trouble, not the peer's
                    self._say_out_of_files()
                else:
                    self._drop(peer, exc)
                return
            except DeliveryError as exc:  # this member's trouble (no key for it, every connection busy, out of files)
                if out_of_files(exc):
                    self._say_out_of_files()
                log.debug("%s: ping to %s not sent: %s", self.name, name, exc)
                return
            if reply.type != "pong" or reply.sender != name or (
                    self.keys is not None and reply.body["pubkey"] != reply.key):
                self.complaints.warning(f"pong:{name}", "%s: %s answered a ping with %s as %s", self.name, name,
                                        reply.type, reply.sender)
                return
            try:
                self._heard(reply)
            except WireError as exc:
                self.complaints.warning(f"pong:{name}", "%s: pong from %s not taken: %s", self.name, name, exc)
                return
            self._take_news(reply.body["news"])
        finally:
            self._probing.discard(name)
            if not self.stopped:
                self.transport.forget(PROBE_LANE + address)
                self._next_queued()

    def _probing_now(self, name: str) -> None:
        """A ping to name starts (its _probe ends it): no second one meanwhile, and a joining peer's silence is
        timed from it."""
        self._probing.add(name)
        self.peers.introducing(name)

    def _next_queued(self) -> None:
        """Start the pings that waited for a free one, but of peers heard from directly meanwhile: a newcomer or a
        suspect that has since spoken to us (a newcomer's own ping introduces both sides: forming a mesh, each
        pair then pings once, not twice), or an alive peer heard within the last period."""
        if self.stopped:
            return
        now = self.peers.clock()
        slots = ping_slots()
        while self._queued and len(self._probing) < MAX_PINGING:
            if slots.used >= slots.most:
                slots.wait(self)
                return
            name, (dead, was) = self._queued.popitem(last=False)
            peer = self.peers.peers.get(name)
            if peer is None or (peer.state == ALIVE and (was in (JOINING, SUSPECT)
                                                         or now - peer.last_seen < self.options.heartbeat)):
                continue
            self._start_probe(peer, dead)

    def _tell(self, name: str, state: str) -> None:
        """Queue a first-hand change of peer name for the next pings and pongs: each carries it a few times,
        about 3 log2(N) in all (SWIM's lambda log N: enough for everyone to hear of it with high probability)."""
        peer = self.peers.peers.get(name)
        if peer is None:
            return
        entry = {**peer.as_wire(self.peers.clock()), "state": state}
        times = math.ceil(3 * math.log2(len(self.peers.peers) + 2))
        self._news.pop(name, None)
        remember(self._news, name, (entry, times), NEWS_KEPT)

    def _news_out(self) -> list[dict[str, Any]]:
        """The changes this ping or pong carries (the newest first), each counted as told once more."""
        out = []
        for name in reversed(list(self._news)[-MAX_NEWS:]):
            entry, times = self._news[name]
            out.append(entry)
            if times <= 1:
                del self._news[name]
            else:
                self._news[name] = (entry, times - 1)
        return out

    def _take_news(self, news: list[dict[str, Any]]) -> None:
        """Changes another member saw: a member we do not know (or a newer process of one) is introduced to as
        gossip's are; word that a member we hear as alive is failing only puts it on our own probe list."""
        arrivals = []
        for info in news:
            name = info["name"]
            if name == self.name:
                continue  # word that we are failing: the pong we answer with, or our next ping, says otherwise
            if info["state"] in (ALIVE, JOINING):
                arrivals.append(info)
            elif info["state"] in (SUSPECT, DEAD):
                peer = self.peers.peers.get(name)
                if (peer is not None and peer.state == ALIVE and peer.incarnation == info["incarnation"]
                        and name not in self._verify and len(self._verify) < VERIFY_QUEUED):
                    self._verify[name] = None
        if arrivals:
            self.learn(arrivals)

    # -- receiving -------------------------------------------------------------------------------
    def _heard(self, msg: Message) -> None:
        body = msg.body
        theirs = body.get("recipe", "")
        if self.recipe and theirs and theirs != self.recipe:
            # both train, and not the same thing: refused before a model of the wrong shape is ever sent
            remember(self.other_recipes, msg.sender, theirs, OTHER_RECIPES_KEPT)
            raise WireError(f"{msg.sender} trains recipe {theirs}, this member ({self.name}) trains recipe "
                            f"{self.recipe}: members of a mesh must share one recipe (model, input, classes, "
                            "method, training, seed)")
        form = body.get("membership")
        if form and form != self.options.membership:
            raise WireError(f"{msg.sender} keeps membership {form!r}, this member ({self.name}) "
                            f"{self.options.membership!r}: every member of a mesh must use one ([mesh] membership)")
        old = self.peers.peers.get(msg.sender)
        old_address = old.address if old else None
        old_round = old.round if old else None
        try:
            change = self.peers.heard_from(msg.sender, body["address"], body["role"], body["incarnation"],
                                           body["pubkey"], body["round"], body["heartbeat"],
                                           authenticated=self.keys is not None and self.keys.closed,  # _check_key
                                           key=msg.key if self.keys is not None and not self.keys.closed else "")
        except Refused as exc:
            raise (TryLater if exc.transient else WireError)(str(exc)) from None
        if old_address and old_address != body["address"]:
            self.transport.forget(old_address)
        if old_round is not None and body["round"] > old_round:
            # a peer's round moved on: whoever waits on its rounds looks again (a model it has passed will not come)
            self.rounds_moved.set()
            self.rounds_moved = asyncio.Event()
        if change and change.old in (None, JOINING, DEAD, LEFT) and msg.type not in ("hello", "ping", "pong"):
            self._send(self.peers.peers[msg.sender], "heartbeat", self.identity())  # answer a newcomer now
        if change:
            self._changed(change)

    def mark_dead(self, name: str, incarnation: int | None = None) -> None:
        """Record that a peer is known dead (a last will from the discovery broker)."""
        change = self.peers.mark_dead(name, incarnation)
        if change:
            self._changed(change)

    def learn(self, peers: list[dict[str, Any]], vouched: bool = False) -> None:
        """Take peers heard of from gossip or discovery; new ones are introduced to at once (lazy: while there is
        room). vouched: the list of a member this one joined through (its welcome, its table asked for), whose
        ticket it was given: the members it lists as alive or suspect (heard by it) a lazy member's table keeps
        outside news's quarter of it."""
        if self.lazy:
            # in a random order: introductions go, and the table keeps, the first ones while there is room, and a
            # bootstrap lists its members sorted by name (taken in that order, every lazy member introduced itself to
            # the same few, and its live peers were of the same clusters)
            peers = random.sample(peers, len(peers))
        for info in peers:
            if self.keys and self.keys.closed and self.keys.key_of(info["name"]) != info["pubkey"].encode():
                continue  # never dial a member whose key we would not accept as that member
            if self.keys and not info["pubkey"]:
                continue  # an insecure member: this member cannot dial it
            if self.peers.learned_of(info, vouched):
                log.debug("%s: learned of %s at %s", self.name, info["name"], info["address"])
                peer = self.peers.peers[info["name"]]
                if self.lazy:  # introduced now while there is room, else when worked with or when it reaches out
                    if self._introduce_room > 0:
                        self._introduce_room -= 1
                        self._start_probe(peer)
                elif self.options.membership == "probe":
                    self._start_probe(peer)  # introduce now; its pong is our first contact, a ping retried till then
                else:
                    self.peers.introducing(peer.name)
                    self._send(peer, "heartbeat", self.identity())  # introduce now

    def _changed(self, change: Change, why: str = "") -> None:
        verb = {ALIVE: "is alive", SUSPECT: "is silent (suspect)", DEAD: "is dead", LEFT: "left",
                "rejoined": "restarted and rejoined"}.get(change.new, change.new)
        verb += why
        log.info("%s: peer %s %s", self.name, change.name, verb)
        if self.options.membership == "probe" and change.new in (ALIVE, SUSPECT, DEAD, "rejoined") and (
                change.new != ALIVE or change.old in (None, JOINING, DEAD, LEFT)):
            self._tell(change.name, ALIVE if change.new == "rejoined" else change.new)
        for callback in self._on_change:
            callback(change)
        self.changed.set()
        self.changed = asyncio.Event()

    def _check_key(self, msg: Message) -> None:
        """With keys, a sender is who its key says. Closed mesh: the name it claims must be the name its key is
        allowed as (allowed/NAME.key), alive or dead. Open mesh: the key must be the one bound to the name
        (membership messages bind a new name, net/membership.py), so nobody speaks for another member."""
        if self.keys is None or msg.type == "status_req":
            return
        if msg.type in ("hello", "heartbeat", "gossip", "ping") and msg.body["pubkey"] != msg.key:
            raise WireError(f"{msg.sender} advertises a public key other than the one it connected with")
        if self.keys.closed:
            expected = self.keys.key_of(msg.sender)
            if expected is None or not msg.key or msg.key != expected.decode():
                self.complaints.warning(f"key:{msg.sender}", "%s: refused %s as %s: its key is not %s's "
                                        "(allowed/%s.key)", self.name, msg.type, msg.sender, msg.sender, msg.sender)
                raise WireError(f"{msg.sender} sent {msg.type} with a key that is not {msg.sender}'s "
                                f"(allowed/{msg.sender}.key)")
            return
        if msg.type in ("hello", "heartbeat", "gossip", "ping"):
            return  # the peer table binds or refuses the name (heard_from)
        bound = self.peers.key_of(msg.sender)
        if not bound or msg.key != bound:
            why = NOT_KNOWN if not bound else "another key than the one it is bound to"
            self.complaints.warning(f"key:{msg.sender}", "%s: refused %s as %s: %s (key %s...)", self.name,
                                    msg.type, msg.sender, why, (msg.key or "none")[:8])
            raise WireError(f"{msg.type} as {msg.sender} refused: {msg.sender} is {why}")
        if msg.sender not in self.peers.bound:
            self.peers.bind(msg.sender, msg.key)  # the key gossip proposed, proved by the sender holding it

    async def _dispatch(self, msg: Message) -> Message | None:
        if msg.mesh != self.options.mesh:
            raise WireError(f"message for mesh {msg.mesh!r}, this is mesh {self.options.mesh!r}")
        self._check_key(msg)
        mtype = msg.type
        if mtype in ("hello", "heartbeat", "gossip", "ping"):
            self._heard(msg)
            if mtype == "gossip":
                self.learn(msg.body["peers"])
            if mtype == "ping":
                self.transport.closes_soon(msg.origin, msg.sender)  # a ping's connection closes once answered
                self._take_news(msg.body["news"])
                return self.message("pong", {**self.identity(), "news": self._news_out()})
            if mtype == "hello":
                return self.message("welcome", {**self.identity(), "peers": self.peers.snapshot()})
            return None
        if mtype == "leave":
            change = self.peers.left(msg.sender)
            if change:
                self._changed(change)
            return None
        if mtype == "status_req":
            status = {**self.identity(), "name": self.name, "peers": self.peers.snapshot()}
            if self.progress is not None:
                learning = self.progress()
                try:  # a bug in what it tells must not cost the status itself (p2pfed mesh status)
                    check_value(learning, LEARNING, "learning")
                    status["learning"] = learning
                except SchemaError as exc:
                    log.error("%s: its learning progress breaks the wire's bounds, left out of its status: %s",
                              self.name, exc)
            return self.message("status", status)
        change = self.peers.touched(msg.sender)
        if change:
            self._changed(change)
        handler = self._handlers.get(mtype)
        if handler is None:
            raise WireError(f"{self.role} {self.name} does not take {mtype} messages")
        answer = await handler(msg)
        self.peers.asked(msg.sender)  # answered: partners from now until the window ends, on both sides alike
        return answer


async def query_status(address: str, *, mesh: str = "default", keys: security.Keys | None = None,
                       server_key: bytes | None = None, timeout: float = 5.0, insecure: bool = False) -> Message:
    """Ask the member at address (or ticket tcp://HOST:PORT/KEY) for its view of the mesh, without joining:
    with a key pair of this process's own unless keys are given (a closed mesh's), or none if insecure."""
    address, in_ticket = security.split_ticket(address)
    server_key = server_key or in_ticket
    if not insecure:
        keys = keys or security.ephemeral_keys()
        if server_key is None:
            raise ValueError(security.missing_key(address, "asking"))
    transport = Transport(f"status-{time.time_ns() % 100000}", _no_handler, keys=None if insecure else keys,
                          limits=NO_TENSORS)
    try:
        msg = Message("status_req", transport.name, mesh=mesh)
        return await transport.request(address, msg, timeout, server_key)
    finally:
        await transport.close()


async def _no_handler(msg: Message) -> Message | None:
    raise WireError("this client takes no messages")
