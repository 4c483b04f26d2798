"""Waiting for the first of several things: events, futures, a stop."""

from __future__ import annotations

import asyncio

import pytest

from p2pfed.net.waits import first_of, unless_stopped


async def test_first_of_returns_when_an_event_is_set_or_a_future_is_done_and_leaves_futures_alone() -> None:
    a, b = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, b.set)
    await asyncio.wait_for(first_of(a, b), 2)
    pending: asyncio.Future[int] = loop.create_future()
    loop.call_later(0.05, pending.set_result, 7)
    await asyncio.wait_for(first_of(pending, a), 2)
    assert pending.result() == 7
    other: asyncio.Future[int] = loop.create_future()
    b.set()
    await first_of(other, b)
    assert not other.done()  # the caller's future is not cancelled
    t0 = loop.time()
    await first_of(a, other, timeout=0.1)  # nothing happens: the timeout ends the wait
    assert loop.time() - t0 >= 0.09 and not other.done()
    await asyncio.sleep(0)  # the waits of the calls above end
    before = len(asyncio.all_tasks())
    await first_of(a, timeout=0)
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before  # the event's wait ended with the call


async def test_unless_stopped_runs_work_to_its_end_or_cancels_it_at_stop() -> None:
    stop = asyncio.Event()

    async def work(seconds: float, fail: bool = False) -> int:
        await asyncio.sleep(seconds)
        if fail:
            raise RuntimeError("work failed")
        return 1

    assert await unless_stopped(stop, work(0.01)) is True
    with pytest.raises(RuntimeError, match="work failed"):
        await unless_stopped(stop, work(0.01, fail=True))
    long = asyncio.ensure_future(work(60))
    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await asyncio.wait_for(unless_stopped(stop, long), 2) is False
    await asyncio.sleep(0)
    assert long.cancelled()
