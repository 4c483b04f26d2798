"""LogLimiter: what it holds back is told in one line, named for what it held and at the level it was held."""

from __future__ import annotations

import logging

import pytest

from p2pfed.net.throttle import LogLimiter


def test_held_lines_of_closed_connections_are_told_as_such_and_at_their_own_level(
        caplog: pytest.LogCaptureFixture) -> None:
    # seen in a fmnist-noisy run: "WARNING ... 21 more refused messages were not logged in the last 13 s" in the
    # terminal of a run with no refusal at all: the held lines were info lines about connections that closed
    log = logging.getLogger("p2pfed.test.throttle")
    now = [0.0]
    closings = LogLimiter(log, per_key=1, total=2, clock=lambda: now[0], what="closed connections")
    with caplog.at_level(logging.INFO, logger=log.name):
        for peer in ("a", "a", "b", "c", "d"):
            closings.info(peer, "connection from %s closed", peer)
        now[0] = 11.0
        closings.info("a", "connection from %s closed", "a")
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [
        (logging.INFO, "connection from a closed"), (logging.INFO, "connection from b closed"),
        (logging.INFO, "closed connections: 3 more not logged in the last 11 s"),
        (logging.INFO, "closed connections (a): 1 more not logged in the last 11 s"),
        (logging.INFO, "connection from a closed")]


def test_held_warnings_are_told_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("p2pfed.test.throttle")
    now = [0.0]
    refusals = LogLimiter(log, per_key=1, total=5, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger=log.name):
        refusals.info("a", "a said too much")
        refusals.warning("a", "a refused")  # held: a warning among the held lines
        now[0] = 11.0
        refusals.info("b", "b said")
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [(logging.INFO, "a said too much"),
                    (logging.WARNING, "refusals of messages: 1 more not logged in the last 11 s"),
                    (logging.INFO, "b said")]
