"""A learning node's recovery: a restarted node goes on at once, whatever the peers it started with do."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from p2pfed.net.endpoint import Endpoint
from tests.node.test_learner import checkpointed, node, records, scenario


async def test_a_restarted_node_does_not_wait_for_peers_that_have_finished(
        tmp_path: Path, members: Callable[..., Endpoint]) -> None:
    s = scenario(tmp_path)
    checkpointed(s, members, tmp_path)
    again = node(s, members, tmp_path)
    t0 = time.monotonic()
    # the run started with 3 peers, which have all finished and left by now: nobody to wait for
    await again.run(start_round=5, wait_for_peers=3, start_timeout=60)
    assert time.monotonic() - t0 < 20  # it waited up to 120 s (--wait-for) before
    assert [r["round"] for r in records(tmp_path) if r["event"] == "round"] == [5]
