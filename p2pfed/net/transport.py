"""How bytes move between nodes: one bound ROUTER for everything a node receives, one DEALER per peer
for everything it sends, replies matched to requests by message id.

Delivery rules (DESIGN.md, "no silent loss"):
- ``request`` waits for the receiver's reply (an ack at least) and raises DeliveryError on timeout or
  when the receiver refused the message; it never returns without knowing.
- Dealers use ZMQ_IMMEDIATE, so nothing queues towards a peer that is not connected, and sends block
  (awaited, never dropped) at the high-water mark. The ROUTER is ZMQ_ROUTER_MANDATORY, so a reply that
  cannot be routed raises instead of vanishing.
- ZMQ_MAXMSGSIZE caps what a peer may send; a larger message disconnects that peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import typing
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from p2pfed.net import security
from p2pfed.wire import DEFAULT_LIMITS, NO_REPLY, Limits, Message, WireError, decode, encode, peek_field, peek_sender

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[Message | None]]


class DeliveryError(RuntimeError):
    """A request was not acknowledged in time or the receiver refused it."""


@dataclass(frozen=True)
class TransportOptions:
    """Socket tuning; the defaults are generous for models of hundreds of MB."""

    max_message_bytes: int = 1 << 30
    sndhwm: int = 64
    rcvhwm: int = 256
    reconnect_ivl_ms: int = 100
    reconnect_ivl_max_ms: int = 2000
    socket_buffer_bytes: int = -1  # -1 keeps the kernel's autotuning, which beat fixed sizes on loopback


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
    ) -> None:
        self.name = name
        self.handler = handler
        self.keys = keys
        self.options = options or TransportOptions()
        self.limits = Limits(**{**limits.__dict__, "max_message_bytes": self.options.max_message_bytes})
        # One context per node: the ZAP allow-list is per context, and nodes of one process may differ.
        self.ctx = zmq.asyncio.Context()
        self.auth = security.start_authenticator(self.ctx, keys) if keys else None
        self.router: zmq.asyncio.Socket | None = None
        self.address = ""
        self.dealers: dict[str, zmq.asyncio.Socket] = {}
        self.dealer_tasks: dict[str, asyncio.Task[None]] = {}
        self.pending: dict[str, asyncio.Future[Message]] = {}
        self.in_flight: Counter[str] = Counter()  # requests waiting for a reply, by address
        self.tasks: list[asyncio.Task[None]] = []
        self.handling: set[asyncio.Task[None]] = set()
        self.bytes_sent = 0
        self.bytes_received = 0
        self.dropped = 0

    # -- lifecycle -------------------------------------------------------------------------------
    def bind(self, address: str) -> str:
        """Bind the ROUTER; a port of 0 or * picks a free one. Return the bound address."""
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self.options.max_message_bytes)
        sock.setsockopt(zmq.RCVHWM, self.options.rcvhwm)
        sock.setsockopt(zmq.SNDHWM, self.options.sndhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDBUF, self.options.socket_buffer_bytes)
        sock.setsockopt(zmq.RCVBUF, self.options.socket_buffer_bytes)
        if self.keys:
            security.make_server(sock, self.keys)
        host, _, port = address.rpartition(":")
        try:
            if port in ("0", "*"):
                sock.bind(f"{host}:*")
            else:
                sock.bind(address)
        except zmq.ZMQError as exc:
            sock.close()
            raise OSError(f"cannot bind {address}: {exc}") from None
        self.router = sock
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.tasks.append(asyncio.get_running_loop().create_task(self._receive_loop(), name=f"{self.name}-recv"))
        return self.address

    async def close(self, linger_ms: int = 0) -> None:
        """Stop every task and close every socket, giving queued sends up to linger_ms to leave."""
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(DeliveryError("transport closed"))
        for task in [*self.tasks, *self.dealer_tasks.values(), *self.handling]:
            task.cancel()
        for task in [*self.tasks, *self.dealer_tasks.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for sock in self.dealers.values():
            sock.close(linger=linger_ms)
        self.dealers.clear()
        self.dealer_tasks.clear()
        if self.router is not None:
            self.router.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()

    # -- sending ---------------------------------------------------------------------------------
    def _dealer(self, address: str, server_key: bytes | None) -> zmq.asyncio.Socket:
        sock = self.dealers.get(address)
        if sock is not None:
            return sock
        if self.keys and server_key is None:
            raise DeliveryError(f"no public key known for {address}; a keyed mesh needs one for every peer")
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.options.sndhwm)
        sock.setsockopt(zmq.RCVHWM, self.options.rcvhwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.options.max_message_bytes)
        sock.setsockopt(zmq.RECONNECT_IVL, self.options.reconnect_ivl_ms)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, self.options.reconnect_ivl_max_ms)
        sock.setsockopt(zmq.SNDBUF, self.options.socket_buffer_bytes)
        sock.setsockopt(zmq.RCVBUF, self.options.socket_buffer_bytes)
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        if self.keys and server_key is not None:
            security.make_client(sock, self.keys, server_key)
        sock.connect(address)
        self.dealers[address] = sock
        self.dealer_tasks[address] = asyncio.get_running_loop().create_task(
            self._dealer_loop(address, sock), name=f"{self.name}-dealer-{address}"
        )
        return sock

    def forget(self, address: str) -> None:
        """Close the connection to address (a dead peer), freeing its queue."""
        sock = self.dealers.pop(address, None)
        task = self.dealer_tasks.pop(address, None)
        if task is not None:
            task.cancel()
        if sock is not None:
            sock.close(linger=0)

    def send_nowait(self, address: str, msg: Message, server_key: bytes | None = None) -> bool:
        """Send a small message that needs no reply (heartbeat, gossip); return False if it could not go now."""
        try:
            frames = encode(msg)
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
        self.bytes_sent += sum(memoryview(f).nbytes for f in frames)
        return True

    async def request(
        self, address: str, msg: Message, timeout: float, server_key: bytes | None = None
    ) -> Message:
        """Send msg and wait for its reply; raise DeliveryError if refused or not answered within timeout."""
        if msg.type in NO_REPLY:
            raise ValueError(f"{msg.type} messages get no reply; use send_nowait")
        frames = encode(msg)
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.pending[msg.id] = fut
        self.in_flight[address] += 1
        try:
            sock = self._dealer(address, server_key)
            async with asyncio.timeout(timeout):
                await sock.send_multipart(frames, copy=False)
                self.bytes_sent += sum(memoryview(f).nbytes for f in frames)
                reply = await fut
        except TimeoutError:
            raise DeliveryError(f"{msg.type} {msg.id[:8]} to {address} not acknowledged within {timeout:g}s") from None
        except zmq.ZMQError as exc:  # the context is ending
            raise DeliveryError(f"{msg.type} {msg.id[:8]} to {address} failed: {exc}") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller cancelled us
            # pyzmq cancels a pending send when its socket is closed (forget): that is a failed delivery.
            raise DeliveryError(f"{msg.type} {msg.id[:8]} to {address}: connection closed while sending") from None
        finally:
            self.pending.pop(msg.id, None)
            self.in_flight[address] -= 1
            if not self.in_flight[address]:
                del self.in_flight[address]
        if reply.type == "ack" and not reply.body["ok"]:
            raise DeliveryError(f"{address} refused {msg.type}: {reply.body['reason']}")
        return reply

    async def _dealer_loop(self, address: str, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart(copy=False)
            try:
                reply = decode([f.buffer for f in frames], self.limits)
            except WireError as exc:
                self.dropped += 1
                log.warning("%s: dropped reply from %s (%s): %s", self.name, peek_sender(frames[0].buffer),
                            address, exc)
                # The request it answers fails now rather than at its timeout (the reply came and was bad).
                fut = self.pending.get(peek_field(frames[0].buffer, "id"))
                if fut is not None and not fut.done():
                    fut.set_exception(DeliveryError(f"reply from {address} refused: {exc}"))
                continue
            self.bytes_received += sum(len(f) for f in frames)
            fut = self.pending.get(reply.id)
            if fut is not None and not fut.done():
                fut.set_result(reply)

    # -- receiving -------------------------------------------------------------------------------
    async def _receive_loop(self) -> None:
        assert self.router is not None
        while True:
            frames = await self.router.recv_multipart(copy=False)
            routing_id, parts = frames[0].bytes, frames[1:]
            self.bytes_received += sum(len(f) for f in parts)
            try:
                msg = decode([f.buffer for f in parts], self.limits)
            except WireError as exc:
                self.dropped += 1
                origin = frames[1].get("Peer-Address") if len(frames) > 1 else "?"
                sender = peek_sender(parts[0].buffer) if parts else "?"
                log.warning("%s: dropped message from %s at %s: %s", self.name, sender, origin, exc)
                continue
            if self.keys is not None:
                msg.key = str(frames[1].get("User-Id") or "")  # set by our ZAP handler: the client's public key
            task = asyncio.get_running_loop().create_task(self._handle(routing_id, msg))
            self.handling.add(task)
            task.add_done_callback(self.handling.discard)

    async def _handle(self, routing_id: bytes, msg: Message) -> None:
        try:
            reply = await self.handler(msg)
        except WireError as exc:  # the message parsed but broke a rule of its content (e.g. shapes)
            self.dropped += 1
            log.warning("%s: refused %s from %s: %s", self.name, msg.type, msg.sender, exc)
            reply = Message("ack", self.name, body={"ref": msg.id, "ok": False, "reason": str(exc)[:500]})
        except Exception as exc:
            log.exception("%s: handling %s from %s failed", self.name, msg.type, msg.sender)
            reply = Message("ack", self.name, body={"ref": msg.id, "ok": False, "reason": repr(exc)[:500]})
        if msg.type in NO_REPLY:
            return
        if reply is None:
            reply = Message("ack", self.name, body={"ref": msg.id, "ok": True, "reason": ""})
        reply.id = msg.id
        await self.reply(routing_id, reply)

    async def reply(self, routing_id: bytes, reply: Message, timeout: float = 30.0) -> None:
        """Send a reply back to the dealer it answers; log (never hide) a reply that cannot go."""
        assert self.router is not None
        frames = encode(reply)
        try:
            async with asyncio.timeout(timeout):
                await self.router.send_multipart([routing_id, *frames], copy=False)
            self.bytes_sent += sum(memoryview(f).nbytes for f in frames)
        except (zmq.ZMQError, TimeoutError) as exc:
            log.warning("%s: reply %s to a request could not be sent: %s", self.name, reply.type, exc)
