"""Bounds on what one sender can cost a member: how many log lines its refusals write, how many of its
messages are handled per second. A flood from one peer (or one made-up name after another) must neither
fill the disk with log lines nor starve the event loop that keeps a member's heartbeats on time.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def remember(table: OrderedDict[K, V], key: K, value: V, cap: int) -> None:
    """table[key] = value as its most recent entry, forgetting the least recent ones beyond cap: what a member
    keeps per sender (or per made-up name) stays bounded however many there are."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > cap:
        table.popitem(last=False)


class LogLimiter:
    """Lets through at most ``per_key`` lines per key and ``total`` lines in all per ``window`` seconds;
    what it held back is counted and told in one line when the key next speaks after its window, named by
    ``what`` it limits and at the highest level it held (held info lines are no warning)."""

    def __init__(self, log: logging.Logger, per_key: int = 5, total: int = 50, window: float = 10.0,
                 max_keys: int = 1024, clock: Callable[[], float] = time.monotonic,
                 what: str = "refusals of messages") -> None:
        self.log, self.per_key, self.total, self.window, self.max_keys = log, per_key, total, window, max_keys
        self.clock, self.what = clock, what
        # key -> [window start, lines, held, highest level held]
        self.keys: OrderedDict[str, list[float | int]] = OrderedDict()
        self.start, self.lines, self.held, self.held_level = clock(), 0, 0, logging.NOTSET

    def warning(self, key: str, msg: str, *args: object) -> None:
        """log.warning(msg, *args) unless key (or everyone) has had its share of lines in this window."""
        self.emit(logging.WARNING, key, msg, *args)

    def info(self, key: str, msg: str, *args: object) -> None:
        """log.info(msg, *args), within the same limits."""
        self.emit(logging.INFO, key, msg, *args)

    def emit(self, level: int, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        """Log msg at level (with the exception being handled if exc_info) unless key (or everyone) has had
        its share of lines in this window."""
        now = self.clock()
        if now - self.start >= self.window:
            if self.held:
                self.log.log(self.held_level, "%s: %d more not logged in the last %.0f s", self.what, self.held,
                             now - self.start)
            self.start, self.lines, self.held, self.held_level = now, 0, 0, logging.NOTSET
        entry = self.keys.get(key)
        if entry is None or now - entry[0] >= self.window:
            if entry is not None and entry[2]:
                self.log.log(int(entry[3]), "%s (%s): %d more not logged in the last %.0f s", self.what, key,
                             entry[2], now - entry[0])
            entry = [now, 0, 0, logging.NOTSET]
        remember(self.keys, key, entry, self.max_keys)
        if entry[1] >= self.per_key or self.lines >= self.total:
            entry[2] += 1
            entry[3] = max(entry[3], level)
            self.held += 1
            self.held_level = max(self.held_level, level)
            return
        entry[1] += 1
        self.lines += 1
        self.log.log(level, msg, *args, exc_info=exc_info)


class RateLimiter:
    """A token bucket per key: ``rate`` messages per second with bursts of ``burst``; allow() says whether
    one more message of key may be handled now."""

    def __init__(self, rate: float, burst: float, max_keys: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_keys, self.clock = rate, burst, max_keys, clock
        self.buckets: OrderedDict[bytes, list[float]] = OrderedDict()  # key -> [tokens, last refill]

    def allow(self, key: bytes) -> bool:
        """Take a token of key's bucket if there is one."""
        now = self.clock()
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = [self.burst, now]
            while len(self.buckets) > self.max_keys:
                self.buckets.popitem(last=False)
        else:
            self.buckets.move_to_end(key)
            bucket[0] = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
        if bucket[0] < 1.0:
            return False
        bucket[0] -= 1.0
        return True
