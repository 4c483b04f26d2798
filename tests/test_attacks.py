"""Well-formed hostile messages and floods over real sockets: none stops a member, a node or a mesh.

Each test is one attack that worked against the mesh before it was hardened: a rogue, which is not a member
but holds a key pair of its own (on an open mesh anyone may make one), sends what a member could send, in
its own name or in a member's, and the members must go on as if it had said nothing. The mesh is the
default one: keys, names bound to the key that first spoke for them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
import zmq
import zmq.asyncio

from p2pfed.launch.runner import prepare_data, scenario_node
from p2pfed.net import security
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.net.membership import ALIVE, SUSPECT
from p2pfed.net.transport import DeliveryError, Transport, TransportOptions
from p2pfed.node.learner import LearningNode
from p2pfed.scenario.config import Scenario, load_scenario
from p2pfed.wire import WIRE_VERSION, Message, dtypes, encode
from p2pfed.wire.codec import tensor_frame
from tests.helpers import wait_until

FAST = MeshOptions(heartbeat=0.1, suspect_after=3, dead_after=6, join_timeout=1.0)
Members = Callable[..., Endpoint]
Transports = Callable[..., Transport]


def forge(msg: Message) -> list[Any]:
    """Frames of msg as a hostile sender writes them: the envelope unchecked (encode() refuses bad bodies)."""
    names = {v: k for k, v in dtypes().items()}
    specs = [[n, names[t.dtype], list(t.shape)] for n, t in msg.tensors.items()]
    envelope = {"v": WIRE_VERSION, "type": msg.type, "mesh": msg.mesh, "sender": msg.sender, "round": msg.round,
                "id": msg.id, "body": msg.body, "tensors": specs}
    return [msgpack.packb(envelope, use_bin_type=True), *(tensor_frame(t) for t in msg.tensors.values())]


@pytest.fixture(autouse=True)
def unchecked_sending(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the rogue transports send anything: receiving is what is tested (and still checks everything)."""
    monkeypatch.setattr("p2pfed.net.transport.encode", forge)


class Rogue:
    """A sender that is no member: a transport with a key pair of its own, sending to members by their keys."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.address = transport.address
        assert transport.keys is not None
        self.keys = transport.keys

    async def request(self, member: Endpoint, msg: Message, timeout: float = 5) -> Message:
        assert member.keys is not None
        return await self.transport.request(member.address, msg, timeout, member.keys.public)

    def send_nowait(self, member: Endpoint, msg: Message) -> bool:
        assert member.keys is not None
        return self.transport.send_nowait(member.address, msg, member.keys.public)


def rogue_of(transports: Transports, name: str = "mallory") -> Rogue:
    return Rogue(transports(name, keys=security.ephemeral_keys()))


def raw_dealer(ctx: zmq.asyncio.Context | zmq.Context[Any], member: Endpoint, keys: security.Keys | None = None
               ) -> Any:
    """A plain libzmq DEALER with keys (a pair of its own unless given), connected to member (blocking sends)."""
    assert member.keys is not None
    keys = keys or security.ephemeral_keys()
    sock = ctx.socket(zmq.DEALER)
    sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
    sock.curve_serverkey = member.keys.public
    sock.connect(member.address)
    return sock


def identity(rogue: Rogue | Endpoint, **changes: Any) -> dict[str, Any]:
    """A member's identity as the rogue claims it (its own address and key unless changed)."""
    assert rogue.keys is not None
    return {"address": rogue.address, "role": "node", "incarnation": time.time_ns(),
            "pubkey": rogue.keys.public.decode(), "round": 0, "heartbeat": 0.1, **changes}


def states(e: Endpoint) -> dict[str, str]:
    return {p.name: p.state for p in e.peers.peers.values()}


async def stays(pred: Callable[[], bool], seconds: float, what: str) -> None:
    """Assert pred holds at every check for the given seconds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert pred(), what
        await asyncio.sleep(0.02)


async def mesh(members: Members, n: int, options: MeshOptions = FAST) -> tuple[Endpoint, list[Endpoint]]:
    boot = members("bootstrap", "bootstrap", options=options)
    await boot.start("tcp://127.0.0.1:0")
    nodes = [members(f"n{i}", options=options) for i in range(n)]
    for node in nodes:
        await node.start("tcp://127.0.0.1:0", [boot.ticket])
    await wait_until(lambda: all(states(x).get(y.name) == ALIVE for x in [boot, *nodes] for y in [boot, *nodes]
                                 if x is not y), what="the mesh to form")
    return boot, nodes


# -- one message must never kill a task or a mesh ------------------------------------------------------

async def test_a_bad_address_in_a_hello_or_gossip_is_refused_and_heartbeats_go_on(
        members: Members, transports: Transports) -> None:
    boot, (n0,) = await mesh(members, 1)
    rogue = rogue_of(transports)
    with pytest.raises(DeliveryError, match=r"address must be tcp://HOST:PORT \(got 'garbage'\)"):
        await rogue.request(boot, Message("hello", "mallory", body=identity(rogue, address="garbage")), 5)
    entry = {"name": "ghost", "address": "tcp://no port", "role": "node", "incarnation": 1, "pubkey": "",
             "state": "alive", "age": 0.0, "round": 0}
    rogue.send_nowait(boot, Message("gossip", "mallory", body={**identity(rogue), "peers": [entry]}))
    late = members("n1", options=FAST)  # joins after the attack: the bootstrap must still serve and heartbeat
    await late.start("tcp://127.0.0.1:0", [boot.ticket])
    await late.wait_joined(5)
    await wait_until(lambda: states(late).get("n0") == ALIVE and states(boot).get("n1") == ALIVE, what="n1 in")
    await stays(lambda: states(late)["bootstrap"] == ALIVE and states(n0)["bootstrap"] == ALIVE, 1.5,
                "the bootstrap's heartbeats stopped")
    assert "ghost" not in states(boot) and all(t.done() is False for t in boot.tasks)


async def test_an_error_about_one_peer_never_ends_the_heartbeat_loop(members: Members,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    boot, (n0, n1) = await mesh(members, 2)
    send = boot.transport.send_nowait

    def broken_for_n0(address: str, msg: Message, server_key: bytes | None = None) -> bool:
        if address == n0.address:
            raise RuntimeError("a bug about n0")
        return send(address, msg, server_key)

    monkeypatch.setattr(boot.transport, "send_nowait", broken_for_n0)
    await stays(lambda: states(n1)["bootstrap"] == ALIVE, 1.5, "the bootstrap stopped heartbeating n1")
    assert not any(t.done() for t in boot.tasks)


async def test_a_flood_of_made_up_members_is_capped(members: Members, transports: Transports) -> None:
    options = MeshOptions(heartbeat=0.1, suspect_after=3, dead_after=6, join_timeout=1.0, max_peers=40)
    target = members("target", options=options, transport_options=TransportOptions(max_dealers=32))
    await target.start("tcp://127.0.0.1:0")
    friend = members("friend", options=FAST)
    await friend.start("tcp://127.0.0.1:0", [target.ticket])
    await wait_until(lambda: states(target).get("friend") == ALIVE, what="friend alive")
    rogue = rogue_of(transports)
    ctx = zmq.asyncio.Context()
    sock = raw_dealer(ctx, target, rogue.keys)  # blocking sends: every one of the made-up heartbeats arrives
    try:
        for i in range(300):  # ~1,100 of these exhausted libzmq's sockets and ended the heartbeat task
            body = identity(rogue, address=f"tcp://127.0.0.1:{20000 + i}")
            await sock.send_multipart(forge(Message("heartbeat", f"fake{i}", body=body)))
        await wait_until(lambda: len(target.peers.peers) >= 40, what="the table to fill")
    finally:
        ctx.destroy(linger=0)
    deadline = time.monotonic() + 1.0
    heard = friend.peers.peers["target"].last_seen
    while time.monotonic() < deadline:
        assert len(target.peers.peers) <= 40 and len(target.transport.dealers) <= 32, (
            len(target.peers.peers), len(target.transport.dealers))
        # Its heartbeats go on: never declared dead (6 silent periods). A suspect blip (3 periods) is the
        # shared event loop of this one-process test being busy on a loaded machine, not a stopped heartbeat.
        assert states(friend)["target"] in (ALIVE, SUSPECT), "the target's heartbeats stopped"
        assert not any(t.done() for t in target.tasks), "a task of the target ended"
        await asyncio.sleep(0.02)
    assert friend.peers.peers["target"].last_seen > heard, "no heartbeat of the target in a second"
    # the made-up members fall silent and die; a real newcomer then finds room
    newcomer = members("newcomer", options=FAST)
    await newcomer.start("tcp://127.0.0.1:0", [target.ticket])
    await newcomer.wait_joined(10)
    await wait_until(lambda: states(target).get("newcomer") == ALIVE, what="the newcomer in")


async def test_a_heartbeat_period_out_of_bounds_is_refused(members: Members, transports: Transports) -> None:
    boot, _ = await mesh(members, 0)
    rogue = rogue_of(transports)
    with pytest.raises(DeliveryError, match=r"heartbeat must be in \[0.01, 60\] \(got 1e\+300\)"):
        await rogue.request(boot, Message("hello", "mallory", body=identity(rogue, heartbeat=1e300)), 5)
    assert "mallory" not in states(boot)


async def test_a_live_members_name_cannot_be_taken_by_a_newer_incarnation(members: Members,
                                                                          transports: Transports) -> None:
    boot, (n0,) = await mesh(members, 1)
    rogue = rogue_of(transports)
    claim = identity(rogue, incarnation=n0.incarnation + 60 * 10**9)  # "restarted" elsewhere a minute on
    with pytest.raises(DeliveryError, match="n0 is bound to another key"):
        await rogue.request(boot, Message("hello", "n0", body=claim), 5)
    with pytest.raises(DeliveryError, match="n0 is bound to another key"):
        await rogue.request(boot, Message("hello", "n0", body={**claim, "incarnation": 2**62}), 5)
    await stays(lambda: boot.peers.peers["n0"].address == n0.address and states(boot)["n0"] == ALIVE, 0.5,
                "n0's entry was taken")


async def test_heartbeats_forging_a_members_address_and_a_future_incarnation_evict_nobody(
        members: Members, transports: Transports) -> None:
    """The issue's attack 3: heartbeats in a's name, from a's address, with an incarnation 590 s ahead, made every
    member log 'a restarted and rejoined', then 'a is dead', and keep it dead while the real a ran."""
    boot, (a, b) = await mesh(members, 2)
    changes: list[tuple[str, str | None, str]] = []
    for m in (boot, b):
        m.serve(on_change=lambda c, m=m: changes.append((m.name, c.old, c.new)) if c.name == "n0" else None)
    rogue = rogue_of(transports)
    forged = {**identity(rogue), "address": a.address, "incarnation": a.incarnation + 590 * 10**9}
    refused = 0
    for _ in range(20):
        for m in (boot, b):
            rogue.send_nowait(m, Message("heartbeat", "n0", body=forged))
        try:
            await rogue.request(b, Message("hello", "n0", body=forged), 2)
        except DeliveryError as exc:
            refused += "n0 is bound to another key" in str(exc)
        await asyncio.sleep(0.05)
    assert refused == 20
    await stays(lambda: states(boot)["n0"] == ALIVE and states(b)["n0"] == ALIVE, 1.0, "a was evicted")
    assert not changes, changes
    assert boot.peers.peers["n0"].incarnation == a.incarnation == b.peers.peers["n0"].incarnation


async def test_refusals_echo_little_and_are_rate_limited(members: Members, transports: Transports,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    boot, _ = await mesh(members, 0)
    rogue = rogue_of(transports)
    body = {"kind": "model", "samples": 1, "meta": {}, "x" * 1_000_000: 1}  # a 1 MB key, echoed before
    with caplog.at_level(logging.INFO, logger="p2pfed"):
        for _ in range(30):
            with pytest.raises(DeliveryError):
                await rogue.request(boot, Message("model", "mallory", body=body), 5)
    lines = [r.getMessage() for r in caplog.records if "mallory" in r.getMessage()]
    assert 1 <= len(lines) <= 5, len(lines)  # a few lines per sender and window, not one per message
    assert sum(len(line) for line in lines) < 5 * 600


async def test_a_flood_does_not_stop_a_members_heartbeats(members: Members) -> None:
    _, (target, observer) = await mesh(members, 2)
    frames = [bytes(memoryview(f)) for f in encode(Message("heartbeat", "mallory", body={
        **target.identity(), "address": "tcp://127.0.0.1:9"}))]

    def flood() -> None:  # from another thread, as from another process: the target's loop gets no say
        ctx = zmq.Context()
        sock = raw_dealer(ctx, target)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        for _ in range(13_000):  # drained without a pause, such a burst held a member's loop for 1.3 s
            sock.send_multipart(frames)
        time.sleep(1.0)
        ctx.destroy(linger=0)

    # The members here share one event loop: how long that loop went without running anything else is what a
    # peer in another process would see as this member's silence (suspect after 3 periods, 0.3 s).
    gaps: list[float] = []
    flooding = asyncio.ensure_future(asyncio.to_thread(flood))
    before = time.monotonic()
    while not flooding.done():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        gaps.append(now - before)
        before = now
    await flooding
    assert max(gaps) < 0.3, f"the event loop stalled for {max(gaps):.2f} s under the flood"
    assert states(observer)["n0"] == ALIVE and states(target)["n1"] == ALIVE
    assert target.transport.dropped > 0  # most of the flood was dropped unread by the per-connection rate


# -- forged models --------------------------------------------------------------------------------------

SCENARIO = """
[scenario]
name = "attacks"
seed = 0
nodes = 3
rounds = {rounds}
methods = ["fedavg-p2p"]
[data]
dataset = "digits"
partition.kind = "iid"
max_train = 16
[train]
round_timeout = {timeout}
"""


def scenario(tmp_path: Path, rounds: int = 30, timeout: float = 20) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(rounds=rounds, timeout=timeout))
    return load_scenario(path)


def model(sender: str, rnd: int, state: dict[str, torch.Tensor], kind: str = "model") -> Message:
    return Message("model", sender, round=rnd, body={"kind": kind, "samples": 5, "meta": {}}, tensors=state)


async def pair(tmp_path: Path, members: Members, method: str = "fedavg-p2p") -> tuple[LearningNode, Endpoint]:
    """The target n00, a learning node, and a live member n1 (the endpoint) it takes models from."""
    s = scenario(tmp_path)
    dataset, partition = prepare_data(s)
    boot, _ = await mesh(members, 0)
    honest = members("n1", options=FAST)  # a live peer the target averages with (fedavg: every live peer)
    await honest.start("tcp://127.0.0.1:0", [boot.ticket])
    endpoint = members("n00", options=FAST)
    await endpoint.start("tcp://127.0.0.1:0", [boot.ticket])
    node = LearningNode(s, scenario_node(s, 0, dataset, partition), method, endpoint, tmp_path)
    await wait_until(lambda: states(endpoint).get("n1") == ALIVE and states(honest).get("n00") == ALIVE,
                     what="n1 and n00 known to each other")
    return node, honest


async def test_models_forged_in_a_members_name_are_refused_and_its_own_are_taken(
        tmp_path: Path, members: Members, transports: Transports) -> None:
    """The issue's attack 1: models of every weight 3.0 sent as n01 for the next 9 rounds were all acknowledged,
    and n01's real models then refused as duplicates (100 -> 38.5 % accuracy)."""
    node, honest = await pair(tmp_path, members)
    rogue = rogue_of(transports)
    forged = {k: torch.full_like(v, 3.0) for k, v in node.current_state().items()}
    for rnd in range(9):
        with pytest.raises(DeliveryError, match="model as n1 refused: n1 is another key than the one it is bound"):
            await rogue.request(node.endpoint, model("n1", rnd, forged))
    assert not node.inbox
    state = {k: v + 1.0 for k, v in node.current_state().items()}
    for rnd in range(9):  # the real n1's models of the same rounds: every one taken
        await honest.request("n00", model("n1", rnd, state), 5)
    assert sorted(r for (_, r) in node.inbox) == list(range(9))
    assert all(torch.equal(node.inbox["model", 3]["n1"].state[k], v) for k, v in state.items())
    # n1's own second copy of a round is acknowledged (never a refusal), the first kept
    await honest.request("n00", model("n1", 3, forged), 5)
    assert all(torch.equal(node.inbox["model", 3]["n1"].state[k], v) for k, v in state.items())


async def test_unexpected_models_are_refused_and_the_inbox_stays_bounded(
        tmp_path: Path, members: Members, transports: Transports) -> None:
    node, honest = await pair(tmp_path, members)
    state = node.current_state()
    refused = 0
    for rnd in range(10, 30):  # n1's models for far rounds: keeping them would let a peer fill the inbox
        try:
            await honest.request("n00", model("n1", rnd, state), 5)
        except DeliveryError as exc:
            refused += "beyond this node's rounds 0..8" in str(exc)
    assert refused == 20
    with pytest.raises(DeliveryError, match="does not expect a w0 from n1"):
        await honest.request("n00", model("n1", 0, state, kind="w0"), 5)
    rogue = rogue_of(transports)
    with pytest.raises(DeliveryError, match="model as stranger refused: stranger is a member this member does not"):
        await rogue.request(node.endpoint, model("stranger", 0, state), 5)
    await honest.request("n00", model("n1", 1, state), 5)
    sent = [honest.request("n00", model("n1", 0, state, kind="w0"), 5) for _ in range(300)]
    await asyncio.gather(*sent, return_exceptions=True)  # 10,000 of these grew a target by 143 MB
    assert sum(len(v) for v in node.inbox.values()) == 1


async def test_a_choices_note_forged_in_a_members_name_is_refused(
        tmp_path: Path, members: Members, transports: Transports) -> None:
    """The issue's attack 4: nine empty 'choices' notes as n01 to n00 made both wait out every round's deadline
    (n00 stopped sending to n01, which still waited for it)."""
    node, honest = await pair(tmp_path, members, "pfedlia-p2p")
    node.method.choosers.add("n1")  # n1 chose n00: n00 sends it its models
    rogue = rogue_of(transports)
    for rnd in range(9):
        note = Message("note", "n1", round=rnd, body={"kind": "choices", "names": [], "values": [], "meta": {}})
        with pytest.raises(DeliveryError, match="note as n1 refused: n1 is another key"):
            await rogue.request(node.endpoint, note)
    assert node.method.choosers == {"n1"} and not node.inbox
    # n1's own word does count: it chose nobody, so n00 sends it nothing (and waits for nothing it would not send)
    await honest.request("n00", Message("note", "n1", round=0, body={"kind": "choices", "names": [], "values": [],
                                                                     "meta": {}}), 5)
    assert node.method.choosers == set()


@pytest.mark.parametrize("claimer", ["mallory", "n01"])
async def test_one_heartbeat_claiming_a_huge_round_does_not_make_nodes_skip(
        tmp_path: Path, members: Members, transports: Transports, claimer: str) -> None:
    """In its own name (a member of its own, which the nodes then wait for) or as n01 (the issue's attack 2: n01's
    address and incarnation, round 2^31 - 1; the pair jumped from round 9 to 29)."""
    s = scenario(tmp_path, rounds=5, timeout=1.0)  # the rogue never sends a model: each round waits 1 s for it
    dataset, partition = prepare_data(s)
    boot = members("bootstrap", "bootstrap", options=FAST)
    await boot.start("tcp://127.0.0.1:0")
    nodes = []
    for i in range(3):
        endpoint = members(s.node_name(i), options=FAST)
        await endpoint.start("tcp://127.0.0.1:0", [boot.ticket])
        nodes.append(LearningNode(s, scenario_node(s, i, dataset, partition), "fedavg-p2p", endpoint, tmp_path))
    await wait_until(lambda: all(len(n.live_peers()) == 2 for n in nodes), what="the mesh to form")
    rogue = rogue_of(transports)

    n01 = nodes[1].endpoint

    async def claim_huge_round() -> None:
        while True:  # a live "node" that says it is at round 2^31 - 1
            for n in nodes:
                body = identity(rogue, round=2**31 - 1)
                if claimer == "n01":
                    body.update(address=n01.address, incarnation=n01.incarnation)
                rogue.send_nowait(n.endpoint, Message("heartbeat", claimer, round=2**31 - 1, body=body))
            await asyncio.sleep(0.05)

    claiming = asyncio.ensure_future(claim_huge_round())
    try:
        if claimer == "mallory":
            await wait_until(lambda: all("mallory" in n.live_peers() for n in nodes), what="mallory known")
        else:
            await asyncio.sleep(0.5)
            assert all(n.endpoint.peers.peers["n01"].round == 0 for n in (nodes[0], nodes[2]))
        await asyncio.wait_for(asyncio.gather(*(n.run() for n in nodes)), 60)
    finally:
        claiming.cancel()
    for n in nodes:
        records = [json.loads(line) for line in (tmp_path / f"{n.name}.jsonl").read_text().splitlines()]
        assert [r["round"] for r in records if r["event"] == "round"] == list(range(5)), n.name
        assert not [r for r in records if r["event"] == "skip"]


def test_the_catch_up_needs_a_quorum_of_the_peers_a_node_averages_with() -> None:
    from p2pfed.net.membership import Peer

    class Fake:
        name, scenario = "me", type("S", (), {"rounds": 100})()
        inbox: dict[Any, Any] = {}  # noqa: RUF012 - a stand-in's attribute
        mesh_round = LearningNode.mesh_round

        def __init__(self, rounds: dict[str, int]) -> None:
            self.endpoint = type("E", (), {})()
            self.endpoint.peers = type("T", (), {})()
            self.endpoint.peers.peers = {p: Peer(p, "tcp://h:1", state=ALIVE, round=r) for p, r in rounds.items()}
            self.method = type("M", (), {"sources": lambda _self, rnd: set(rounds)})()
            self.skips: list[dict[str, Any]] = []

        def live_peers(self) -> list[str]:
            self.listed += 1
            return sorted(self.endpoint.peers.peers)

        def record(self, event: str, **fields: Any) -> None:
            self.skips.append(fields)

        listed = 0

    def target(rounds: dict[str, int], rnd: int = 3) -> int:
        return LearningNode.catch_up(Fake(rounds), rnd)  # type: ignore[arg-type]

    many = Fake({f"p{i}": 3 for i in range(50)})
    LearningNode.catch_up(many, 3)  # type: ignore[arg-type]
    # the live peers listed once, not once for each peer: at 1,000 members that was a million steps a node a
    # round, a third of a 250-node process's time
    assert many.listed == 1

    assert target({"a": 2**31 - 1, "b": 3, "c": 3}) == 3  # one peer's word is not enough
    assert target({"a": 2**31 - 1, "b": 2**31 - 1, "c": 3}) == 99  # two of three: but never past the last round
    assert target({"a": 9, "b": 9}) == 9 and target({"a": 9, "b": 4}) == 3  # both of two
    assert target({"a": 9}) == 3  # one member's word alone moves nobody, even the only peer it averages with
    assert target({"a": 4}) == 3  # one round ahead is not a straggler yet
    assert target({}) == 3


# -- the issue's four attacks together, on a learning mesh -------------------------------------------------

LEARNING = """
[scenario]
name = "attacked"
seed = 2
nodes = 6
rounds = 16
methods = ["pfedlia-p2p"]
[data]
dataset = "digits"
partition.kind = "pathological"
partition.clusters = 3
max_train = 40
[train]
round_timeout = 20
[methods.pfedlia-p2p]
warmup_rounds = 3
lia_epochs = 10
lia_batch = 40
"""


async def learn(out: Path, members: Members, rogue: Rogue | None) -> dict[str, float]:
    """Each node's final accuracy after a pFedLIA run of six nodes in three pairs; with a rogue, attacked all
    along as the issue did it: models of every weight 3.0 and empty 'choices' notes sent as n01 to n00 for the
    next rounds, heartbeats as n01 claiming round 2^31 - 1 (its address and incarnation), and heartbeats as n02
    with its address and an incarnation 590 s ahead, to every node."""
    out.mkdir()
    path = out / "s.toml"
    path.write_text(LEARNING)
    s = load_scenario(path)
    dataset, partition = prepare_data(s)
    options = MeshOptions(heartbeat=0.2, suspect_after=3, dead_after=10, join_timeout=1.0)
    boot = members("bootstrap", "bootstrap", options=options)
    await boot.start("tcp://127.0.0.1:0")
    nodes = []
    for i in range(s.nodes):
        endpoint = members(s.node_name(i), options=options)
        await endpoint.start("tcp://127.0.0.1:0", [boot.ticket])
        nodes.append(LearningNode(s, scenario_node(s, i, dataset, partition), "pfedlia-p2p", endpoint, out))
    n00, n01, n02 = (n.endpoint for n in nodes[:3])
    forged = {k: torch.full_like(v, 3.0) for k, v in nodes[0].current_state().items()}
    attacks: list[str] = []  # each forgery's refusal
    taken: list[Message] = []  # forgeries acknowledged: none may be
    rounds: set[int] = set()  # n00's rounds at which a burst of forgeries went out

    async def attack(rogue: Rogue) -> None:
        attacked = -1
        while True:
            rnd = nodes[0].round
            rounds.add(rnd)
            for ahead in range(9) if rnd != attacked else ():  # each time n00 starts a round, its next 9 rounds
                for msg in (model("n01", rnd + ahead, forged),
                            Message("note", "n01", round=rnd + ahead,
                                    body={"kind": "choices", "names": [], "values": [], "meta": {}})):
                    try:
                        await rogue.request(n00, msg, timeout=2)
                        taken.append(msg)
                    except DeliveryError as exc:
                        attacks.append(str(exc))
            attacked = rnd
            for n in nodes:
                rogue.send_nowait(n.endpoint, Message("heartbeat", "n01", round=2**31 - 1, body=identity(
                    rogue, address=n01.address, incarnation=n01.incarnation, round=2**31 - 1)))
                rogue.send_nowait(n.endpoint, Message("heartbeat", "n02", body=identity(
                    rogue, address=n02.address, incarnation=n02.incarnation + 590 * 10**9)))
            await asyncio.sleep(0.2)

    # as the issue's attacker did: once the mesh has formed (it read the members' addresses and incarnations
    # from `p2pfed mesh status`); to a member that has not heard a name from its owner yet, whoever speaks
    # first is that name (trust on first use: docs/security.md)
    await wait_until(lambda: all(len(n.live_peers()) == s.nodes - 1 for n in nodes), what="the mesh to form")
    attacking = asyncio.ensure_future(attack(rogue)) if rogue else None
    try:
        await asyncio.wait_for(asyncio.gather(*(n.run(wait_for_peers=s.nodes - 1) for n in nodes)), 240)
    finally:
        if attacking:
            attacking.cancel()
    # the attack ran from round 0 into later rounds (how many of n00's short rounds a burst of 18 requests
    # spans depends on the machine's load: 7 rounds here, about 4 on CI), and each forgery was refused
    assert not rogue or (min(rounds) == 0 and len(rounds) >= 2 and len(attacks) >= 18 and not taken
                         and all("n01 is another key than the one it is bound to" in a for a in attacks)), rounds
    final = {}
    for n in nodes:
        records = [json.loads(line) for line in (out / f"{n.name}.jsonl").read_text().splitlines()]
        assert not [r for r in records if r["event"] == "skip"], n.name
        final[n.name] = next(r for r in records if r["event"] == "final")["accuracy"]
    for e in [boot, *(n.endpoint for n in nodes)]:
        await e.stop()
    return final


@pytest.mark.slow  # five learning runs (29 s under coverage); CI runs it (-m slow), the attacks' own tests stay
async def test_the_issues_four_attacks_leave_accuracy_within_a_point_of_a_clean_run(
        tmp_path: Path, members: Members, transports: Transports) -> None:
    """Done when of the 'Secure by default' issue: on an unkeyed mesh these took n00 from 100 to 38.5 %, made
    pairs skip to the end, evicted a live member and stalled a pair for minutes."""
    clean = await learn(tmp_path / "clean", members, None)
    attacked = await learn(tmp_path / "attacked", members, rogue_of(transports))
    mean = sum(clean.values()) / len(clean)
    assert mean > 0.8, clean  # a run worth attacking
    assert abs(sum(attacked.values()) / len(attacked) - mean) <= 0.01, (clean, attacked)
    assert all(abs(attacked[n] - clean[n]) <= 0.01 for n in clean), (clean, attacked)  # n00 and n01 too
