"""Move a ResNet-18 state dict (about 45 MB) node to node over TCP loopback and compare throughputs.

Paths measured in the same run, each the median of --repeat transfers:
- raw TCP: sendall of the same byte count into a recv_into loop (the reference, ratio 1.0);
- plain pyzmq PUSH/PULL of one zero-copy frame of that size, both ends on one context and thread;
- plain pyzmq tuned: the state dict as p2pfed moves it (a DEALER and a ROUTER of two contexts, a frame per tensor,
  acked, the receiver in its own thread), with and without CURVE: the ceiling each p2pfed path is held against,
  interleaved with it over --rounds rounds;
- p2pfed: state dict in -> encode -> Transport.request -> decode and validate (dtype, shape, byte count,
  finite) -> usable state dict out -> ack back to the sender; with CURVE keys (every member's default: the
  bytes are encrypted and authenticated) and --insecure (plain TCP), to show what the keys cost;
- pickle: pickle.dumps(state dict) -> pyzmq -> pickle.loads (what decentralizepy and p2pfl do; never
  done by p2pfed, shown for comparison).

Run: python benchmarks/wire.py [--repeat 7] [--rounds 3] [--json benchmarks/results/wire.json]
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


def tuned_zmq(sd: dict[str, torch.Tensor], repeat: int, keyed: bool) -> list[float]:
    """Seconds per transfer of the state dict as p2pfed moves it, in plain pyzmq without p2pfed: a DEALER of its own
    context to a ROUTER of another (as two members have), one zero-copy frame per tensor, the receiver in a thread of
    its own answering each message with a short ack; over CURVE if keyed. No validation, no asyncio: the ceiling the
    p2pfed path is held against (the same bytes, the same sockets and security, nothing of p2pfed)."""
    frames = [t.contiguous().numpy().data.cast("B") for t in sd.values() if t.numel()]
    rctx, sctx = zmq.Context(), zmq.Context()
    router, dealer = rctx.socket(zmq.ROUTER), sctx.socket(zmq.DEALER)
    if keyed:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        router.curve_secretkey, router.curve_publickey, router.curve_server = server_secret, server_public, True
        dealer.curve_serverkey, dealer.curve_publickey, dealer.curve_secretkey = (server_public, client_public,
                                                                                   client_secret)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    sizes: list[int] = []

    def receive() -> None:
        for _ in range(repeat + 1):
            parts = router.recv_multipart(copy=False)
            sizes.append(sum(len(f) for f in parts[1:]))
            router.send_multipart([parts[0], b"ack"])

    thread = threading.Thread(target=receive)
    thread.start()
    dealer.send(b"warm")
    dealer.recv()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        dealer.send_multipart(frames, copy=False)
        dealer.recv()
        times.append(time.perf_counter() - t0)
    thread.join()
    assert sizes[-1] == nbytes(sd)
    dealer.close(linger=0)
    router.close(linger=0)
    sctx.term()
    rctx.term()
    return times


def decoding(sd: dict[str, torch.Tensor], repeat: int) -> tuple[float, float]:
    """Seconds to decode and validate the model message from frames already received (what a receiver does before
    its handler sees the model), with and without the NaN/Inf pass over every tensor: the receiver's own part of
    a transfer, which tuned plain pyzmq does not do."""
    frames = [bytes(memoryview(f)) for f in encode(Message("model", "sender", body={"kind": "bench", "samples": 1,
                                                                                     "meta": {}}, tensors=sd))]
    checked, unchecked = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        decode(frames)
        checked.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        decode(frames, check_finite=False)
        unchecked.append(time.perf_counter() - t0)
    return statistics.median(checked), statistics.median(unchecked)


async def p2pfed_transfer(sd: dict[str, torch.Tensor], repeat: int, keyed: bool = True) -> list[float]:
    """Seconds per state-dict transfer through p2pfed's Transport, acknowledged (over CURVE if keyed). The receiver
    runs in a thread with an event loop of its own, as a member in a process of its own would (and as the tuned
    pyzmq receiver has a thread of its own): the two members' Python work may overlap, as it does between two."""
    # The last state dict received (its tensors are views of the frames): a node keeps a model until it averages
    # it, and the tuned receiver keeps none. Kept all 7 of a call, each transfer landed on fresh memory, as no
    # node's does: 0.40 to 0.44 of the tuned path without keys against 0.64 to 0.75 kept one (three A B pairs,
    # benchmarks/results/wire-received.json).
    received: list[dict[str, torch.Tensor]] = []
    keys = security.ephemeral_keys() if keyed else None
    ready: queue.Queue[tuple[str, asyncio.AbstractEventLoop, asyncio.Event]] = queue.Queue()

    async def on_message(msg: Message) -> Message | None:
        received[:] = [msg.tensors]  # usable as is: model.load_state_dict(msg.tensors)
        return None

    async def receive() -> None:
        receiver = Transport("receiver", on_message, keys=keys)
        stop = asyncio.Event()
        ready.put((receiver.bind("tcp://127.0.0.1:0"), asyncio.get_running_loop(), stop))
        await stop.wait()
        await receiver.close()

    async def ignore(msg: Message) -> Message | None:
        return None

    thread = threading.Thread(target=asyncio.run, args=(receive(),))
    thread.start()
    address, loop, stop = await asyncio.to_thread(ready.get)
    sender = Transport("sender", ignore, keys=security.ephemeral_keys() if keyed else None)
    sender.bind("tcp://127.0.0.1:0")
    server_key = keys.public if keys else None
    warm = Message("model", "sender", body={"kind": "warmup", "samples": 1, "meta": {}},
                   tensors={"x": torch.zeros(4)})
    await sender.request(address, warm, 10, server_key)
    times = []
    for _ in range(repeat):
        msg = Message("model", "sender", body={"kind": "bench", "samples": 1, "meta": {}}, tensors=sd)
        t0 = time.perf_counter()
        await sender.request(address, msg, 60, server_key)
        times.append(time.perf_counter() - t0)
    await sender.close()
    loop.call_soon_threadsafe(stop.set)
    await asyncio.to_thread(thread.join)
    out = received[-1]
    assert all(torch.equal(out[k], sd[k]) for k in sd), "received state dict differs"
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="transfers per path and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the tuned and p2pfed paths")
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    args = parser.parse_args()
    sd = state_dict()
    size = nbytes(sd)
    raw = statistics.median(raw_tcp(size, args.repeat))
    zmq_plain = statistics.median(plain_zmq(size, args.repeat))
    # each p2pfed path beside its ceiling, interleaved (A B A B): the machine's noise falls on both alike
    runs: dict[str, list[float]] = {"tuned": [], "tuned_curve": [], "ours": [], "insecure": []}
    for _ in range(args.rounds):
        runs["tuned_curve"] += tuned_zmq(sd, args.repeat, keyed=True)
        runs["ours"] += asyncio.run(p2pfed_transfer(sd, args.repeat))
        runs["tuned"] += tuned_zmq(sd, args.repeat, keyed=False)
        runs["insecure"] += asyncio.run(p2pfed_transfer(sd, args.repeat, keyed=False))
    tuned, tuned_curve, ours, insecure = (statistics.median(runs[k]) for k in ("tuned", "tuned_curve", "ours",
                                                                               "insecure"))
    pickled = statistics.median(plain_zmq(size, args.repeat, pickle_of=sd))
    decoded, decoded_unchecked = decoding(sd, 3 * args.repeat)
    mb = size / 1e6
    print(f"ResNet-18 state dict: {len(sd)} tensors, {mb:.1f} MB, median of {args.repeat} transfers\n")
    print(f"{'path':<54}{'MB/s':>10}{'x raw TCP':>12}")
    rows = [("raw TCP loopback (reference)", raw), ("plain pyzmq PUSH/PULL, one frame, one context", zmq_plain),
            ("plain pyzmq tuned, CURVE (ceiling of the next row)", tuned_curve),
            ("p2pfed model message, CURVE, acked", ours),
            ("plain pyzmq tuned, no keys (ceiling of the next row)", tuned),
            ("p2pfed model message, --insecure", insecure),
            ("pickle over pyzmq", pickled)]
    for label, secs in rows:
        print(f"{label:<54}{mb / secs:>10.0f}{raw / secs:>12.2f}")
    print(f"\np2pfed against tuned plain pyzmq with the same security: CURVE {tuned_curve / ours:.2f}, "
          f"--insecure {tuned / insecure:.2f} (1.0: no cost of its own)")
    print(f"CURVE keys (the default) cost: {ours / insecure:.2f}x the time of an --insecure transfer")
    print(f"the receiver's decoding and validation: {1e3 * decoded:.1f} ms a message ({1e3 * decoded_unchecked:.1f} "
          f"ms without the NaN/Inf pass), against {1e3 * tuned:.1f} ms for a whole tuned transfer without keys")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "megabytes": mb, "tensors": len(sd), "repeat": args.repeat,
            "paths": [{"path": label, "seconds": secs, "mb_per_s": mb / secs, "x_raw_tcp": raw / secs}
                      for label, secs in rows],
            "curve_over_insecure": ours / insecure,
            "decode_s": decoded, "decode_without_finite_check_s": decoded_unchecked,
            "of_tuned_pyzmq": {"curve": tuned_curve / ours, "insecure": tuned / insecure}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
