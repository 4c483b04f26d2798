"""The peer table's rules: direct contact decides liveness, gossip only introduces, restarts replace."""

from __future__ import annotations

import pytest

from p2pfed.net.membership import ALIVE, DEAD, JOINING, LEFT, SUSPECT, PeerTable, Refused


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def table() -> tuple[PeerTable, Clock]:
    clock = Clock()
    return PeerTable("me", suspect_after=3, dead_after=6, forget_after=60, clock=clock), clock


def hear(t: PeerTable, name: str = "a", inc: int = 1, address: str = "tcp://1.2.3.4:5") -> object:
    return t.heard_from(name, address, "node", inc, "", 0)


def test_silent_peer_goes_suspect_then_dead_then_is_forgotten() -> None:
    t, clock = table()
    assert hear(t).new == ALIVE
    clock.t += 2
    assert t.sweep() == []
    clock.t += 2
    assert [(c.name, c.new) for c in t.sweep()] == [("a", SUSPECT)]
    assert t.live()  # suspect peers are still waited for
    clock.t += 3
    assert [(c.name, c.new) for c in t.sweep()] == [("a", DEAD)]
    assert not t.live()
    clock.t += 61
    t.sweep()
    assert "a" not in t.peers


def test_a_peer_with_a_slower_heartbeat_is_judged_by_its_own_period() -> None:
    t, clock = table()  # our period is 1 s: suspect after 3 s, dead after 6 s
    t.heard_from("slow", "tcp://h:1", "node", 1, "", 0, period=4.0)
    hear(t, "fast")
    clock.t += 5
    assert [(c.name, c.new) for c in t.sweep()] == [("fast", SUSPECT)]
    clock.t += 8  # 13 s of silence: more than 3 of its own 4 s periods
    assert ("slow", SUSPECT) in [(c.name, c.new) for c in t.sweep()]


def test_heard_again_revives() -> None:
    t, clock = table()
    hear(t)
    clock.t += 10
    t.sweep()
    assert t.peers["a"].state == DEAD
    change = hear(t)
    assert (change.old, change.new) == (DEAD, ALIVE)


def test_restart_with_same_name_rejoins_and_stale_messages_are_ignored() -> None:
    t, clock = table()
    hear(t, inc=1, address="tcp://h:1")
    clock.t += 1.0  # the old process missed a heartbeat period
    change = hear(t, inc=2, address="tcp://h:1")  # restarted on the same address: the old process is gone
    assert change.new == "rejoined" and t.peers["a"].incarnation == 2
    clock.t += 3.5  # silent long enough to be suspect: a restart on another address is taken now
    t.sweep()
    change = hear(t, inc=3, address="tcp://h:2")
    assert change.new == "rejoined" and t.peers["a"].address == "tcp://h:2"
    assert hear(t, inc=1, address="tcp://h:1") is None  # the old process's late heartbeat
    assert t.peers["a"].address == "tcp://h:2"


def test_a_live_name_cannot_be_taken_from_another_address() -> None:
    t, clock = table()
    hear(t, inc=5, address="tcp://h:1")
    with pytest.raises(Refused, match="a is alive at tcp://h:1"):
        hear(t, inc=6, address="tcp://evil:1")  # a newer incarnation elsewhere does not take a live name
    assert t.peers["a"].address == "tcp://h:1" and t.peers["a"].incarnation == 5
    clock.t += 1
    assert hear(t, inc=5, address="tcp://h:1") is None and t.peers["a"].state == ALIVE


def test_an_incarnation_from_the_future_is_refused() -> None:
    t, _ = table()
    t.wall_ns = lambda: 10**18
    with pytest.raises(Refused, match="future"):
        hear(t, "b", inc=10**18 + 11 * 60 * 10**9)
    assert hear(t, "b", inc=10**18 + 5 * 60 * 10**9).new == ALIVE  # five minutes of clock skew are fine
    info = {"name": "c", "address": "tcp://h:3", "role": "node", "incarnation": 2**62, "pubkey": "",
            "state": ALIVE, "age": 0.0, "round": 0}
    assert not t.learned_of(info) and "c" not in t.peers


def test_at_most_max_peers_are_known_and_the_longest_dead_make_room() -> None:
    t, clock = table()
    t.max_peers = 3
    for name in "abc":
        hear(t, name)
    with pytest.raises(Refused, match="3 members are known"):
        hear(t, "d")
    info = {"name": "e", "address": "tcp://h:3", "role": "node", "incarnation": 1, "pubkey": "",
            "state": ALIVE, "age": 0.0, "round": 0}
    assert not t.learned_of(info)
    t.left("b")
    clock.t += 1
    t.left("a")
    assert hear(t, "d").new == ALIVE and set(t.peers) == {"a", "c", "d"}  # b, dead longest, made room
    assert t.learned_of(info) and set(t.peers) == {"c", "d", "e"}


def test_a_very_slow_peer_is_still_suspected_in_the_end() -> None:
    t, clock = table()
    t.heard_from("lazy", "tcp://h:1", "node", 1, "", 0, period=60.0)  # claims a minute between heartbeats
    clock.t += 31  # our 3 s of patience stretched at most tenfold
    assert ("lazy", SUSPECT) in [(c.name, c.new) for c in t.sweep()]


def test_gossip_introduces_but_never_revives() -> None:
    t, clock = table()
    info = {"name": "b", "address": "tcp://h:3", "role": "node", "incarnation": 5, "pubkey": "",
            "state": ALIVE, "age": 0.0, "round": 0}
    assert t.learned_of(info)
    assert t.peers["b"].state == JOINING
    assert not t.learned_of(info)  # already known
    clock.t += 7
    t.sweep()
    assert t.peers["b"].state == DEAD  # never heard from directly
    assert not t.learned_of(info)  # same incarnation: stale gossip cannot revive it
    assert t.learned_of({**info, "incarnation": 6})  # but a restart can be introduced
    assert not t.learned_of({**info, "name": "me"})
    assert not t.learned_of({**info, "name": "c", "state": DEAD})


def test_leave_and_last_will() -> None:
    t, _ = table()
    hear(t, "a")
    hear(t, "b", inc=3)
    assert t.left("a").new == LEFT
    assert t.mark_dead("b", incarnation=2) is None  # a will of an older incarnation
    assert t.mark_dead("b", incarnation=3).new == DEAD
    assert [p["state"] for p in t.snapshot()] == [LEFT, DEAD]


def test_own_name_is_never_a_peer() -> None:
    t, _ = table()
    assert t.heard_from("me", "tcp://x:1", "node", 1, "", 0) is None
    assert t.peers == {}


def test_a_live_process_does_not_move_and_a_newer_one_waits_until_the_old_is_silent() -> None:
    t, clock = table()
    hear(t, inc=5, address="tcp://h:1")
    with pytest.raises(Refused, match="its process does not move") as moved:
        hear(t, inc=5, address="tcp://evil:1")  # the same process claimed from elsewhere: never
    assert not moved.value.transient
    clock.t += 0.5
    with pytest.raises(Refused, match="once the old one has fallen silent") as early:
        hear(t, inc=6, address="tcp://h:1")  # a newer process while the old one still heartbeats
    assert early.value.transient and t.peers["a"].incarnation == 5
    clock.t += 1.0  # the old one missed a period: a restart on the same address is taken
    assert hear(t, inc=6, address="tcp://h:1").new == "rejoined"
    assert t.heard_from("a", "tcp://elsewhere:1", "node", 7, "", 0, authenticated=True).new == "rejoined"


def test_gossip_may_fill_a_quarter_of_the_table_and_direct_contact_evicts_it() -> None:
    t, clock = table()
    t.max_peers = 8
    entry = {"role": "node", "pubkey": "", "state": ALIVE, "age": 0.0, "round": 0}
    taken = [t.learned_of({**entry, "name": f"g{i}", "address": f"tcp://h:{i + 1}", "incarnation": 1})
             for i in range(5)]
    assert taken == [True, True, False, False, False]  # 8 // 4 introduced and never heard from
    for name in "abcdef":
        hear(t, name)
    assert len(t.peers) == 8
    assert hear(t, "z").new == ALIVE and "g0" not in t.peers  # a member heard directly evicts a never-heard one
    clock.t += 5
    assert t.learned_of({**entry, "name": "g1", "address": "tcp://h:2", "incarnation": 2})  # renewed by gossip...
    assert t.peers["g1"].last_seen == 100.0  # ... but it keeps its first introduction's time: it still dies
