"""How bytes move between nodes: one bound ROUTER for everything a node receives, one DEALER per peer
for everything it sends, replies matched to requests by message id.

Delivery rules (docs/design.md, "no silent loss"):
- ``request`` waits for the receiver's reply (an ack at least) and raises DeliveryError on timeout or
  when the receiver refused the message; it never returns without knowing.
- Dealers use ZMQ_IMMEDIATE, so nothing queues towards a peer that is not connected, and sends block
  (awaited, never dropped) at the high-water mark. The ROUTER is ZMQ_ROUTER_MANDATORY, so a reply that
  cannot be routed raises instead of vanishing.
- ZMQ_MAXMSGSIZE caps what a peer may send; a larger message disconnects that peer (a socket monitor logs
  inbound connections that close, with the peer's address, a few lines per address and window).
- Bounded cost per sender: at most ``max_dealers`` outgoing connections (the idle one scored lowest by
  ``keep_scores``, else the least recently used, is closed for a new one), and the members of one process
  (one event loop) together at most what its open-files limit allows (``connection_budget``: the loop's least
  recently used idle connection, whoever's, is closed for a new one; and, the files the process holds counted,
  FILES_SPARE of them are kept free whatever else holds them), inbound messages decoded at
  most ``rate`` per second per connection (the rest are dropped undecoded), the receive loop yields to the
  event loop every few messages so heartbeats keep their period under a flood and survives any error of
  one message, and refusals are logged a few lines per sender and window, each echoing ~200 characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import resource
import socket
import time
import typing
import weakref
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from p2pfed.net import security
from p2pfed.net.throttle import LogLimiter, RateLimiter, remember
from p2pfed.wire import (
    DEFAULT_LIMITS,
    GOODBYE,
    NO_REPLY,
    SCHEMAS,
    Limits,
    Message,
    TryLater,
    WireError,
    decode,
    encode,
    peek,
)
from p2pfed.wire.messages import clip, cut

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[Message | None]]


class DeliveryError(RuntimeError):
    """A request was not acknowledged in time or the receiver refused it."""


class BadAddress(DeliveryError):
    """An address that libzmq cannot dial at all (the peer that advertised it cannot be reached)."""


class OutOfFiles(DeliveryError):
    """This process is too near its open-files limit to open a connection: its own trouble, not a peer's (errno
    EMFILE, as the OSError it forestalls, so that out_of_files and the runner's help line read it alike)."""

    errno = errno.EMFILE


class Refusal(DeliveryError):
    """The other side said no (a negative ack, or a handshake it refused): reason says why, in its words;
    retry says it may say yes later (e.g. a restarted member whose old process is not silent yet); round is the
    round the other side said it is at (0 where it said none)."""

    def __init__(self, message: str, reason: str, retry: bool = False, round: int = 0) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry = retry
        self.round = round


# What a connection's handshake failure means, for the member that tried (libzmq's monitor events).
_HANDSHAKE: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "it refused this member's key (not in its allow-list)",
    # CURVE's client learns no more when the server cannot decrypt its hello: the usual cause is a key that is not
    # the one the member there holds
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the connection's handshake failed: is the key dialled (the ticket's, or "
                                          "--join-key) the one of the member at that address?",
}
_MISMATCH = ("one side uses CURVE keys (the default) and the other runs --insecure: every member of a mesh "
             "needs keys, or every one --insecure")


@dataclass(frozen=True)
class TransportOptions:
    """Socket tuning; the defaults are generous for models of hundreds of MB."""

    max_message_bytes: int = 1 << 30
    sndhwm: int = 64
    rcvhwm: int = 256
    reconnect_ivl_ms: int = 100
    reconnect_ivl_max_ms: int = 2000
    socket_buffer_bytes: int = -1  # -1 keeps the kernel's autotuning, which beat fixed sizes on loopback
    max_dealers: int = 1024  # open outgoing connections (as many as members known); an idle one makes room
    rate: float = 500.0  # inbound messages handled per second and connection (bursts of 2x): above, dropped
    yield_every: int = 16  # the receive loop lets other tasks run after this many messages in a row


# A lane is a second connection to the same address, keyed apart from the first: a probe's ping travels on its own
# lane so that it never queues behind a large model on the way to the same peer (its delay would read as silence).
PROBE_LANE = "probe "  # the prefix of the probe lane's key (no address holds a space)


# Every member of a process opens its connections from the process's one limit of open files: past it, the next
# socket of any member fails ("Too many open files") whatever its own max_dealers says. So the connections of a
# loop's members are capped together, from that limit (read when a connection opens: a run may raise it).
FILES_PER_CONNECTION = 3  # a connection between two members of one process: the dealer's socket, both TCP ends
FILES_KEPT = 1024  # left to all else: routers, monitors, contexts' threads, handshake watches, checkpoints, logs
# The model above sees neither the members' own files (about 9 each: 250 members hold 2,250) nor the inbound ends of
# other processes' connections: so the files are also counted before a connection opens. Within FILES_SPARE of the
# limit idle connections are closed for it; a new one is refused only within FILES_FLOOR (a checkpoint, a log).
FILES_SPARE = 256
FILES_FLOOR = 64
RECOUNT_S = 0.1  # where counting means listing the files, at most once in this many seconds (estimated between)


def open_files() -> int:
    """How many files this process holds open: counted, not modelled, or 0 where this system cannot tell."""
    return _open_files_at_no_cost() or _listed_open_files()


def _open_files_at_no_cost() -> int:
    """The count Linux 6.2 on gives as the size of /proc/self/fd (0 where it does not)."""
    with contextlib.suppress(OSError):
        return os.stat("/proc/self/fd").st_size
    return 0


def _listed_open_files() -> int:
    """The files this process holds, listed: ~1 ms per 1,000 files (0 where there is no folder to list)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return len(os.listdir(folder)) - 1  # less the listing's own
    return 0


def connection_budget() -> int:
    """The outgoing connections the members of this process may hold together."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(64, (soft - FILES_KEPT) // FILES_PER_CONNECTION)


class _Connections:
    """The outgoing connections of one event loop's transports (a process's members), least recently used
    first. A member about to open one past the budget closes the loop's least recently used idle connection
    first, whoever's: a connection closed is opened again when next needed (a handshake), where a socket past
    the limit fails its send. (Per loop, not per process: a connection is closed only by its own loop.)"""

    def __init__(self) -> None:
        self.lru: OrderedDict[tuple[int, str], weakref.ref[Transport]] = OrderedDict()
        # the files the process held at the last listing, and when (where they cannot be counted at no cost)
        self.files, self.files_at = 0, -math.inf

    def used(self, transport: Transport, key: str) -> None:
        entry = (id(transport), key)
        ref = self.lru.get(entry)
        if ref is not None and ref() is transport:
            self.lru.move_to_end(entry)
        else:  # new, or a transport gone whose id a new one has now
            self.lru.pop(entry, None)
            self.lru[entry] = weakref.ref(transport)
            self.files += FILES_PER_CONNECTION

    def open_files(self) -> int:
        """The files the process holds: counted where that costs nothing, else listed at most every RECOUNT_S and
        estimated in between (FILES_PER_CONNECTION more for each connection opened since)."""
        held = _open_files_at_no_cost()
        if held:
            return held
        now = time.monotonic()
        if now - self.files_at >= RECOUNT_S:
            self.files, self.files_at = _listed_open_files(), now
        return self.files

    def closed(self, transport: Transport, key: str) -> None:
        self.lru.pop((id(transport), key), None)

    def make_room(self) -> None:
        """Close the least recently used idle connection of the loop if the budget is spent, or two if the process
        holds files within FILES_SPARE of its limit (files the budget cannot see: members' own, the inbound ends
        of other processes' connections; two, so that a process whose inbound share keeps growing comes back
        under); raise DeliveryError when every connection is busy."""
        most = connection_budget()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        held = self.open_files() if soft != resource.RLIM_INFINITY else 0
        short = soft != resource.RLIM_INFINITY and held > soft - FILES_SPARE
        if len(self.lru) < most and not short:
            return
        stale, victims = [], []
        for entry, ref in self.lru.items():
            owner = ref()
            if owner is None or owner.closed or entry[1] not in owner.dealers:
                stale.append(entry)  # a transport gone, or closed without forgetting (close clears its own)
            elif not owner.in_flight.get(entry[1]):
                victims.append((owner, entry[1]))
                if len(victims) == (2 if short else 1):
                    break
        for entry in stale:
            del self.lru[entry]
        for owner, key in victims:
            owner.forget(key)
        if victims:
            return
        # (closing lags: libzmq's thread closes a socket's files a moment later, so a count just after still has
        # them, and the next call may close two more: a few connections too many closed, never a file too many)
        if short and held + FILES_PER_CONNECTION > soft - FILES_FLOOR:
            raise OutOfFiles(f"too many open files: this process holds {held} of its limit of {soft}, and every "
                             "connection is busy: raise the limit (ulimit -n) or spread the members over more "
                             "worker processes")
        if len(self.lru) >= most:
            raise DeliveryError(f"this process's {most} connections (its open-files limit's share) are all busy")


_connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Connections] = weakref.WeakKeyDictionary()


def loop_connections() -> _Connections | None:
    """The running loop's connections (None outside a loop: nothing to count)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    found = _connections.get(loop)
    if found is None:
        found = _connections[loop] = _Connections()
    return found


class Unanswered(DeliveryError):
    """A request sent and not answered in time: the only failure that says something of the peer's liveness."""


class Transport:
    """The sockets of one node: bind, send, request, reply."""

    def __init__(
        self,
        name: str,
        handler: Handler,
        *,
        keys: security.Keys | None = None,
        options: TransportOptions | None = None,
        limits: Limits = DEFAULT_LIMITS,
        mesh: str = "default",
    ) -> None:
        self.name = name
        self.mesh = mesh  # the mesh this member's acknowledgements are sent in
        self.handler = handler
        self.keys = keys
        self.options = options or TransportOptions()
        self.limits = Limits(**{**limits.__dict__, "max_message_bytes": self.options.max_message_bytes})
        # One context per node: the ZAP allow-list is per context, and nodes of one process may differ.
        self.ctx = zmq.asyncio.Context()
        # libzmq's default of 1,023 sockets per context is below what the dealer cap may need, and each
        # socket holds a file or two: raise both limits to what the cap needs. ctx.set, not ctx.setsockopt: the
        # latter is a default for the context's sockets, where libzmq ignores an option it has not.
        self.ctx.set(zmq.MAX_SOCKETS, self.options.max_dealers + 64)
        allow_open_files(3 * self.options.max_dealers + 256)
        # The ZAP handler serves the bound ROUTER only, and needs the running loop: started by bind().
        self.auth: security.ZapHandler | None = None
        self.router: zmq.asyncio.Socket | None = None
        self.monitor: zmq.asyncio.Socket | None = None
        self.connections: dict[int, str] = {}  # inbound connections the monitor has seen: fd -> host:port
        # host -> names whose "leave" came from there and whose connection has not closed yet: the close that
        # follows a goodbye is logged as the leave it is (libzmq tells the connection's fd, not its messages')
        # (and whether the close is a matter of course, said quietly: closes_soon)
        self.goodbyes: OrderedDict[str, list[tuple[str, bool]]] = OrderedDict()
        self.address = ""
        self.dealers: OrderedDict[str, zmq.asyncio.Socket] = OrderedDict()  # least recently used first
        # When the dealer cap is reached, which connection to close: the member sets this to score addresses
        # (e.g. when the peer there was last heard from); the lowest-scored idle connection goes.
        self.keep_scores: Callable[[], dict[str, float]] | None = None
        self.dealer_tasks: dict[str, asyncio.Task[None]] = {}
        # (address, message id) -> the reply it waits for: one message may be requested of several peers at once
        self.pending: dict[tuple[str, str], asyncio.Future[Message]] = {}
        self.in_flight: Counter[str] = Counter()  # requests waiting for a reply, by address
        # address -> (why its handshake failed, whether the other side refused us): watched addresses only
        self.handshakes: dict[str, tuple[str, bool]] = {}
        self.watches: dict[str, zmq.asyncio.Socket] = {}  # address -> the monitor of its connection's handshakes
        self.tasks: list[asyncio.Task[None]] = []
        self.handling: set[asyncio.Task[None]] = set()
        self.closed = False
        self.bytes_sent = 0
        self.bytes_received = 0
        # what went out, by message type: how many and how many bytes (benchmarks/membership.py reads them)
        self.sent: Counter[str] = Counter()
        self.sent_bytes: Counter[str] = Counter()
        self.dropped = 0
        self.refusals = LogLimiter(log)
        self.closings = LogLimiter(log, what="closed connections")  # their own budget, not the refusals'
        self.inbound = RateLimiter(self.options.rate, 2 * self.options.rate)

    # -- lifecycle -------------------------------------------------------------------------------
    def bind(self, address: str) -> str:
        """Bind the ROUTER; a port of 0 or * picks a free one. Return the bound address."""
        o = self.options
        sock = self._socket(zmq.ROUTER, [
            (zmq.ROUTER_MANDATORY, 1), (zmq.MAXMSGSIZE, o.max_message_bytes), (zmq.RCVHWM, o.rcvhwm),
            (zmq.SNDHWM, o.sndhwm), (zmq.LINGER, 0), (zmq.SNDBUF, o.socket_buffer_bytes),
            (zmq.RCVBUF, o.socket_buffer_bytes)])
        host, _, port = address.rpartition(":")
        with _closed_on_failure(sock):
            if self.keys:
                if self.auth is None:
                    self.auth = security.start_authenticator(self.ctx, self.keys)
                security.make_server(sock, self.keys)
            try:
                sock.bind(f"{host}:*" if port in ("0", "*") else address)
            except zmq.ZMQError as exc:
                raise OSError(f"cannot bind {address}: {exc}") from None
        self.router = sock
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        loop = asyncio.get_running_loop()
        self.tasks.append(loop.create_task(self._receive_loop(), name=f"{self.name}-recv"))
        self.monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.tasks.append(loop.create_task(self._watch_connections(self.monitor), name=f"{self.name}-monitor"))
        return self.address

    async def close(self, linger_ms: int = 0) -> None:
        """Stop every task and close every socket, giving queued sends up to linger_ms to leave."""
        self.closed = True  # no socket is made from now on: one made while closing would hold ctx.term() for ever
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(DeliveryError("transport closed"))
                # Read here once: a request still sending never awaits its reply's future, and asyncio would log
                # the failure as never retrieved. A request that awaits it still gets it.
                fut.exception()
        for task in [*self.tasks, *self.dealer_tasks.values(), *self.handling]:
            task.cancel()
        # Sockets first, then their monitors: a monitor closed while its socket lives blocks libzmq's I/O thread
        # at the socket's next event (a reconnect, a disconnect), and ctx.term() then waits for ever. Monitors
        # are closed here, not by their tasks: a task cancelled before its first step never runs its finally.
        shared = loop_connections()
        for key, sock in self.dealers.items():
            sock.close(linger=linger_ms)
            if shared is not None:
                shared.closed(self, key)
        if self.router is not None:
            self.router.close(linger=0)  # not disable_monitor(): it can block at this point
        for monitor in [*self.watches.values(), *([self.monitor] if self.monitor is not None else [])]:
            monitor.close(linger=0)
        for task in [*self.tasks, *self.dealer_tasks.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.dealers.clear()
        self.dealer_tasks.clear()
        self.watches.clear()
        if self.auth is not None:
            await self.auth.aclose()
        self.ctx.term()

    def _socket(self, kind: int, options: list[tuple[int, int]]) -> zmq.asyncio.Socket:
        """A socket of this transport's context with its options set, or none at all (see _closed_on_failure)."""
        sock = self.ctx.socket(kind)
        with _closed_on_failure(sock):
            for option, value in options:
                sock.setsockopt(option, value)
        return sock

    # -- sending ---------------------------------------------------------------------------------
    def _dealer(self, address: str, server_key: bytes | None, lane: str = "") -> zmq.asyncio.Socket:
        """The connection to address on lane ("" or PROBE_LANE), opened if there is none; it is keyed lane + address
        in dealers, in_flight and pending."""
        sock = self.dealers.get(lane + address)
        shared = loop_connections()
        if sock is not None:
            self.dealers.move_to_end(lane + address)
            if shared is not None:
                shared.used(self, lane + address)
            return sock
        if self.closed:
            raise DeliveryError(f"{self.name}'s transport is closed")
        if self.keys and server_key is None:
            raise DeliveryError(f"no public key known for {address}; a keyed mesh needs one for every peer")
        if len(self.dealers) >= self.options.max_dealers:
            idle = [a for a in self.dealers if not self.in_flight.get(a)]
            if not idle:
                raise DeliveryError(f"{self.options.max_dealers} connections are busy; not opening one to "
                                    f"{clip(address, 80)}")
            scores = self.keep_scores() if self.keep_scores is not None else {}
            self.forget(min(idle, key=lambda a: scores.get(a, float("-inf"))))  # min: the first of equals (LRU)
        if shared is not None:
            shared.make_room()
        o = self.options
        sock = self._socket(zmq.DEALER, [
            (zmq.IMMEDIATE, 1), (zmq.LINGER, 0), (zmq.SNDHWM, o.sndhwm), (zmq.RCVHWM, o.rcvhwm),
            (zmq.MAXMSGSIZE, o.max_message_bytes), (zmq.RECONNECT_IVL, o.reconnect_ivl_ms),
            (zmq.RECONNECT_IVL_MAX, o.reconnect_ivl_max_ms), (zmq.SNDBUF, o.socket_buffer_bytes),
            (zmq.RCVBUF, o.socket_buffer_bytes), (zmq.TCP_KEEPALIVE, 1)])
        with _closed_on_failure(sock):
            try:
                if self.keys and server_key is not None:
                    security.make_client(sock, self.keys, server_key)
                sock.connect(address)
            except zmq.ZMQError as exc:  # an address libzmq cannot dial: one bad peer, never the caller's task
                # libzmq's reason alone: pyzmq's text of the error repeats the whole address, which came from a peer
                reason = zmq.strerror(exc.errno) if exc.errno is not None else "refused by libzmq"
                raise BadAddress(f"cannot connect to {clip(address, 80)}: {reason}") from None
        self.dealers[lane + address] = sock
        if shared is not None:
            shared.used(self, lane + address)
        # A reply on this connection comes from whoever holds server_key (CURVE checked it): that is its key.
        key = server_key.decode() if self.keys and server_key is not None else ""
        self.dealer_tasks[lane + address] = asyncio.get_running_loop().create_task(
            self._dealer_loop(lane + address, sock, key), name=f"{self.name}-dealer-{lane}{address}"
        )
        return sock

    def forget(self, address: str) -> None:
        """Close the connection to address (a dead peer), freeing its queue; PROBE_LANE + address closes that
        address's probe lane."""
        sock = self.dealers.pop(address, None)
        shared = loop_connections()
        if sock is not None and shared is not None:
            shared.closed(self, address)
        task = self.dealer_tasks.pop(address, None)
        watch = self.dealer_tasks.pop(f"watch:{address}", None)
        for t in (task, watch):
            if t is not None:
                t.cancel()
        if sock is not None:
            sock.close(linger=0)
        monitor = self.watches.pop(address, None)
        if monitor is not None:  # after its socket (see close)
            monitor.close(linger=0)

    def watch(self, address: str, server_key: bytes | None = None) -> None:
        """Follow the handshakes of the connection to address, so that a request to it that is not answered
        says why when the other side told (a refused key, a keyed mesh met without keys): for joins. The watch
        lasts as long as the connection (forget ends both, the socket first): a monitor closed while its socket
        lives blocks libzmq's I/O thread at that socket's next event (e.g. a reconnect), and with it every
        socket of the context."""
        sock = self._dealer(address, server_key)
        if f"watch:{address}" in self.dealer_tasks:
            return
        self.handshakes.pop(address, None)
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_CONNECT_RETRIED)
        self.watches[address] = monitor
        self.dealer_tasks[f"watch:{address}"] = asyncio.get_running_loop().create_task(
            self._watch_handshakes(address, monitor), name=f"{self.name}-watch-{address}")

    async def _watch_handshakes(self, address: str, monitor: zmq.asyncio.Socket) -> None:
        while True:
            event = await recv_monitor_message(monitor)
            self._note_handshake(address, int(event["event"]), int(event["value"]))

    def _note_handshake(self, address: str, kind: int, value: int) -> None:
        """Keep what a watched connection's last monitor event says of why address does not answer."""
        if kind == zmq.EVENT_CONNECT_RETRIED:
            # libzmq retries after a failed handshake too: the other side then did answer, and refused; a retry
            # says nothing answers only when no handshake has failed (under load the retry's event came before
            # the join read the reason, and a refused join waited out its whole timeout)
            if address not in self.handshakes:
                self.handshakes[address] = ("nothing answers there (connection refused)", False)
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            mismatch = value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
            self.handshakes[address] = (_MISMATCH if mismatch else
                                        f"the handshake failed (ZMTP protocol error {value:#x})", mismatch)
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH or not self.handshakes.get(address, ("", False))[1]:
            # a handshake that fails with no detail after a refusal is the retry's meeting the same refusal (seen
            # under load: the refusal's reason was lost, and a caller without keys waited out its timeout)
            self.handshakes[address] = (_HANDSHAKE[kind], kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH)

    def send_nowait(self, address: str, msg: Message, server_key: bytes | None = None,
                    frames: list[Any] | None = None) -> bool:
        """Send a small message that needs no reply (heartbeat, gossip); return False if it could not go now.
        frames: msg encoded already (the same message to several peers is encoded once)."""
        try:
            frames = encode(msg) if frames is None else frames
            # With NOBLOCK the asyncio socket tries the send at once and returns a finished future.
            fut = typing.cast("asyncio.Future[Any]", self._dealer(address, server_key).send_multipart(
                frames, flags=zmq.NOBLOCK, copy=False))
        except DeliveryError:
            return False
        exc = fut.exception() if fut.done() else None
        if not fut.done():
            fut.cancel()
            return False
        if exc is not None:
            if not isinstance(exc, zmq.Again):
                log.debug("%s: send to %s failed: %s", self.name, address, exc)
            return False
        self._count(msg.type, sum(memoryview(f).nbytes for f in frames))
        return True

    async def send(self, address: str, msg: Message, timeout: float, server_key: bytes | None = None) -> bool:
        """Send a small message that needs no reply, waiting up to timeout for its connection to open (a
        goodbye to a peer this member has not talked to yet); return False if it did not go."""
        frames = encode(msg)
        self.in_flight[address] += 1  # not a connection to close for another's while this waits to go
        try:
            sock = self._dealer(address, server_key)
            async with asyncio.timeout(timeout):
                await sock.send_multipart(frames, copy=False)
        except (DeliveryError, TimeoutError, zmq.ZMQError) as exc:
            log.debug("%s: %s to %s not sent: %s", self.name, msg.type, address, exc)
            return False
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller cancelled us
            return False  # pyzmq cancels a pending send when its socket is closed (forget)
        finally:
            self.in_flight[address] -= 1
            if not self.in_flight[address]:
                del self.in_flight[address]
        self._count(msg.type, sum(memoryview(f).nbytes for f in frames))
        return True

    def _count(self, mtype: str, size: int) -> None:
        self.bytes_sent += size
        self.sent[mtype] += 1
        self.sent_bytes[mtype] += size

    async def request(
        self, address: str, msg: Message, timeout: float, server_key: bytes | None = None, lane: str = ""
    ) -> Message:
        """Send msg and wait for its reply; raise DeliveryError if refused or not answered within timeout
        (Unanswered for the latter). lane: PROBE_LANE sends it on the address's second connection."""
        if msg.type in NO_REPLY:
            raise ValueError(f"{msg.type} messages get no reply; use send_nowait")
        frames = encode(msg)
        size = sum(memoryview(f).nbytes for f in frames)
        if size > self.options.max_message_bytes:
            raise DeliveryError(f"{msg.type} of {size / 2**20:.1f} MB exceeds max_message_mb "
                                f"({self.options.max_message_bytes / 2**20:.0f} MB): a receiver with the same cap "
                                "would drop it; raise [mesh] max_message_mb on every member")
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        key = lane + address
        self.pending[key, msg.id] = fut
        self.in_flight[key] += 1
        try:
            sock = self._dealer(address, server_key, lane)
            async with asyncio.timeout(timeout):
                await sock.send_multipart(frames, copy=False)
                self._count(msg.type, size)
                reply = await fut
        except TimeoutError:
            what = f"{msg.type} {msg.id[:8]} to {address} not acknowledged within {timeout:g}s"
            why, refused = self.handshakes.get(address, ("", False))
            if refused:
                raise Refusal(f"{what}: {why}", why) from None
            raise Unanswered(f"{what}: {why}" if why else what) from None
        except zmq.ZMQError as exc:  # the context is ending
            raise DeliveryError(f"{msg.type} {msg.id[:8]} to {address} failed: {exc}") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller cancelled us
            # pyzmq cancels a pending send when its socket is closed (forget): that is a failed delivery.
            raise DeliveryError(f"{msg.type} {msg.id[:8]} to {address}: connection closed while sending") from None
        finally:
            self.pending.pop((key, msg.id), None)
            self.in_flight[key] -= 1
            if not self.in_flight[key]:
                del self.in_flight[key]
        if reply.type == "ack" and not reply.body["ok"]:
            reason = cut(reply.body["reason"])
            raise Refusal(f"{address} refused {msg.type}: {reason}", reason, bool(reply.body.get("retry", False)),
                          reply.round)
        return reply

    async def _dealer_loop(self, address: str, sock: zmq.asyncio.Socket, key: str = "") -> None:
        while True:
            frames = await sock.recv_multipart(copy=False)
            try:
                reply = decode([f.buffer for f in frames], self.limits)
            except WireError as exc:
                self.dropped += 1
                seen = peek(frames[0].buffer)
                self.refusals.warning(address, "%s: dropped reply from %s (%s): %s", self.name, seen["sender"],
                                      address, cut(str(exc)))
                # The request it answers fails now rather than at its timeout (the reply came and was bad).
                fut = self.pending.get((address, seen["id"]))
                if fut is not None and not fut.done():
                    fut.set_exception(DeliveryError(f"reply from {address} refused: {exc}"))
                continue
            self.bytes_received += sum(len(f) for f in frames)
            reply.key = key
            fut = self.pending.get((address, reply.id))
            if fut is not None and not fut.done():
                fut.set_result(reply)

    # -- receiving -------------------------------------------------------------------------------
    async def _receive_loop(self) -> None:
        assert self.router is not None
        in_a_row = 0
        while True:
            frames = await self.router.recv_multipart(copy=False)
            # A queue of waiting messages is read without ever suspending: let heartbeats and handlers run.
            in_a_row += 1
            if in_a_row >= self.options.yield_every:
                in_a_row = 0
                await asyncio.sleep(0)
            try:
                self._received(frames)
            except Exception:  # a bug about one message must never end the member's receiving
                self.dropped += 1
                self.refusals.emit(logging.ERROR, "receive-bug", "%s: a received message could not be handled",
                                   self.name, exc_info=True)

    def _received(self, frames: list[zmq.Frame]) -> None:
        """Decode one received message and hand it to a handler task (or drop it, saying why)."""
        routing_id, parts = frames[0].bytes, frames[1:]
        self.bytes_received += sum(len(f) for f in parts)
        if not self.inbound.allow(routing_id):
            self.dropped += 1
            origin = _origin(parts[0])
            self.refusals.warning(f"flood:{origin}", "%s: dropping messages from a connection at %s: more than "
                                  "%.0f a second", self.name, origin, self.options.rate)
            return
        try:
            msg = decode([f.buffer for f in parts], self.limits)
        except WireError as exc:
            self.dropped += 1
            origin = _origin(parts[0])
            seen = peek(parts[0].buffer)
            self.refusals.warning(f"{seen['sender']}@{origin}", "%s: dropped %s from %s at %s: %s", self.name,
                                  "message" if seen["type"] == "?" else seen["type"], seen["sender"], origin,
                                  cut(str(exc)))
            if seen["type"] in SCHEMAS and seen["type"] not in NO_REPLY and seen["id"] != "?":
                # A request we can tell apart is told why, at once: its sender need not wait for a timeout.
                self._spawn(self.reply(routing_id, self._ack(seen["id"], cut(str(exc)))))
            return
        if self.keys is not None:
            msg.key = str(frames[1].get("User-Id") or "")  # set by our ZAP handler: the client's public key
        msg.origin = _origin(parts[0])
        if msg.type == GOODBYE:
            self._goodbye(msg.origin, msg.sender)
        self._spawn(self._handle(routing_id, msg))

    def closes_soon(self, host: str, sender: str) -> None:
        """Expect sender's connection from host to close as a matter of course (a probe's, once answered): its
        close is logged quietly, not as a peer that stopped or broke the message cap."""
        self._goodbye(host, sender, quiet=True)

    def _goodbye(self, host: str, sender: str, quiet: bool = False) -> None:
        """Remember that sender at host said goodbye, or (quiet) that its connection closes as a matter of course;
        a few per host, for a bounded number of hosts."""
        remember(self.goodbyes, host, [*self.goodbyes.get(host, []), (sender, quiet)][-8:], self.options.max_dealers)

    def _ack(self, ref: str, refusal: str | None = None, retry: bool = False, round: int = 0) -> Message:
        """The acknowledgement of request ref: a yes, or a no that says why (and whether to try again, and the
        round this member is at)."""
        body: dict[str, Any] = {"ref": ref, "ok": refusal is None, "reason": refusal or ""}
        if retry:
            body["retry"] = True
        return Message("ack", self.name, mesh=self.mesh, round=round, id=ref, body=body)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.handling.add(task)
        task.add_done_callback(self.handling.discard)

    async def _watch_connections(self, monitor: zmq.asyncio.Socket) -> None:
        """Log every inbound connection that closes, with the peer's address: libzmq closes the connection of
        a peer whose message exceeds max_message_mb without telling anyone else. A connection closed before the
        monitor saw it open (its first message was already too large) cannot be named any more."""
        peers = self.connections
        while True:  # the monitor is closed by close(), after the router
            event = await recv_monitor_message(monitor)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                peers[fd] = _peer_of(fd)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                who = peers.pop(fd, _UNSEEN)
                said = self.goodbyes.get(who.rsplit(":", 1)[0])
                if said:
                    name, quiet = said.pop(0)
                    if quiet:
                        log.debug("%s: connection from %s closed: %s probed this member", self.name, who, name)
                    else:
                        self.closings.info(who, "%s: connection from %s closed: %s left", self.name, who, name)
                else:
                    self.closings.info(who, "%s: connection from %s closed without a goodbye (the peer stopped, "
                                       "or sent a message over the %s MB cap)", self.name, who,
                                       _megabytes(self.options.max_message_bytes))

    async def _handle(self, routing_id: bytes, msg: Message) -> None:
        try:
            reply = await self.handler(msg)
        except WireError as exc:  # the message parsed but broke a rule of its content (e.g. shapes)
            self.dropped += 1
            reason = cut(str(exc))
            if isinstance(exc, TryLater) and exc.quiet:  # the normal course of things: no fault of anyone's
                log.debug("%s: %s from %s answered not yet: %s", self.name, msg.type, msg.sender, reason)
            else:
                self.refusals.warning(msg.sender, "%s: refused %s from %s: %s", self.name, msg.type, msg.sender,
                                      reason)
            later = exc if isinstance(exc, TryLater) else None
            reply = self._ack(msg.id, reason, retry=later is not None, round=later.round if later else 0)
        except Exception as exc:
            self.refusals.emit(logging.ERROR, f"bug:{msg.sender}", "%s: handling %s from %s failed", self.name,
                               msg.type, msg.sender, exc_info=True)
            reply = self._ack(msg.id, clip(exc, 300))
        if msg.type in NO_REPLY:
            return
        if reply is None:
            reply = self._ack(msg.id)
        reply.id = msg.id
        await self.reply(routing_id, reply)

    async def reply(self, routing_id: bytes, reply: Message, timeout: float = 30.0) -> None:
        """Send a reply back to the dealer it answers; log (never hide) a reply that cannot go."""
        assert self.router is not None
        try:
            frames = encode(reply)
        except (WireError, ValueError) as exc:  # this member's own answer breaks the wire's rules: a bug, said
            log.error("%s: reply %s to a request cannot be sent: %s", self.name, reply.type, cut(str(exc)))
            reply = self._ack(reply.id, f"the answer ({reply.type}) broke the wire's rules: {cut(str(exc))}")
            frames = encode(reply)
        try:
            async with asyncio.timeout(timeout):
                await self.router.send_multipart([routing_id, *frames], copy=False)
            self._count(reply.type, sum(memoryview(f).nbytes for f in frames))
        except zmq.ZMQError as exc:
            # a pong whose prober gave up waiting (under load) finds its connection closed: the prober has
            # counted the missed probe already, so this is no news (Host unreachable for every late pong)
            late_pong = reply.type == "pong" and exc.errno == zmq.EHOSTUNREACH
            log.log(logging.DEBUG if late_pong else logging.WARNING, "%s: reply %s to a request could not be sent: "
                    "%s", self.name, reply.type, exc)
        except TimeoutError:
            log.warning("%s: reply %s to a request could not be sent within %g s", self.name, reply.type, timeout)


_UNSEEN = "an address closed before it was seen"  # a connection the monitor could not name


@contextlib.contextmanager
def _closed_on_failure(sock: zmq.asyncio.Socket) -> Iterator[None]:
    """Close sock if what is done to it in the block fails (then re-raise): a socket the context still holds
    is one that close() must reach, or ctx.term() waits for it for ever."""
    try:
        yield
    except BaseException:
        sock.close(linger=0)
        raise


def _megabytes(size: int) -> str:
    """A byte count in MB as a person reads it: "1024", "0.0954" (not "1.02e+03")."""
    mb = size / 2**20
    return f"{mb:.0f}" if mb >= 100 else f"{mb:.3g}"


def _origin(frame: zmq.Frame) -> str:
    """The address of the connection a received frame came by (libzmq tags each one), for log lines. A ROUTER's
    message is the sender's routing id and at least one frame, so a message always has this frame."""
    return str(frame.get("Peer-Address") or "?")


def _peer_of(fd: int) -> str:
    """host:port of the remote end of a connected TCP socket, or why it cannot be told."""
    try:
        with socket.socket(fileno=socket.dup(fd)) as conn:
            host, port = conn.getpeername()[:2]
            return f"{host}:{port}"
    except OSError:
        return _UNSEEN


def allow_open_files(needed: int | None = None) -> None:
    """Raise this process's soft limit of open files towards needed, or as far as the hard limit goes when
    needed is None (never past it; child processes inherit it). A container may refuse: the limit then stays."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        needed = (hard if hard != resource.RLIM_INFINITY else 1 << 20) if needed is None else needed
        if soft != resource.RLIM_INFINITY and soft < needed:
            target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))


def out_of_files(exc: BaseException | None) -> bool:
    """Whether exc is 'too many open files' (an OSError, or pyzmq's ZMQError, which carries errno too), or was
    raised on account of one (a failed join or delivery that quotes it): this process's trouble, not a peer's."""
    for _ in range(8):  # a chain of causes, bounded
        if exc is None:
            return False
        if getattr(exc, "errno", None) in (errno.EMFILE, errno.ENFILE) or "too many open files" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False
