"""Real ZeroMQ sockets: requests are acknowledged or fail loudly; bad messages are dropped, not fatal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable

import pytest
import torch
import zmq
import zmq.asyncio

from p2pfed.net.transport import DeliveryError, Transport, TransportOptions
from p2pfed.wire import Message, WireError, check_tensors, encode
from tests.conftest import Inbox
from tests.helpers import wait_until

Make = Callable[..., Transport]


def model(sender: str = "a", **tensors: torch.Tensor) -> Message:
    return Message("model", sender, body={"kind": "full", "samples": 3, "meta": {}},
                   tensors=tensors or {"w": torch.randn(5, 5)})


def pair(transports: Make, handler: object = None, options: TransportOptions | None = None
         ) -> tuple[Transport, Transport, Inbox]:
    got = Inbox()
    receiver = transports("b", handler or got, options=options)
    sender = transports("a")
    return sender, receiver, got


@pytest.fixture
def rogue() -> object:
    """A raw DEALER socket that sends whatever bytes a test wants."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    yield sock
    ctx.destroy(linger=0)


async def test_request_is_acknowledged_and_tensors_arrive_intact(transports: Make) -> None:
    sender, receiver, got = pair(transports)
    w = torch.randn(64, 32)
    reply = await sender.request(receiver.address, model(w=w), timeout=5)
    assert reply.type == "ack" and reply.body["ok"]
    assert torch.equal(got[0].tensors["w"], w) and got[0].sender == "a"
    assert sender.bytes_sent >= w.numel() * 4 and receiver.bytes_received >= w.numel() * 4


async def test_request_to_a_dead_address_times_out_loudly(transports: Make) -> None:
    sender = transports("a")
    with pytest.raises(DeliveryError, match=r"not acknowledged within 0\.5s"):
        await sender.request("tcp://127.0.0.1:1", model(), timeout=0.5)
    assert not sender.pending and not sender.in_flight


async def test_a_request_whose_connection_is_closed_while_it_waits_fails_as_undelivered(transports: Make) -> None:
    sender = transports("a")
    pending = asyncio.create_task(sender.request("tcp://127.0.0.1:1", model(), timeout=5))
    deadline = asyncio.get_running_loop().time() + 5
    while not sender.in_flight and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)  # nothing listens there: the send waits for a connection
    assert sender.in_flight["tcp://127.0.0.1:1"] == 1
    sender.forget("tcp://127.0.0.1:1")
    with pytest.raises(DeliveryError, match="closed"):
        await asyncio.wait_for(pending, 2)
    assert not sender.in_flight


async def test_closing_a_transport_fails_the_requests_it_still_waits_for(transports: Make) -> None:
    entered = asyncio.Event()

    async def never(msg: Message) -> Message | None:
        entered.set()
        await asyncio.Event().wait()
        return None

    sender, receiver, _ = pair(transports, never)
    pending = asyncio.create_task(sender.request(receiver.address, model(), timeout=30))
    await asyncio.wait_for(entered.wait(), 5)
    await sender.close()
    with pytest.raises(DeliveryError, match="transport closed"):
        await asyncio.wait_for(pending, 2)


async def test_refused_content_is_reported_to_the_sender(transports: Make) -> None:
    local = {"w": torch.zeros(5, 5)}

    async def strict(msg: Message) -> Message | None:
        check_tensors(msg.tensors, local)
        return None

    sender, receiver, _ = pair(transports, strict)
    await sender.request(receiver.address, model(w=torch.ones(5, 5)), timeout=5)
    with pytest.raises(DeliveryError, match=r"refused model: tensor 'w' is torch.float32 \(4, 5\)"):
        await sender.request(receiver.address, model(w=torch.ones(4, 5)), timeout=5)
    assert receiver.dropped == 1


async def test_a_handler_that_fails_answers_with_a_negative_ack_and_the_receiver_goes_on(
        transports: Make, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    async def flaky(msg: Message) -> Message | None:
        calls.append(msg.id)
        if len(calls) == 1:
            raise RuntimeError("disk full")
        return None

    sender, receiver, _ = pair(transports, flaky)
    refused = r"refused model: RuntimeError\('disk full'\)"
    with caplog.at_level(logging.ERROR), pytest.raises(DeliveryError, match=refused):
        await asyncio.wait_for(sender.request(receiver.address, model(), timeout=30), 5)  # at once, not at 30 s
    assert any("handling model from a failed" in r.getMessage() for r in caplog.records)
    assert (await sender.request(receiver.address, model(), timeout=5)).body["ok"] and len(calls) == 2


async def test_a_reply_that_fails_validation_fails_its_request_at_once(transports: Make) -> None:
    async def poisoned(msg: Message) -> Message | None:
        return model("b", w=torch.full((2,), float("nan")))  # a diverged model as the reply

    sender, receiver, _ = pair(transports, poisoned)
    with pytest.raises(DeliveryError, match=r"refused: .*NaN"):  # not after the request's 60 s
        await asyncio.wait_for(sender.request(receiver.address, model(), timeout=60), 10)
    assert sender.dropped == 1 and not sender.pending


async def test_garbage_is_dropped_with_one_log_line_and_the_node_keeps_running(
        transports: Make, rogue: zmq.asyncio.Socket, caplog: pytest.LogCaptureFixture) -> None:
    sender, receiver, got = pair(transports)
    rogue.connect(receiver.address)
    bad_nan = model("mallory", w=torch.full((2,), float("nan")))
    unknown = encode(model("mallory"))
    unknown[0] = unknown[0].replace(b"\xa5model", b"\xa5exec!")  # a well-formed envelope of an unknown type
    with caplog.at_level(logging.WARNING):
        await rogue.send_multipart([b"\x93garbage"])
        await rogue.send_multipart(encode(bad_nan))
        await rogue.send_multipart([encode(model("mallory"))[0], b"short"])
        await rogue.send_multipart(unknown)
        deadline = asyncio.get_running_loop().time() + 5
        while receiver.dropped < 4 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
    assert receiver.dropped == 4
    reply = await sender.request(receiver.address, model(), timeout=5)
    assert reply.body["ok"] and len(got) == 1
    drops = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drops) == 4
    assert any("mallory" in d and "NaN" in d for d in drops)
    assert any("unknown message type 'exec!'" in d for d in drops)


async def test_message_size_is_capped_at_the_receiving_socket(transports: Make,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    sender, receiver, got = pair(transports, options=TransportOptions(max_message_bytes=100_000))
    assert (await sender.request(receiver.address, model(w=torch.zeros(10)), timeout=5)).body["ok"]
    await wait_until(lambda: receiver.connections, what="the monitor to see the connection")  # a peer, then
    counted = receiver.bytes_received
    with caplog.at_level(logging.INFO, logger="p2pfed"), pytest.raises(DeliveryError, match="not acknowledged"):
        await sender.request(receiver.address, model(w=torch.zeros(100_000)), timeout=1.5)  # a model too large
    # libzmq refused the frame at the socket: not a byte of it reached the codec (which would count a drop)
    assert len(got) == 1 and receiver.bytes_received == counted and receiver.dropped == 0
    # ... and said nothing: the monitor names the connection it closed
    assert any(re.search(r"b: connection from 127\.0\.0\.1:\d+ closed .*over the 0\.0954 MB cap", r.getMessage())
               for r in caplog.records)
    with pytest.raises(DeliveryError, match=r"exceeds max_message_mb"):  # the sender's own cap, before sending
        await transports("c", options=TransportOptions(max_message_bytes=100_000)).request(
            receiver.address, model(w=torch.zeros(100_000)), timeout=1.5)
    assert (await sender.request(receiver.address, model(w=torch.zeros(1000)), timeout=5)).body["ok"]


async def test_reply_size_is_capped_at_the_sending_socket(transports: Make) -> None:
    async def huge(msg: Message) -> Message | None:
        return model("b", w=torch.zeros(100_000))

    receiver = transports("b", huge)
    sender = transports("a", options=TransportOptions(max_message_bytes=100_000))
    with pytest.raises(DeliveryError, match="not acknowledged"):
        await sender.request(receiver.address, model(), timeout=1.5)
    assert sender.bytes_received == 0 and sender.dropped == 0  # refused by libzmq, not by the codec


async def test_large_models_are_not_dropped_by_high_water_marks(transports: Make) -> None:
    sender, receiver, got = pair(transports, options=TransportOptions(sndhwm=2, rcvhwm=2))
    msgs = [model(w=torch.full((250_000,), float(i))) for i in range(12)]
    replies = await asyncio.gather(*(sender.request(receiver.address, m, timeout=20) for m in msgs))
    assert all(r.body["ok"] for r in replies)
    assert sorted(int(m.tensors["w"][0]) for m in got) == list(range(12))


async def test_binding_an_address_in_use_fails_clearly(transports: Make) -> None:
    first = transports("a")
    second = transports("b", bind=False)
    with pytest.raises(OSError, match=f"cannot bind {first.address}"):
        second.bind(first.address)
    assert second.router is None


def test_unknown_types_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="unknown message type 'exec'"):
        encode(Message("exec", "a"))
    assert issubclass(WireError, ValueError)


async def test_a_bug_about_one_message_never_stops_receiving(transports: Make, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    from p2pfed.net import transport

    sender, receiver, got = pair(transports)
    real = transport.decode
    calls: list[int] = []
    broken = [True]

    def flaky(frames: object, limits: object) -> Message:
        calls.append(1)
        if broken[0]:
            raise TypeError("a decoder bug")
        return real(frames, limits)  # type: ignore[arg-type]

    monkeypatch.setattr(transport, "decode", flaky)
    with caplog.at_level(logging.ERROR):
        for _ in range(30):
            with contextlib.suppress(DeliveryError):
                await sender.request(receiver.address, model(), timeout=0.05)
        assert len(calls) == 30
        broken[0] = False
        assert (await sender.request(receiver.address, model(), timeout=5)).body["ok"] and len(got) == 1
    bugs = [r for r in caplog.records if "could not be handled" in r.getMessage()]
    assert 1 <= len(bugs) <= 5 and bugs[0].exc_info is not None  # with its traceback, a few per window
