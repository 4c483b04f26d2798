"""Fixtures every test may use: transports and mesh members that are closed whatever the test does.

A test that fails with sockets still open must fail, not hang: pytest would otherwise stop at exit in
libzmq's context teardown (a context waits for its sockets), and in CI a regression would look like a
hung job. Tests make their transports and members through these fixtures; the fixture closes them, and
as a last resort every context still open when the session ends is destroyed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import zmq
import zmq.asyncio
import zmq.utils.garbage

from p2pfed.net.endpoint import Endpoint
from p2pfed.net.transport import Transport
from p2pfed.wire import Message


@pytest.fixture(autouse=True)
def key_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Members started by a test (in this process or as `p2pfed` processes, which inherit the environment) keep
    their key pairs in a folder of the test's own, never in the home folder of whoever runs the tests."""
    home = tmp_path_factory.mktemp("p2pfed-home")
    monkeypatch.setenv("P2PFED_HOME", str(home))
    return home / "keys"


def destroy(transport: Transport) -> None:
    """Close every socket of a transport's context at once, without waiting (safe after close())."""
    if transport.auth is not None:
        with contextlib.suppress(Exception):
            transport.auth.stop()
    if not transport.ctx.closed:
        transport.ctx.destroy(linger=0)


class Inbox(list[Message]):
    """A handler that keeps what it receives and acknowledges it."""

    async def __call__(self, msg: Message) -> Message | None:
        self.append(msg)
        return None


@pytest.fixture
async def transports() -> AsyncIterator[Callable[..., Transport]]:
    """make(name, handler=None, bind=True, **options) -> a bound Transport, closed after the test."""
    made: list[Transport] = []

    def make(name: str, handler: Any = None, bind: bool = True, **kw: Any) -> Transport:
        transport = Transport(name, handler if handler is not None else Inbox(), **kw)
        made.append(transport)
        if bind:
            transport.bind("tcp://127.0.0.1:0")
        return transport

    yield make
    for transport in reversed(made):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(transport.close(), 5)
        destroy(transport)


@pytest.fixture
async def members() -> AsyncIterator[Callable[..., Endpoint]]:
    """make(name, role='node', **endpoint_options) -> an Endpoint (not started), stopped after the test."""
    made: list[Endpoint] = []

    def make(name: str, role: str = "node", **kw: Any) -> Endpoint:
        endpoint = Endpoint(name, role, **kw)
        made.append(endpoint)
        return endpoint

    yield make
    for endpoint in reversed(made):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(endpoint.stop(leave=False), 5)
        destroy(endpoint.transport)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Last resort: destroy every context a test left open, so the process can exit.

    A transport's own teardown first (its authenticator thread), then any zmq context still alive: a test
    stopped by its timeout can leave a context whose Transport is already collected, and that context's
    ``__del__`` would otherwise wait for its sockets at interpreter exit.
    """
    contexts = (zmq.Context, zmq.asyncio.Context)
    zero_copy = zmq.utils.garbage.gc._context  # pyzmq's own, for zero-copy sends: its thread ends it at exit
    for obj in gc.get_objects():
        if type(obj) is Transport:  # type(): isinstance would wake torch's lazy modules
            with contextlib.suppress(Exception):
                destroy(obj)
    for obj in gc.get_objects():
        if type(obj) in contexts and obj is not zero_copy and not obj.closed:
            with contextlib.suppress(Exception):
                obj.destroy(linger=0)
