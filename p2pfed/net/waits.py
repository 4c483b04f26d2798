"""Waiting for the first of several things on the event loop: an event set, a future done, a stop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first_of(*things: asyncio.Event | asyncio.Future[Any], timeout: float | None = None) -> None:
    """Return once one of things has happened (an event is set, a future is done) or timeout seconds passed.
    The futures given stay the caller's (never cancelled here); the waits made for the events end here."""
    made = {thing: asyncio.ensure_future(thing.wait()) for thing in things if isinstance(thing, asyncio.Event)}
    waits = [made[t] if isinstance(t, asyncio.Event) else t for t in things]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in made.values():
            wait.cancel()


async def unless_stopped(stop: asyncio.Event, work: Awaitable[Any]) -> bool:
    """Run work until it ends or stop is set; return False if stop came first (work is then cancelled). An
    exception of work is raised."""
    task = asyncio.ensure_future(work)
    try:
        await first_of(task, stop)
    finally:
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        return False
    task.result()
    return True
