"""Bytes ⇄ messages: one msgpack envelope frame plus one raw frame per tensor, validated on the way in.

Nothing received is ever unpickled or ``torch.load``ed. The envelope is unpacked by msgpack with explicit
size limits, its fields and body are checked against the schema of its message type, every tensor spec
against a dtype allow-list and the byte count of its frame, and floating tensors must be finite. Tensor
bytes are neither copied on send (the frame is a view of the tensor's storage) nor on receive (the tensor
is a view of the received frame).
"""

from __future__ import annotations

import functools
import math
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from p2pfed.wire.messages import SCHEMAS, TENSORS, SchemaError, check_body, clip, is_name

if TYPE_CHECKING:
    import torch

# 2: a member's identity carries its recipe's fingerprint, a status its learning (wire/messages.py). Members of
# different versions refuse each other's messages, naming both versions, rather than failing on a field.
# 3: a task names its shared models in its body, and its meta map holds only the method's typed instructions.
# 4: the probing membership's ping and pong (net/endpoint.py), and a member's identity names its membership form.
WIRE_VERSION = 4

# Only these dtypes travel: the wire's names, with their sizes in bytes; anything else is refused. Their torch
# dtypes are looked up when a tensor is first encoded or decoded (dtypes()), so that a member that never moves a
# model (a bootstrap, `p2pfed mesh status`) never imports torch: 3 s and some 300 MB a process on this machine.
ITEMSIZES: dict[str, int] = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
                             "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


@functools.cache
def dtypes() -> dict[str, torch.dtype]:
    """The wire's dtype names mapped to torch's dtypes (torch imported on the first call)."""
    import torch

    return {name: getattr(torch, name) for name in ITEMSIZES}


@functools.cache
def _dtype_names() -> dict[torch.dtype, str]:
    return {v: k for k, v in dtypes().items()}


class WireError(ValueError):
    """A received message broke a rule of the wire protocol; it is dropped."""


class TryLater(WireError):
    """A message refused for now, not for good (its sender is told it may retry). quiet: a refusal in the normal
    course of things (a model asked for before it is kept), which the receiver logs at debug, not as a warning.
    round: the round the refusing member is at, said in the answer's header (a peer that asks may judge by it
    whether the member is on its way to what was asked)."""

    def __init__(self, message: str, quiet: bool = False, round: int = 0) -> None:
        super().__init__(message)
        self.quiet = quiet
        self.round = round


@dataclass(frozen=True)
class Limits:
    """Explicit bounds for decoding; generous for models, tight for everything else."""

    max_envelope_bytes: int = 4 << 20
    max_message_bytes: int = 1 << 30
    max_tensors: int = 4096
    max_ndim: int = 8
    max_name_len: int = 256  # a tensor's name


DEFAULT_LIMITS = Limits()
NO_TENSORS = Limits(max_tensors=0)  # a member that moves no model (a bootstrap, `p2pfed mesh status`)


@dataclass
class Message:
    """One protocol message: who sent it, what it is, a small body and named tensors."""

    type: str
    sender: str
    mesh: str = "default"
    round: int = 0
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    body: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    # Not on the wire: the CURVE public key (z85) the sending connection authenticated with, set by the
    # receiving transport in a keyed mesh ("" otherwise), so a member can check the sender's claimed name.
    key: str = field(default="", compare=False)
    # Not on the wire either: the host the message's connection came from (libzmq's Peer-Address), set by the
    # receiving transport, so a member can tell it what to expect of that connection (Transport.closes_soon).
    origin: str = field(default="", compare=False)


def tensor_frame(t: torch.Tensor) -> np.ndarray:
    """Return a uint8 view of a CPU tensor's bytes (no copy when it is already contiguous on CPU)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    import torch  # (see ITEMSIZES; imported already by whoever made t)

    return t.view(torch.uint8).numpy()


def encode(msg: Message) -> list[Any]:
    """Encode a message as frames: envelope bytes, then one zero-copy buffer per tensor.

    The tensors must not be modified until the frames are sent; callers send snapshots.
    """
    if msg.type not in SCHEMAS:
        raise ValueError(f"unknown message type {msg.type!r}")
    check_body(msg.type, msg.body)
    if msg.tensors and msg.type not in TENSORS:
        raise ValueError(f"a {msg.type} message carries no tensors")
    specs = []
    frames: list[Any] = [b""]
    for name, t in msg.tensors.items():
        dname = _dtype_names().get(t.dtype)
        if dname is None:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}, which the wire does not carry")
        specs.append([name, dname, list(t.shape)])
        frames.append(tensor_frame(t))
    envelope = {
        "v": WIRE_VERSION,
        "type": msg.type,
        "mesh": msg.mesh,
        "sender": msg.sender,
        "round": msg.round,
        "id": msg.id,
        "body": msg.body,
        "tensors": specs,
    }
    frames[0] = msgpack.packb(envelope, use_bin_type=True)
    return frames


def peek(frame0: Any) -> dict[str, str]:
    """Best-effort short fields of an envelope that failed to decode, read one by one from its start without
    unpacking the rest: its sender and type for log lines, its id to answer or fail the request. Only
    well-formed names and ids are kept (a log line must not carry what a sender made up); "?" otherwise."""
    out = dict.fromkeys(("sender", "type", "id"), "?")
    try:
        unpacker = msgpack.Unpacker(raw=False, max_str_len=256, max_bin_len=256, max_array_len=64,
                                    max_map_len=64, max_ext_len=0)
        unpacker.feed(bytes(memoryview(frame0)[:4096]))
        for _ in range(min(unpacker.read_map_header(), 8)):
            key, value = unpacker.unpack(), unpacker.unpack()
            if key in out and isinstance(value, str) and (is_name(value) or (key == "id" and value.isalnum())):
                out[key] = value[:64]
    except Exception:  # msgpack raises several types for malformed or cut input: keep what was read
        pass
    return out


def _unpack_envelope(frame0: Any, limits: Limits) -> dict[str, Any]:
    data = memoryview(frame0)
    if data.nbytes > limits.max_envelope_bytes:
        raise WireError(f"envelope of {data.nbytes} bytes exceeds {limits.max_envelope_bytes}")
    try:
        env = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_envelope_bytes,
            max_bin_len=limits.max_envelope_bytes,
            max_array_len=1 << 20,
            max_map_len=1 << 16,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types for malformed input
        raise WireError(f"envelope is not valid msgpack ({type(exc).__name__}: {clip(str(exc), 120)})") from None
    if not isinstance(env, dict):
        raise WireError("envelope is not a map")
    return env


def _check_str(env: dict[str, Any], key: str, max_len: int) -> str:
    value = env.get(key)
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise WireError(f"envelope field {key!r} must be a non-empty string of at most {max_len} chars")
    return value


def _check_name(env: dict[str, Any], key: str) -> str:
    value = env.get(key)
    if not isinstance(value, str) or not is_name(value):
        raise WireError(f"envelope field {key!r} must be a name of letters, digits, '-', '_' or '.' "
                        f"(got {clip(value, 80)})")
    return value


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS, *, check_finite: bool = True) -> Message:
    """Decode and validate frames (bytes or buffers) into a Message; raise WireError on any violation."""
    if not frames:
        raise WireError("empty message")
    env = _unpack_envelope(frames[0], limits)
    expected = {"v", "type", "mesh", "sender", "round", "id", "body", "tensors"}
    if set(env) != expected:
        raise WireError(f"envelope fields {clip(sorted(map(str, env))[:12], 160)} differ from {sorted(expected)}")
    if env["v"] != WIRE_VERSION:
        raise WireError(f"wire version {clip(env['v'], 40)} is not {WIRE_VERSION}")
    mtype = _check_str(env, "type", 64)
    if mtype not in SCHEMAS:
        raise WireError(f"unknown message type {mtype!r}")
    sender = _check_name(env, "sender")
    mesh = _check_name(env, "mesh")
    msg_id = _check_str(env, "id", 64)
    rnd = env["round"]
    if not isinstance(rnd, int) or isinstance(rnd, bool) or not 0 <= rnd < 1 << 31:
        raise WireError(f"round {clip(rnd, 40)} is not an integer in [0, 2^31)")
    body = env["body"]
    if not isinstance(body, dict):
        raise WireError("body is not a map")
    try:
        check_body(mtype, body)
    except SchemaError as exc:
        raise WireError(f"{mtype} body: {exc}") from None
    specs = env["tensors"]
    if not isinstance(specs, list) or len(specs) > limits.max_tensors:
        raise WireError(f"tensor list must be a list of at most {limits.max_tensors} specs"
                        + ("" if limits.max_tensors else ": this member moves no model (a bootstrap takes none)"))
    if specs and mtype not in TENSORS:
        raise WireError(f"a {mtype} message carries no tensors")
    if len(frames) != len(specs) + 1:
        raise WireError(f"{len(specs)} tensor specs but {len(frames) - 1} tensor frames")
    tensors: dict[str, torch.Tensor] = {}
    if not specs:  # most messages (membership's): no warnings filter to set up (a sixth of decoding's time
        # in a profile of 250 nodes in 4 processes, docs/performance.md)
        return Message(type=mtype, sender=sender, mesh=mesh, round=rnd, id=msg_id, body=body, tensors=tensors)
    total = memoryview(frames[0]).nbytes
    with warnings.catch_warnings():
        # Received frames are read-only buffers owned by this message alone; a tensor is a view of its frame
        # (zero copy), and torch warns of the read-only buffer. Nothing else reads the frame, so in-place use of
        # the tensor is safe. (Once a message, not once a tensor: the filter costs some microseconds a time.)
        warnings.simplefilter("ignore", UserWarning)
        for spec, frame in zip(specs, frames[1:], strict=True):
            name, tensor = _decode_tensor(spec, frame, limits, check_finite)
            if name in tensors:
                raise WireError(f"tensor {clip(name, 80)} appears twice")
            total += tensor.numel() * tensor.element_size()
            if total > limits.max_message_bytes:
                raise WireError(f"message exceeds {limits.max_message_bytes} bytes")
            tensors[name] = tensor
    return Message(type=mtype, sender=sender, mesh=mesh, round=rnd, id=msg_id, body=body, tensors=tensors)


def _decode_tensor(spec: Any, frame: Any, limits: Limits, check_finite: bool) -> tuple[str, torch.Tensor]:
    if not (isinstance(spec, list) and len(spec) == 3):
        raise WireError("a tensor spec must be [name, dtype, shape]")
    name, dname, shape = spec
    if not isinstance(name, str) or not name or len(name) > limits.max_name_len:
        raise WireError("tensor name must be a non-empty short string")
    if not isinstance(dname, str) or dname not in ITEMSIZES:
        raise WireError(f"tensor {clip(name, 80)}: dtype {clip(dname, 40)} is not allowed")
    if (
        not isinstance(shape, list)
        or len(shape) > limits.max_ndim
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)
    ):
        raise WireError(f"tensor {clip(name, 80)}: shape {clip(shape, 80)} is not a list of at most "
                        f"{limits.max_ndim} sizes")
    numel = math.prod(shape)
    nbytes = numel * ITEMSIZES[dname]
    buf = memoryview(frame)
    if nbytes > limits.max_message_bytes:
        raise WireError(f"tensor {clip(name, 80)}: {nbytes} bytes exceeds the message limit")
    # A zero size makes the byte count 0 whatever the other sizes are, and torch's stride calculation
    # overflows int64 on [0, 2^39, 2^39, 2^39]: an empty tensor's other sizes are bounded as a full one's.
    if not numel and math.prod(max(d, 1) for d in shape) * ITEMSIZES[dname] > limits.max_message_bytes:
        raise WireError(f"tensor {clip(name, 80)}: shape {clip(shape, 80)} is empty, but its other sizes exceed "
                        "the message limit")
    if buf.nbytes != nbytes:
        raise WireError(f"tensor {clip(name, 80)}: frame has {buf.nbytes} bytes, spec needs {nbytes}")
    import torch  # (see ITEMSIZES)

    dtype = dtypes()[dname]
    if nbytes == 0:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        # (a view of the read-only frame: decode holds torch's warning of it off)
        tensor = torch.from_numpy(np.frombuffer(buf.cast("B"), dtype=np.uint8)).view(dtype).reshape(shape)
    if check_finite and tensor.is_floating_point() and numel and not _all_finite(tensor):
        raise WireError(f"tensor {clip(name, 80)} holds NaN or Inf")
    return name, tensor


def _all_finite(t: torch.Tensor) -> bool:
    """True if no element is NaN or ±Inf.

    A sum is finite only if every element is (NaN and Inf propagate), and a sum reads the tensor once
    without allocating a mask: ~10x faster than isfinite().all() on 45 MB. Only when the sum is not
    finite (a bad value, or an overflow of huge finite values) is the exact elementwise test run.
    """
    import torch  # (see ITEMSIZES)

    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    if math.isfinite(torch.sum(t, dtype=acc).item()):  # (item and math: one torch call a tensor, not three)
        return True
    return bool(torch.isfinite(t).all())


def check_tensors(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    """Raise WireError unless tensors has exactly reference's names, shapes and dtypes (e.g. a local model)."""
    if tensors.keys() != reference.keys():
        missing = sorted(reference.keys() - tensors.keys())[:3]
        extra = sorted(tensors.keys() - reference.keys())[:3]
        raise WireError(f"tensor names differ from the local model: missing {clip(missing, 120)}, unexpected "
                        f"{clip(extra, 120)}")
    for name, t in tensors.items():
        ref = reference[name]
        if t.shape != ref.shape or t.dtype != ref.dtype:
            raise WireError(
                f"tensor {name!r} is {t.dtype} {clip(tuple(t.shape), 60)}, the local model has {ref.dtype} "
                f"{tuple(ref.shape)}"
            )
