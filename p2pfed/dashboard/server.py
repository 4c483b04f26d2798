"""p2pfed dashboard: a local web page of a live mesh (or a run folder), served by aiohttp.

The watcher asks the member at the join address for its status (the members it knows, with state, role,
round and last seen), then each learning member for its own status, whose LEARNING part tells its curve, its
choice of peers and its scores (wire/messages.py). It reads only what members already tell anyone who may
talk to the mesh, over CURVE like any member (a key pair of its own, or a closed mesh's allowed one; none if
insecure), dialing each member with the key the mesh knows it by. Every reply passes the wire's checks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from p2pfed.dashboard.view import live_view
from p2pfed.net import security
from p2pfed.net.throttle import LogLimiter
from p2pfed.net.transport import DeliveryError, Transport
from p2pfed.wire import Message, WireError
from p2pfed.wire.messages import cut

log = logging.getLogger(__name__)
# What aiohttp's server logs of the requests it serves (it writes to "aiohttp.server" unless told otherwise):
# a logger of ours, so that the filter serve() puts on it touches no other aiohttp server in the process.
http_log = logging.getLogger(f"{__name__}.http")

LEARNING_ROLES = ("node", "coordinator")


class MeshWatcher:
    """Polls a live mesh every `every` seconds and keeps its latest view (and the learning a member last told,
    after it is gone)."""

    def __init__(self, join: str, *, mesh: str = "default", keys: security.Keys | None = None,
                 join_key: bytes | None = None, every: float = 2.0, timeout: float = 3.0,
                 parallel: int = 16, insecure: bool = False) -> None:
        address, in_ticket = security.split_ticket(join)
        if not insecure:
            keys = keys or security.ephemeral_keys()
            join_key = join_key or in_ticket
            if join_key is None:
                raise ValueError(security.missing_key(address, "watching"))
        self.join, self.mesh, self.keys, self.join_key = address, mesh, None if insecure else keys, join_key
        self.every, self.timeout = every, timeout
        self.parallel = asyncio.Semaphore(parallel)
        self.learning: dict[str, dict[str, Any]] = {}
        self.view: dict[str, Any] = {"source": join, "live": True, "methods": {}, "error": "not polled yet"}
        self.transport: Transport | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.transport = Transport(f"dashboard-{time.time_ns() % 100000}", _no_handler, keys=self.keys,
                                   mesh=self.mesh)
        self.task = asyncio.get_running_loop().create_task(self._loop(), name="dashboard-watcher")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.transport is not None:
            await self.transport.close()

    async def _status(self, address: str, server_key: bytes | None) -> Message:
        assert self.transport is not None
        async with self.parallel:
            return await self.transport.request(address, Message("status_req", self.transport.name, mesh=self.mesh),
                                                self.timeout, server_key)

    async def poll(self) -> dict[str, Any]:
        """Ask the mesh once; return (and keep) its view."""
        try:
            reply = await self._status(self.join, self.join_key)
        except (DeliveryError, WireError) as exc:
            self.view = {**self.view, "error": f"no answer from {self.join}: {cut(str(exc), 200)}",
                         "updated": time.time()}
            return self.view
        body = reply.body
        peers = [{"name": reply.sender, "address": body["address"], "role": body["role"], "state": "alive",
                  "age": 0.0, "round": body["round"]}, *body["peers"]]
        if "learning" in body:
            self.learning[reply.sender] = body["learning"]
        asked = [p for p in peers[1:] if p["role"] in LEARNING_ROLES and p["state"] in ("alive", "suspect")]
        answers = await asyncio.gather(*(self._status(p["address"], self._key_of(p)) for p in asked),
                                       return_exceptions=True)
        for peer, answer in zip(asked, answers, strict=True):
            if isinstance(answer, Message) and answer.sender == peer["name"]:
                peer["round"] = answer.body["round"]  # its own word: fresher than what its last heartbeat said
                if "learning" in answer.body:
                    self.learning[peer["name"]] = answer.body["learning"]
        for gone in set(self.learning) - {p["name"] for p in peers}:  # forgotten by the mesh: forgotten here
            del self.learning[gone]
        self.view = {**live_view(self.join, peers, self.learning), "error": "", "updated": time.time()}
        return self.view

    def _key_of(self, peer: dict[str, Any]) -> bytes | None:
        """The key to dial a member with: its allowed key (closed mesh), else the key the mesh knows it by."""
        if self.keys is None:
            return None
        if self.keys.closed:
            return self.keys.key_of(peer["name"])
        return peer["pubkey"].encode() if peer.get("pubkey") else None

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception as exc:  # one bad poll must not end the page's updates
                log.exception("dashboard: polling %s failed", self.join)
                self.view = {**self.view, "error": cut(str(exc), 200), "updated": time.time()}
            await asyncio.sleep(self.every)


async def _no_handler(msg: Message) -> Message | None:
    raise WireError("the dashboard takes no messages")


def make_app(view: Callable[[], dict[str, Any]], local_only: bool = True) -> web.Application:
    """The page at / and its data at /api/view (what view() returns). local_only: answer only requests that
    name this machine (Host 127.0.0.1 or localhost), so a web page elsewhere cannot read the view through a
    name it points at 127.0.0.1 (DNS rebinding)."""
    page = resources.files("p2pfed.dashboard").joinpath("static/index.html").read_text()

    @web.middleware
    async def this_machine(request: web.Request, handler: Any) -> web.StreamResponse:
        host = (request.host or "").rsplit(":", 1)[0].strip("[]")
        if local_only and host not in ("127.0.0.1", "localhost", "::1"):
            return web.Response(status=403, text="p2pfed dashboard: served on this machine only (Host header)")
        response: web.StreamResponse = await handler(request)
        return response

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def data(_: web.Request) -> web.Response:
        try:
            return web.json_response(view())
        except (OSError, ValueError) as exc:  # a run folder being written, or gone
            return web.json_response({"methods": {}, "error": cut(str(exc), 200)})

    app = web.Application(middlewares=[this_machine])
    app.add_routes([web.get("/", index), web.get("/api/view", data)])
    return app


class BadRequestLog(logging.Filter):
    """Turns each request aiohttp could not parse (the client's fault: a request line over its 8190-byte limit,
    a malformed header) from a traceback of some 700 bytes into one short line, at most a few per client and
    window: a flood of such requests must not fill the disk. Other errors (a fault of ours) pass unchanged."""

    def __init__(self, limiter: LogLimiter) -> None:
        super().__init__()
        self.limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a bad request (told through the limiter instead), True for anything else."""
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True  # a handler's exception: its traceback is what finds the bug
        # aiohttp's line is "Error handling request from %s" with the client's address
        remote = str(record.args[0]) if isinstance(record.args, tuple) and record.args else "unknown"
        # a warning at most: aiohttp logs it as an error, but the fault is the client's, not ours
        self.limiter.emit(min(record.levelno, logging.WARNING), remote, "dashboard: refused a bad request from %s: %s",
                          remote, cut(exc.message, 120))
        return False


async def serve(app: web.Application, host: str, port: int, stop: asyncio.Event,
                started: Callable[[str], None] | None = None) -> None:
    """Serve app on host:port until stop is set; started(url) once it listens."""
    bad_requests = BadRequestLog(LogLimiter(log, per_key=5, total=20, what="bad requests"))
    http_log.addFilter(bad_requests)
    runner = web.AppRunner(app, access_log=None, logger=http_log)
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port  # the port picked, for --port 0
        if started is not None:
            started(f"http://{host}:{bound}/")
        await stop.wait()
    finally:
        await runner.cleanup()
        http_log.removeFilter(bad_requests)
