"""The live peer table: who is in the mesh, where, and whether they are still heard from.

Pure bookkeeping, no sockets. Liveness comes only from direct contact (a message from the peer itself);
gossip only introduces peers, so stale gossip can never revive a dead peer. Each process start has a new
incarnation number (its start time in ns), so a node that restarts with the same name replaces its old
entry.

Names are bound to keys (trust on first use): the first key that speaks for a name directly is that
name's key from then on, kept after the member itself is forgotten (up to ``4 * max_peers`` bindings,
the oldest dropped first), and contact for the name with any other key is refused. Gossip only proposes
a key for a name nobody has spoken for yet, and never changes a binding. So with keys (the default), only
the name's own key can change its entry: a restart (a newer incarnation) is taken at once, and nothing
another sender claims (an incarnation, a round, an address) is believed for that name.

Under the probing membership (the default, net/endpoint.py) a member hears directly, every period, only from
the peers it works with (its partners: models or requests exchanged lately), so only their silence is timed
(``sweep(watched=...)``), once their own contact shows they know they are partners. Any other peer is suspect
only when a probe of it goes unanswered (``suspect``), and dead when it then stays silent. A third party's word
that a peer is suspect or dead changes nothing here: it only makes the member probe that peer itself.

Without keys (an --insecure mesh) a name is trusted on its word, and a live member's entry
cannot be taken: a new incarnation is taken once the old process has missed a heartbeat period (a
restart elsewhere, once it is suspect), the same incarnation never moves to another address, and an
incarnation more than ten minutes in the future is refused. At most ``max_peers`` members are known, and
at most a quarter of them introduced by gossip without being heard from yet: a new name beyond that
replaces a long-dead or never-heard one, or is refused for now.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from p2pfed.net.throttle import remember

JOINING, ALIVE, SUSPECT, DEAD, LEFT = "joining", "alive", "suspect", "dead", "left"
LIVE_STATES = frozenset({ALIVE, SUSPECT})
MAX_FUTURE_NS = 600 * 10**9  # an incarnation (a start time) ten minutes ahead of our clock is made up
MAX_PERIOD_RATIO = 10.0  # a peer's slower heartbeat stretches our patience at most this much


class Refused(ValueError):
    """Contact from a peer that this table will not take (the message is refused, the table unchanged);
    transient when it may be taken later (the old process of its name has not fallen silent yet)."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass
class Peer:
    """What this node knows of one other member of the mesh."""

    name: str
    address: str
    role: str = "node"
    incarnation: int = 0
    pubkey: str = ""
    state: str = JOINING
    last_seen: float = 0.0
    round: int = 0
    dead_since: float | None = None
    period: float = 0.0  # the peer's own heartbeat period, 0 if not yet heard from it
    last_work: float = float("-inf")  # its last contact other than membership (a model, a request, a reply)
    last_asked: float = float("-inf")  # the last time this member worked with it (sent it a request, answered one)
    # a peer gossip introduced (joining): when this member first reached out to it (None: not yet, its ping
    # waiting its turn behind others). Its silence counts from then, not from the hearing: a member that hears of
    # 999 at once pings them over minutes.
    introduced: float | None = None
    # dead only because it never answered its introduction (a joining peer's silence): not heard from, not known
    # to have failed (a request may introduce it again, Endpoint.introduces)
    unintroduced: bool = False
    # listed as alive by a member this one joined through (its welcome, or its table asked for), under lazy
    # introduction: outside the quarter of the table news may fill (PeerTable._room_for)
    vouched: bool = False

    def as_wire(self, now: float) -> dict[str, Any]:
        """The peer as the PEER schema of the wire carries it."""
        return {
            "name": self.name,
            "address": self.address,
            "role": self.role,
            "incarnation": self.incarnation,
            "pubkey": self.pubkey,
            "state": self.state,
            "age": round(max(0.0, now - self.last_seen), 3),
            "round": self.round,
        }


@dataclass
class Change:
    """A peer moved from one state to another (old is None for a peer first seen)."""

    name: str
    old: str | None
    new: str


@dataclass
class PeerTable:
    """Peers by name, with the timing rules that move them between states."""

    me: str
    suspect_after: float = 3.0
    dead_after: float = 6.0
    forget_after: float = 600.0
    period: float = 1.0  # this member's heartbeat period; suspect_after and dead_after were set for it
    max_peers: int = 1024
    # lazy introduction (net/endpoint.py): a joining peer not spoken to yet waits to be worked with, not timed; where
    # the peers only heard of fill their quarter of the table, a newer one heard of takes the place of the oldest
    # (news is likelier current than an old mention: a member gone meanwhile is never timed out)
    patient: bool = False
    clock: Callable[[], float] = time.monotonic
    wall_ns: Callable[[], int] = time.time_ns
    peers: dict[str, Peer] = field(default_factory=dict)
    bound: OrderedDict[str, str] = field(default_factory=OrderedDict)  # name -> its key, oldest binding first
    # name -> when this member last worked with it (touched or asked), the latest last: partners() reads back from
    # the end to the window's start, not the whole table (twice a period, for each of a process's members;
    # benchmarks/beat.py). That holds while last_work and last_asked are written by touched() and asked() alone,
    # and the clock never goes back.
    worked: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def key_of(self, name: str) -> str:
        """The key that may speak for name: its bound key, else the key gossip proposed for it while it has
        not spoken yet (joining, or dead only because its introduction went unanswered: not known to have failed,
        only slow to answer, and maybe sure of this member, whose ping it had), else "" (nobody known by that
        name). (With that key forgotten, 250 lazy members refused 72 "choices" notes of peers whose pongs came late,
        and one cluster was found split.)"""
        key = self.bound.get(name)
        if key is not None:
            return key
        peer = self.peers.get(name)
        if peer is None or not (peer.state == JOINING or (peer.state == DEAD and peer.unintroduced)):
            return ""
        return peer.pubkey

    def bind(self, name: str, key: str) -> None:
        """Bind name to key (its first direct contact proved the key); raise Refused if another key has it."""
        held = self.bound.get(name)
        if held is not None and held != key:
            raise Refused(f"{name} is bound to another key (the one it first spoke with): a message for {name} "
                          f"with key {key[:8]}... is not {name}'s")
        remember(self.bound, name, key, 4 * self.max_peers)

    def _room_for(self, name: str, heard: bool, vouched: bool = False) -> bool:
        """True if name is known or may be added: making room by forgetting the longest-dead peer, or, for a
        peer heard from directly, the oldest one only introduced by gossip. Gossip alone may fill at most a
        quarter of the table (so made-up names in gossip cannot keep real members out); patient, a newer name
        takes the place of the oldest there not being introduced. Patient, a name a member this one joined
        through listed as alive (vouched) is outside that quarter: it may fill the table, a newer one taking the
        place of the oldest peer heard of and not being introduced (a lazy member knows about K members live
        and every other one only heard of: at 1,000 members, K + 256 with that list in the quarter)."""
        if name in self.peers:
            return True
        if not heard and not vouched and sum(p.state == JOINING and not p.vouched for p in self.peers.values()) >= \
                max(1, self.max_peers // 4):
            waiting = [p for p in self.peers.values() if p.state == JOINING and p.introduced is None and not p.vouched]
            if not self.patient or not waiting:
                return False
            del self.peers[min(waiting, key=lambda p: p.last_seen).name]
            return True
        if len(self.peers) < self.max_peers:
            return True
        gone = [p for p in self.peers.values() if p.state in (DEAD, LEFT)]
        if gone:
            del self.peers[min(gone, key=lambda p: p.dead_since or 0.0).name]
            return True
        unheard = [p for p in self.peers.values() if p.state == JOINING and (heard or p.introduced is None)]
        if (heard or vouched) and unheard:
            del self.peers[min(unheard, key=lambda p: p.last_seen).name]
            return True
        return False

    def heard_from(
        self, name: str, address: str, role: str, incarnation: int, pubkey: str, round_: int, period: float = 0.0,
        authenticated: bool = False, key: str = "",
    ) -> Change | None:
        """Record direct contact from a peer that came with key (the sender's CURVE key, "" without keys);
        return the state change it caused, if any. Raise Refused for contact with a key other than the name's
        bound one, and, for contact that proves no key (unless authenticated: a closed mesh's allow-list
        proved the name), for contact that would take a live member's entry; and for contact from the
        future or beyond max_peers."""
        if name == self.me:
            return None
        if key:
            held = self.bound.get(name)
            if held is not None and held != key:
                self.bind(name, key)  # raises, saying why
            authenticated = True
        if incarnation > self.wall_ns() + MAX_FUTURE_NS:
            raise Refused(f"{name} claims an incarnation (start time) more than ten minutes in the future")
        now = self.clock()
        peer = self.peers.get(name)
        if peer is None:
            if not self._room_for(name, heard=True):
                raise Refused(f"{self.max_peers} members are known and alive; not taking {name} now", transient=True)
            if key:
                self.bind(name, key)
            self.peers[name] = Peer(name, address, role, incarnation, pubkey, ALIVE, now, round_, period=period)
            return Change(name, None, ALIVE)
        if incarnation < peer.incarnation:
            return None  # a message of a process that has since restarted
        if key:
            self.bind(name, key)  # direct contact proves the key: it replaces a key gossip proposed
        if not authenticated and peer.state == ALIVE and peer.incarnation:
            if incarnation == peer.incarnation and address != peer.address:
                raise Refused(f"{name} is at {peer.address}; its process does not move to {address}")
            silent = now - peer.last_seen >= max(self.period, min(peer.period, MAX_PERIOD_RATIO * self.period))
            if incarnation > peer.incarnation and (address != peer.address or not silent):
                raise Refused(f"{name} is alive at {peer.address}; a new process of that name is taken once the "
                              "old one has fallen silent", transient=True)
        restarted = incarnation > peer.incarnation and peer.incarnation != 0
        old = peer.state
        peer.address, peer.role, peer.incarnation, peer.pubkey = address, role, incarnation, pubkey
        peer.last_seen, peer.round, peer.state, peer.dead_since = now, round_, ALIVE, None
        peer.period, peer.unintroduced = period, False
        if restarted:
            return Change(name, old, "rejoined")
        return Change(name, old, ALIVE) if old != ALIVE else None

    def touched(self, name: str) -> Change | None:
        """Direct contact other than a heartbeat (a model, a request): a known peer that is not dead or gone is
        alive (one introduced by gossip may send its first model before its first heartbeat arrives)."""
        peer = self.peers.get(name)
        if peer is None or peer.state in (DEAD, LEFT):
            return None
        peer.last_seen = peer.last_work = self.clock()
        self._worked(name, peer.last_work)
        if peer.state == ALIVE:
            return None
        old, peer.state = peer.state, ALIVE
        return Change(name, old, ALIVE)

    def learned_of(self, info: dict[str, Any], vouched: bool = False) -> bool:
        """Take a peer from gossip; return True if it is new (or a newer incarnation) and should be contacted.
        vouched: listed by a member this one joined through (its welcome, its table), which, patient, has a room of
        its own (_room_for)."""
        name = info["name"]
        # (eager: every peer heard of is pinged and timed at once, one quarter; and a lister vouches only for the
        # members it heard itself, not those it too only heard of)
        vouched = vouched and self.patient and info["state"] in (ALIVE, SUSPECT)
        if name == self.me or info.get("state") not in (ALIVE, SUSPECT, JOINING):
            return False
        held = self.bound.get(name)
        if held is not None and info["pubkey"] != held:
            return False  # gossip never rebinds a name: we would dial, and believe, another key
        peer = self.peers.get(name)
        if peer is not None and info["incarnation"] <= peer.incarnation:
            if vouched and peer.state == JOINING:
                peer.vouched = True  # heard of in news first: it leaves news's quarter
            return False
        if peer is not None and peer.state in LIVE_STATES:
            return False  # we hear from it ourselves; our own contact decides
        if info["incarnation"] > self.wall_ns() + MAX_FUTURE_NS or not self._room_for(name, False, vouched):
            return False
        # An entry gossip keeps renewing must still fall silent on time: it keeps its first introduction's time.
        since, introduced = self.clock(), None
        if peer is not None and peer.state == JOINING:
            since, introduced, vouched = peer.last_seen, peer.introduced, vouched or peer.vouched
        self.peers[name] = Peer(
            name, info["address"], info["role"], info["incarnation"], info["pubkey"], JOINING, since, info["round"],
            introduced=introduced, vouched=vouched,
        )
        return True

    def introducing(self, name: str) -> None:
        """This member reaches out to name, a peer gossip introduced (a ping or heartbeat is on its way): its
        silence is timed from now on, once (a first word asked again does not renew it)."""
        peer = self.peers.get(name)
        if peer is not None and peer.state == JOINING and peer.introduced is None:
            peer.introduced = self.clock()

    def left(self, name: str) -> Change | None:
        """Record a graceful leave."""
        peer = self.peers.get(name)
        if peer is None or peer.state == LEFT:
            return None
        old, peer.state, peer.dead_since = peer.state, LEFT, self.clock()
        return Change(name, old, LEFT)

    def mark_dead(self, name: str, incarnation: int | None = None) -> Change | None:
        """Record that a peer is known dead (e.g. its last will arrived), unless it has since restarted."""
        peer = self.peers.get(name)
        if peer is None or peer.state == LEFT or (incarnation is not None and incarnation < peer.incarnation):
            return None
        peer.unintroduced = False  # known to have failed, not only silent to its introduction
        if peer.state == DEAD:
            return None
        old, peer.state, peer.dead_since = peer.state, DEAD, self.clock()
        return Change(name, old, DEAD)

    def _ratio(self, peer: Peer) -> float:
        # A peer that heartbeats more slowly than we do is judged by its own period: otherwise a node
        # configured for fast failure detection would flap on every member left at the default.
        return min(MAX_PERIOD_RATIO, max(1.0, peer.period / self.period))

    def suspect(self, name: str, incarnation: int) -> Change | None:
        """A probe of an alive peer went unanswered: it is suspect now, and dead once it has stayed silent for
        the rest of dead_after (as long as a peer whose silence is timed takes from suspect to dead). Nothing
        for a peer that has since restarted, or is not alive."""
        peer = self.peers.get(name)
        if peer is None or peer.state != ALIVE or peer.incarnation != incarnation:
            return None
        peer.state = SUSPECT
        peer.last_seen = max(peer.last_seen, self.clock() - self.suspect_after * self._ratio(peer))
        return Change(name, ALIVE, SUSPECT)

    def asked(self, name: str) -> None:
        """This member works with name now (sends it a request, or has answered one of its requests)."""
        peer = self.peers.get(name)
        if peer is not None and peer.state in LIVE_STATES:
            peer.last_asked = self.clock()
            self._worked(name, peer.last_asked)

    def _worked(self, name: str, when: float) -> None:
        self.worked.pop(name, None)
        self.worked[name] = when  # the latest last
        if len(self.worked) > 2 * self.max_peers:  # names forgotten by the table: dropped, the oldest first
            for old in [n for n in self.worked if n not in self.peers][: len(self.worked) - self.max_peers]:
                del self.worked[old]

    def partners(self, within: float, heard: bool = False) -> set[str]:
        """The live peers worked with in the last within seconds: either way, or (heard) those whose own contact
        says so, which therefore know it too and heartbeat this member (their silence may be timed)."""
        since = self.clock() - within
        found: set[str] = set()
        for name in reversed(self.worked):
            if self.worked[name] < since:
                break  # the rest worked with earlier still
            p = self.peers.get(name)  # (an entry gossip replaced since, for a new process of the name: no work)
            if p is not None and p.state in LIVE_STATES and (
                    p.last_work if heard else max(p.last_work, p.last_asked)) >= since:
                found.add(name)
        return found

    def sweep(self, watched: set[str] | None = None) -> list[Change]:
        """Apply the timing rules: silent peers become suspect, then dead; long-dead peers are forgotten. With
        watched, only those alive peers' silence makes them suspect (the others are heard from only when probed);
        a suspect or joining peer's silence makes it dead either way. A joining peer not spoken to yet is timed
        from nothing: dead after forget_after (its introduction was due, and never went), or, patient (lazy
        introduction: it is introduced when worked with), never."""
        now = self.clock()
        changes = []
        # An alive peer whose silence is not timed (heard from only when probed) has nothing to time: most of a
        # large table, every period. Left out in one comprehension, several times cheaper than the loop below a peer.
        todo = list(self.peers.items()) if watched is None else [
            (name, peer) for name, peer in self.peers.items() if peer.state != ALIVE or name in watched]
        for name, peer in todo:
            if peer.state in (DEAD, LEFT):  # (first: at 1,000 nodes forming, some 600 of a table for a while)
                if now - (peer.dead_since or now) > self.forget_after:
                    del self.peers[name]
                continue
            since = peer.last_seen
            if peer.state == JOINING:
                if peer.introduced is None and (self.patient or now - peer.last_seen <= self.forget_after):
                    continue  # not yet spoken to (its ping waits its turn): its silence says nothing yet
                since = peer.introduced if peer.introduced is not None else -math.inf
            silent = (now - since) / self._ratio(peer)
            timed = watched is None or name in watched
            if peer.state == ALIVE and timed and silent > self.suspect_after:
                peer.state = SUSPECT
                changes.append(Change(name, ALIVE, SUSPECT))
            if peer.state in (SUSPECT, JOINING) and silent > self.dead_after:
                changes.append(Change(name, peer.state, DEAD))
                peer.unintroduced = peer.state == JOINING
                peer.state, peer.dead_since = DEAD, now
        return changes

    def live(self) -> list[Peer]:
        """Peers currently alive or suspect (still worth talking to and waiting for)."""
        return [p for p in self.peers.values() if p.state in LIVE_STATES]

    def live_names(self, role: str) -> list[str]:
        """The sorted names of the live peers of one role (e.g. the learning nodes, not the bootstrap)."""
        return sorted(p.name for p in self.live() if p.role == role)

    def by_state(self, *states: str) -> list[Peer]:
        """Peers in any of the given states."""
        return [p for p in self.peers.values() if p.state in states]

    def snapshot(self) -> list[dict[str, Any]]:
        """Every known peer in wire form, sorted by name."""
        now = self.clock()
        return [self.peers[n].as_wire(now) for n in sorted(self.peers)]
