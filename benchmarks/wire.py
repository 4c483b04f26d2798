"""Move a ResNet-18 state dict (about 45 MB) node to node over TCP loopback and compare throughputs.

Paths measured in the same run, each the median of --repeat transfers:
- raw TCP: sendall of the same byte count into a recv_into loop (the reference, ratio 1.0);
- plain pyzmq PUSH/PULL of one zero-copy frame of that size, both ends on one context and thread;
- plain pyzmq tuned: the state dict as p2pfed moves it (a DEALER and a ROUTER of two contexts, a frame per tensor,
  acked, the receiver in its own thread), with and without CURVE: the ceiling each p2pfed path is held against,
  set up beside it and taken in turns with it, a transfer each (over --rounds fresh set-ups of --repeat pairs);
- p2pfed: state dict in -> encode -> Transport.request -> decode and validate (dtype, shape, byte count,
  finite) -> usable state dict out -> ack back to the sender; with CURVE keys (every member's default: the
  bytes are encrypted and authenticated) and --insecure (plain TCP), to show what the keys cost;
- pickle: pickle.dumps(state dict) -> pyzmq -> pickle.loads (what decentralizepy and p2pfl do; never
  done by p2pfed, shown for comparison).

Then where each p2pfed transfer's time goes, in the same transfers (to the frames' arrival at the receiver,
decoding and validating, the handler and the ack back), and encoding and decoding timed apart.

Run: python benchmarks/wire.py [--repeat 7] [--rounds 3] [--json benchmarks/results/wire.json]   (the shipped run:
--rounds 10 --repeat 10)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import queue
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torchvision
import zmq
import zmq.asyncio

from p2pfed.net import security
from p2pfed.net.transport import Transport
from p2pfed.wire import Message
from p2pfed.wire.codec import decode, encode


def state_dict() -> dict[str, torch.Tensor]:
    """A ResNet-18 state dict (random weights; the bytes are what matter)."""
    return {k: v.clone() for k, v in torchvision.models.resnet18(weights=None).state_dict().items()}


def nbytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def raw_tcp(size: int, repeat: int) -> list[float]:
    """Seconds per transfer of size bytes over one loopback TCP connection, each acknowledged by a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def receive() -> None:
        conn, _ = server.accept()
        view = memoryview(bytearray(size))
        for _ in range(repeat):
            got = 0
            while got < size:
                n = conn.recv_into(view[got:], min(size - got, 1 << 22))
                if n == 0:
                    return
                got += n
            conn.sendall(b"k")
        conn.close()

    thread = threading.Thread(target=receive)
    thread.start()
    client = socket.create_connection(("127.0.0.1", port))
    payload = bytearray(size)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        client.sendall(payload)
        client.recv(1)
        times.append(time.perf_counter() - t0)
    client.close()
    thread.join()
    server.close()
    return times


def plain_zmq(size: int, repeat: int, pickle_of: dict[str, torch.Tensor] | None = None) -> list[float]:
    """Seconds per PUSH/PULL transfer of one zero-copy frame, or per pickle round trip of a state dict."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    push.send(b"warm")
    pull.recv()
    payload = bytearray(size)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        if pickle_of is not None:
            push.send(pickle.dumps(pickle_of, protocol=pickle.HIGHEST_PROTOCOL), copy=False)
            frame = pull.recv(copy=False)
            out = pickle.loads(frame.buffer)  # the unsafe path, measured on local bytes only
            assert len(out) == len(pickle_of)
        else:
            push.send(payload, copy=False)
            frame = pull.recv(copy=False)
            assert len(frame) == size
        times.append(time.perf_counter() - t0)
    push.close(linger=0)
    pull.close(linger=0)
    ctx.term()
    return times


class Tuned:
    """The state dict moved as p2pfed moves it, in plain pyzmq without p2pfed: a DEALER of its own context to a
    ROUTER of another (as two members have), one zero-copy frame per tensor, the receiver in a thread of its own
    answering each message with a short ack; over CURVE if keyed. No validation, no asyncio: the ceiling the
    p2pfed path is held against (the same bytes, the same sockets and security, nothing of p2pfed)."""

    def __init__(self, sd: dict[str, torch.Tensor], keyed: bool) -> None:
        self.size = nbytes(sd)
        self.frames = [t.contiguous().numpy().data.cast("B") for t in sd.values() if t.numel()]
        self.rctx, self.sctx = zmq.Context(), zmq.Context()
        self.router, self.dealer = self.rctx.socket(zmq.ROUTER), self.sctx.socket(zmq.DEALER)
        if keyed:
            server_public, server_secret = zmq.curve_keypair()
            client_public, client_secret = zmq.curve_keypair()
            self.router.curve_secretkey, self.router.curve_publickey = server_secret, server_public
            self.router.curve_server = True
            self.dealer.curve_serverkey, self.dealer.curve_publickey, self.dealer.curve_secretkey = (
                server_public, client_public, client_secret)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.dealer.connect(f"tcp://127.0.0.1:{port}")
        self.sizes: list[int] = []
        self.thread = threading.Thread(target=self._receive)
        self.thread.start()
        self.dealer.send(b"warm")
        self.dealer.recv()

    def _receive(self) -> None:
        while True:
            parts = self.router.recv_multipart(copy=False)
            if parts[1].bytes == b"stop":
                return
            self.sizes.append(sum(len(f) for f in parts[1:]))
            self.router.send_multipart([parts[0], b"ack"])

    def transfer(self) -> float:
        """Seconds for one acknowledged transfer."""
        t0 = time.perf_counter()
        self.dealer.send_multipart(self.frames, copy=False)
        self.dealer.recv()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.dealer.send(b"stop")
        self.thread.join()
        self.dealer.close(linger=0)
        self.router.close(linger=0)
        self.sctx.term()
        self.rctx.term()
        assert not self.sizes[1:] or self.sizes[-1] == self.size  # (the first is the warm-up's)


def coding(sd: dict[str, torch.Tensor], repeat: int) -> tuple[float, float, float]:
    """Seconds to encode the model message (the sender's part before its first byte goes) and to decode and
    validate it from frames already received (the receiver's part before its handler sees the model), with and
    without the NaN/Inf pass over every tensor: p2pfed's own work on a transfer, which tuned plain pyzmq does
    not do. Timed apart from a transfer, on memory a transfer has not just written: a floor of what they take
    inside one."""
    msg = Message("model", "sender", body={"kind": "bench", "samples": 1, "meta": {}}, tensors=sd)
    frames = [bytes(memoryview(f)) for f in encode(msg)]
    encoded, checked, unchecked = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        encode(msg)
        encoded.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        decode(frames)
        checked.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        decode(frames, check_finite=False)
        unchecked.append(time.perf_counter() - t0)
    return statistics.median(encoded), statistics.median(checked), statistics.median(unchecked)


class _Stamped(Transport):
    """A receiving Transport that notes when each model message's frames reach it (before decoding), so a
    transfer's time can be split where it happens: in the same run, not timed apart."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stamps: list[float] = []

    def _received(self, frames: list[zmq.Frame]) -> None:
        if len(frames) > 2:  # a model message (the warm-up's too), not a bare request
            self.stamps.append(time.perf_counter())
        super()._received(frames)


class P2pfed:
    """The state dict through p2pfed's Transport: state dict in -> encode -> Transport.request -> decode and
    validate -> usable state dict out -> ack back (over CURVE if keyed). The receiver runs in a thread with an
    event loop of its own, as a member in a process of its own would (and as the tuned pyzmq receiver has a thread
    of its own): the two members' Python work may overlap, as it does between two."""

    def __init__(self, sd: dict[str, torch.Tensor], keyed: bool) -> None:
        self.sd, self.keyed = sd, keyed
        # The last state dict received (its tensors are views of the frames): a node keeps a model until it
        # averages it, and the tuned receiver keeps none. Kept all 7 of a call, each transfer landed on fresh
        # memory, as no node's does: 0.40 to 0.44 of the tuned path without keys against 0.64 to 0.75 kept one
        # (three A B pairs, benchmarks/results/wire-received.json).
        self.received: list[dict[str, torch.Tensor]] = []
        self.handled: list[float] = []  # when the handler got each model message, decoded and validated
        self.keys = security.ephemeral_keys() if keyed else None
        # each transfer's seconds from its start: to its frames' arrival at the receiver (encoding and the wire),
        # to the handler (decoding and validating), and to the ack's arrival back (the handler, the ack's hops)
        self.parts: list[tuple[float, float, float]] = []
        self.sender: Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> P2pfed:
        ready: queue.Queue[tuple[_Stamped, asyncio.AbstractEventLoop, asyncio.Event]] = queue.Queue()

        async def on_message(msg: Message) -> Message | None:
            self.handled.append(time.perf_counter())
            self.received[:] = [msg.tensors]  # usable as is: model.load_state_dict(msg.tensors)
            return None

        async def receive() -> None:
            receiver = _Stamped("receiver", on_message, keys=self.keys)
            receiver.bind("tcp://127.0.0.1:0")
            stop = asyncio.Event()
            ready.put((receiver, asyncio.get_running_loop(), stop))
            await stop.wait()
            await receiver.close()

        async def ignore(msg: Message) -> Message | None:
            return None

        self.thread = threading.Thread(target=asyncio.run, args=(receive(),))
        self.thread.start()
        self.receiver, self.loop, self.stop = await asyncio.to_thread(ready.get)
        self.address = self.receiver.address
        self.sender = sender = Transport("sender", ignore, keys=security.ephemeral_keys() if self.keyed else None)
        sender.bind("tcp://127.0.0.1:0")
        self.server_key = self.keys.public if self.keys else None
        warm = Message("model", "sender", body={"kind": "warmup", "samples": 1, "meta": {}},
                       tensors={"x": torch.zeros(4), "y": torch.zeros(4)})
        await sender.request(self.address, warm, 10, self.server_key)
        return self

    async def transfer(self) -> float:
        """Seconds for one acknowledged transfer of a model message."""
        msg = Message("model", "sender", body={"kind": "bench", "samples": 1, "meta": {}}, tensors=self.sd)
        t0 = time.perf_counter()
        assert self.sender is not None, "start() first"
        await self.sender.request(self.address, msg, 60, self.server_key)
        t1 = time.perf_counter()
        # (the receiver wrote both stamps before it sent the ack this request waited for)
        self.parts.append((self.receiver.stamps[-1] - t0, self.handled[-1] - self.receiver.stamps[-1],
                           t1 - self.handled[-1]))
        return t1 - t0

    async def close(self) -> None:
        """Close what start() opened, as far as it got."""
        if self.sender is not None:
            await self.sender.close()
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)
            await asyncio.to_thread(self.thread.join)
        if self.parts:  # a transfer was made: check the last one
            out = self.received[-1]
            assert all(torch.equal(out[k], self.sd[k]) for k in self.sd), "received state dict differs"


async def paired(sd: dict[str, torch.Tensor], repeat: int,
                 keyed: bool) -> tuple[list[float], list[float], list[tuple[float, float, float]]]:
    """Seconds per transfer of the tuned pyzmq path and of p2pfed's (and the parts of p2pfed's, P2pfed.parts), with
    the same security, both set up at once and taken in turns, one transfer each (the first of a pair alternating):
    the machine's noise of the moment falls on both of a pair alike, where blocks of transfers of one and then
    the other caught different moments."""
    a: list[float] = []
    b: list[float] = []
    tuned = Tuned(sd, keyed)
    try:
        ours = P2pfed(sd, keyed)
        try:
            await ours.start()
            for i in range(repeat):
                if i % 2:
                    a.append(tuned.transfer())
                    b.append(await ours.transfer())
                else:
                    b.append(await ours.transfer())
                    a.append(tuned.transfer())
        finally:
            await ours.close()
    finally:
        tuned.close()  # (its receiver thread would hold the process open)
    return a, b, ours.parts


def where_it_goes(tuned: list[float], ours: list[float], parts: list[tuple[float, float, float]]) -> dict[str, float]:
    """Medians, in seconds, of a tuned transfer, of a p2pfed transfer, and of the parts of p2pfed's, all from the
    same run: to the frames' arrival at the receiver (encoding and the wire; against the whole tuned transfer,
    which has the wire and a short ack), decoding and validating them, and from the handler to the ack's arrival
    back at the sender (the handler, the ack's encoding and hops through both event loops)."""
    return {"tuned_s": statistics.median(tuned), "p2pfed_s": statistics.median(ours),
            "to_receipt_s": statistics.median(p[0] for p in parts),
            "decode_s": statistics.median(p[1] for p in parts),
            "handler_and_ack_s": statistics.median(p[2] for p in parts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="transfers per path (and per round of the paired ones)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="fresh set-ups of the tuned and p2pfed paths, each taking them in turns --repeat times")
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    args = parser.parse_args()
    if args.repeat < 1 or args.rounds < 1 or args.repeat * args.rounds < 2:
        parser.error(f"--repeat {args.repeat} and --rounds {args.rounds}: each must be at least 1, and the paired "
                     "transfers (their product) at least 2, for the pairs' quartiles")
    sd = state_dict()
    size = nbytes(sd)
    raw = statistics.median(raw_tcp(size, args.repeat))
    zmq_plain = statistics.median(plain_zmq(size, args.repeat))
    # each p2pfed path beside its ceiling, a transfer of one and one of the other in turn, over --rounds fresh
    # set-ups: the machine's noise falls on both alike
    runs: dict[str, list[float]] = {"tuned": [], "tuned_curve": [], "ours": [], "insecure": []}
    parts: dict[str, list[tuple[float, float, float]]] = {"curve": [], "insecure": []}
    for _ in range(args.rounds):
        for kind, ceiling, path in (("curve", "tuned_curve", "ours"), ("insecure", "tuned", "insecure")):
            a, b, split = asyncio.run(paired(sd, args.repeat, kind == "curve"))
            runs[ceiling] += a
            runs[path] += b
            parts[kind] += split
    tuned, tuned_curve, ours, insecure = (statistics.median(runs[k]) for k in ("tuned", "tuned_curve", "ours",
                                                                               "insecure"))
    # the median of the pairs' ratios (and their quartiles: how far one pair's figure may be from another's)
    pair_ratios = {kind: [x / y for x, y in zip(runs[ceiling], runs[path], strict=True)]
                   for kind, ceiling, path in (("curve", "tuned_curve", "ours"), ("insecure", "tuned", "insecure"))}
    beyond = {"curve": where_it_goes(runs["tuned_curve"], runs["ours"], parts["curve"]),
              "insecure": where_it_goes(runs["tuned"], runs["insecure"], parts["insecure"])}
    pickled = statistics.median(plain_zmq(size, args.repeat, pickle_of=sd))
    encoded, decoded, decoded_unchecked = coding(sd, 3 * args.repeat)
    mb = size / 1e6
    print(f"ResNet-18 state dict: {len(sd)} tensors, {mb:.1f} MB, median of {args.repeat} transfers "
          f"({args.rounds * args.repeat} for the paired paths)\n")
    print(f"{'path':<54}{'MB/s':>10}{'x raw TCP':>12}")
    rows = [("raw TCP loopback (reference)", raw), ("plain pyzmq PUSH/PULL, one frame, one context", zmq_plain),
            ("plain pyzmq tuned, CURVE (ceiling of the next row)", tuned_curve),
            ("p2pfed model message, CURVE, acked", ours),
            ("plain pyzmq tuned, no keys (ceiling of the next row)", tuned),
            ("p2pfed model message, --insecure", insecure),
            ("pickle over pyzmq", pickled)]
    for label, secs in rows:
        print(f"{label:<54}{mb / secs:>10.0f}{raw / secs:>12.2f}")
    print("\np2pfed against tuned plain pyzmq with the same security (1.0: no cost of its own):")
    quartiles = {kind: statistics.quantiles(r, n=4) for kind, r in pair_ratios.items()}
    for kind, ratios in pair_ratios.items():
        q = quartiles[kind]
        print(f"  {kind}: {beyond[kind]['tuned_s'] / beyond[kind]['p2pfed_s']:.2f} of the medians; "
              f"pair by pair median {statistics.median(ratios):.2f}, quartiles {q[0]:.2f} to {q[2]:.2f} "
              f"({len(ratios)} pairs)")
    for kind, part in beyond.items():
        print(f"  {kind}, ms: tuned {1e3 * part['tuned_s']:.1f} whole; p2pfed {1e3 * part['p2pfed_s']:.1f}: to the "
              f"receiver {1e3 * part['to_receipt_s']:.1f}, decoding and validating {1e3 * part['decode_s']:.1f}, "
              f"handler and ack {1e3 * part['handler_and_ack_s']:.1f}")
    print(f"CURVE keys (the default) cost: {ours / insecure:.2f}x the time of an --insecure transfer")
    print(f"timed apart: encoding {1e3 * encoded:.1f} ms; decoding and validating {1e3 * decoded:.1f} ms "
          f"({1e3 * decoded_unchecked:.1f} ms without the NaN/Inf pass)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "megabytes": mb, "tensors": len(sd), "repeat": args.repeat, "rounds": args.rounds,
            "paths": [{"path": label, "seconds": secs, "mb_per_s": mb / secs, "x_raw_tcp": raw / secs}
                      for label, secs in rows],
            "curve_over_insecure": ours / insecure,
            "encode_s": encoded, "decode_s": decoded, "decode_without_finite_check_s": decoded_unchecked,
            "of_tuned_pyzmq": {"curve": tuned_curve / ours, "insecure": tuned / insecure},
            "of_tuned_pyzmq_pairs": {kind: {"median": statistics.median(r),
                                            "quartiles": [quartiles[kind][0], quartiles[kind][2]], "pairs": len(r)}
                                     for kind, r in pair_ratios.items()},
            "where_it_goes": beyond}, indent=2) + "\n")


if __name__ == "__main__":
    main()
