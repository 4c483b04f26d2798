"""Real ZeroMQ sockets: requests are acknowledged or fail loudly; bad messages are dropped, not fatal."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch
import zmq
import zmq.asyncio

from p2pfed.net.transport import DeliveryError, Transport, TransportOptions
from p2pfed.wire import Message, WireError, check_tensors, encode


def model(sender: str = "a", **tensors: torch.Tensor) -> Message:
    return Message("model", sender, body={"kind": "full", "samples": 3, "meta": {}},
                   tensors=tensors or {"w": torch.randn(5, 5)})


async def pair(handler=None, options: TransportOptions | None = None) -> tuple[Transport, Transport, list]:
    got: list[Message] = []

    async def record(msg: Message) -> Message | None:
        got.append(msg)
        return None

    receiver = Transport("b", handler or record, options=options)
    sender = Transport("a", record)
    receiver.bind("tcp://127.0.0.1:0")
    sender.bind("tcp://127.0.0.1:0")
    return sender, receiver, got


def test_request_is_acknowledged_and_tensors_arrive_intact() -> None:
    async def main() -> None:
        sender, receiver, got = await pair()
        w = torch.randn(64, 32)
        reply = await sender.request(receiver.address, model(w=w), timeout=5)
        assert reply.type == "ack" and reply.body["ok"]
        assert torch.equal(got[0].tensors["w"], w) and got[0].sender == "a"
        assert sender.bytes_sent >= w.numel() * 4 and receiver.bytes_received >= w.numel() * 4
        await sender.close()
        await receiver.close()

    asyncio.run(main())


def test_request_to_a_dead_address_times_out_loudly() -> None:
    async def main() -> None:
        sender = Transport("a", lambda m: None)  # type: ignore[arg-type, return-value]
        sender.bind("tcp://127.0.0.1:0")
        with pytest.raises(DeliveryError, match="not acknowledged"):
            await sender.request("tcp://127.0.0.1:1", model(), timeout=0.5)
        await sender.close()

    asyncio.run(main())


def test_a_request_whose_connection_is_closed_while_it_waits_fails_as_undelivered() -> None:
    async def main() -> None:
        sender = Transport("a", lambda m: None)  # type: ignore[arg-type, return-value]
        sender.bind("tcp://127.0.0.1:0")
        pending = asyncio.create_task(sender.request("tcp://127.0.0.1:1", model(), timeout=5))
        await asyncio.sleep(0.2)  # nothing listens there: the send waits for a connection
        assert sender.in_flight["tcp://127.0.0.1:1"] == 1
        sender.forget("tcp://127.0.0.1:1")
        with pytest.raises(DeliveryError, match="closed"):
            await asyncio.wait_for(pending, 2)
        assert not sender.in_flight
        await sender.close()

    asyncio.run(main())


def test_refused_content_is_reported_to_the_sender() -> None:
    local = {"w": torch.zeros(5, 5)}

    async def strict(msg: Message) -> Message | None:
        check_tensors(msg.tensors, local)
        return None

    async def main() -> None:
        sender, receiver, _ = await pair(strict)
        await sender.request(receiver.address, model(w=torch.ones(5, 5)), timeout=5)
        with pytest.raises(DeliveryError, match="refused"):
            await sender.request(receiver.address, model(w=torch.ones(4, 5)), timeout=5)
        await sender.close()
        await receiver.close()

    asyncio.run(main())


def test_a_reply_that_fails_validation_fails_its_request_at_once() -> None:
    async def poisoned(msg: Message) -> Message | None:
        return model("b", w=torch.full((2,), float("nan")))  # a diverged model as the reply

    async def main() -> None:
        sender, receiver, _ = await pair(poisoned)
        with pytest.raises(DeliveryError, match=r"refused: .*NaN"):  # not after the request's 60 s
            await asyncio.wait_for(sender.request(receiver.address, model(), timeout=60), 10)
        assert sender.dropped == 1 and not sender.pending
        await sender.close()
        await receiver.close()

    asyncio.run(main())


def test_garbage_is_dropped_with_one_log_line_and_the_node_keeps_running(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        sender, receiver, got = await pair()
        ctx = zmq.asyncio.Context()
        rogue = ctx.socket(zmq.DEALER)
        rogue.connect(receiver.address)
        bad_nan = model("mallory", w=torch.full((2,), float("nan")))
        await rogue.send_multipart([b"\x93garbage"])
        await rogue.send_multipart(encode(bad_nan))
        await rogue.send_multipart([encode(model("mallory"))[0], b"short"])
        await asyncio.sleep(0.3)
        assert receiver.dropped == 3
        reply = await sender.request(receiver.address, model(), timeout=5)
        assert reply.body["ok"] and len(got) == 1
        rogue.close(0)
        ctx.term()
        await sender.close()
        await receiver.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    drops = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drops) == 3
    assert any("mallory" in d and "NaN" in d for d in drops)


def test_message_size_is_capped_at_the_socket() -> None:
    async def main() -> None:
        sender, receiver, got = await pair(options=TransportOptions(max_message_bytes=100_000))
        with pytest.raises(DeliveryError):
            await sender.request(receiver.address, model(w=torch.zeros(100_000)), timeout=1.5)
        assert got == []
        await sender.close()
        await receiver.close()

    asyncio.run(main())


def test_large_models_are_not_dropped_by_high_water_marks() -> None:
    async def main() -> None:
        sender, receiver, got = await pair(options=TransportOptions(sndhwm=2, rcvhwm=2))
        msgs = [model(w=torch.full((250_000,), float(i))) for i in range(12)]
        replies = await asyncio.gather(*(sender.request(receiver.address, m, timeout=20) for m in msgs))
        assert all(r.body["ok"] for r in replies)
        assert sorted(int(m.tensors["w"][0]) for m in got) == list(range(12))
        await sender.close()
        await receiver.close()

    asyncio.run(main())


def test_unknown_types_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        encode(Message("exec", "a"))
    assert issubclass(WireError, ValueError)
