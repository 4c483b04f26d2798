"""Move a ResNet-18 state dict (about 45 MB) node to node over TCP loopback and compare throughputs.

Paths measured in the same run, each the median of --repeat transfers:
- raw TCP: sendall of the same byte count into a recv_into loop (the reference, ratio 1.0);
- plain pyzmq PUSH/PULL of one zero-copy frame of that size;
- p2pfed: state dict in -> encode -> Transport.request -> decode and validate (dtype, shape, byte count,
  finite) -> usable state dict out -> ack back to the sender; with CURVE keys (every member's default: the
  bytes are encrypted and authenticated) and --insecure (plain TCP), to show what the keys cost;
- pickle: pickle.dumps(state dict) -> pyzmq -> pickle.loads (what decentralizepy and p2pfl do; never
  done by p2pfed, shown for comparison).

Run: python benchmarks/wire.py [--repeat 7] [--json benchmarks/results/wire.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
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


async def p2pfed_transfer(sd: dict[str, torch.Tensor], repeat: int, keyed: bool = True) -> list[float]:
    """Seconds per state-dict transfer through p2pfed's Transport, acknowledged (over CURVE if keyed)."""
    received: list[dict[str, torch.Tensor]] = []

    async def on_message(msg: Message) -> Message | None:
        received.append(msg.tensors)  # usable as is: model.load_state_dict(msg.tensors)
        return None

    async def ignore(msg: Message) -> Message | None:
        return None

    keys = security.ephemeral_keys() if keyed else None
    receiver = Transport("receiver", on_message, keys=keys)
    sender = Transport("sender", ignore, keys=security.ephemeral_keys() if keyed else None)
    address = receiver.bind("tcp://127.0.0.1:0")
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
    out = received[-1]
    assert all(torch.equal(out[k], sd[k]) for k in sd), "received state dict differs"
    await sender.close()
    await receiver.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    args = parser.parse_args()
    sd = state_dict()
    size = nbytes(sd)
    raw = statistics.median(raw_tcp(size, args.repeat))
    zmq_plain = statistics.median(plain_zmq(size, args.repeat))
    ours = statistics.median(asyncio.run(p2pfed_transfer(sd, args.repeat)))
    insecure = statistics.median(asyncio.run(p2pfed_transfer(sd, args.repeat, keyed=False)))
    pickled = statistics.median(plain_zmq(size, args.repeat, pickle_of=sd))
    mb = size / 1e6
    print(f"ResNet-18 state dict: {len(sd)} tensors, {mb:.1f} MB, median of {args.repeat} transfers\n")
    print(f"{'path':<36}{'MB/s':>10}{'x raw TCP':>12}")
    rows = [("raw TCP loopback (reference)", raw), ("plain pyzmq PUSH/PULL", zmq_plain),
            ("p2pfed model message, CURVE, acked", ours), ("p2pfed model message, --insecure", insecure),
            ("pickle over pyzmq", pickled)]
    for label, secs in rows:
        print(f"{label:<36}{mb / secs:>10.0f}{raw / secs:>12.2f}")
    print(f"\nCURVE keys (the default) cost: {ours / insecure:.2f}x the time of an --insecure transfer")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "megabytes": mb, "tensors": len(sd), "repeat": args.repeat,
            "paths": [{"path": label, "seconds": secs, "mb_per_s": mb / secs, "x_raw_tcp": raw / secs}
                      for label, secs in rows],
            "curve_over_insecure": ours / insecure}, indent=2) + "\n")


if __name__ == "__main__":
    main()
