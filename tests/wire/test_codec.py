"""The codec round-trips tensors without copying and refuses every malformed input with WireError."""

from __future__ import annotations

import math

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pfed.wire import DTYPES, Limits, Message, WireError, check_tensors, decode, encode


def model_message(**tensors: torch.Tensor) -> Message:
    return Message("model", "alice", body={"kind": "partial", "samples": 10, "meta": {"epochs": 2}},
                   tensors=tensors or {"w": torch.randn(3, 4), "b": torch.zeros(4)})


def as_bytes(frames: list) -> list[bytes]:
    return [bytes(memoryview(f)) for f in frames]


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
def test_round_trip_every_allowed_dtype(dtype: torch.dtype) -> None:
    t = (torch.arange(24) % 7).to(dtype).reshape(2, 3, 4)
    msg = model_message(x=t, scalar=torch.tensor(3).to(dtype), empty=torch.empty(0, 5, dtype=dtype))
    out = decode(as_bytes(encode(msg)))
    assert out.type == "model" and out.sender == "alice" and out.body == msg.body and out.id == msg.id
    for name, tensor in msg.tensors.items():
        assert out.tensors[name].dtype == dtype and out.tensors[name].shape == tensor.shape
        assert torch.equal(out.tensors[name], tensor)


def test_send_and_receive_do_not_copy_tensor_bytes() -> None:
    t = torch.randn(1000)
    frames = encode(model_message(t=t))
    assert frames[1].ctypes.data == t.data_ptr()  # the frame is a view of the tensor
    buf = bytearray(memoryview(frames[1]))
    out = decode([frames[0], memoryview(buf)])
    # the decoded tensor is a view of the received buffer: writing the buffer shows through
    buf[0:4] = bytes(4)
    assert out.tensors["t"][0].item() == 0.0


def test_non_contiguous_and_cuda_free_tensors_encode_correctly() -> None:
    t = torch.randn(4, 6).t()
    out = decode(as_bytes(encode(model_message(t=t))))
    assert torch.equal(out.tensors["t"], t)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_parameters_are_refused(bad: float) -> None:
    t = torch.randn(100)
    t[37] = bad
    with pytest.raises(WireError, match="NaN or Inf"):
        decode(as_bytes(encode(model_message(t=t))))


def test_huge_finite_values_are_accepted() -> None:
    t = torch.full((10,), 3e38)  # their float32 sum overflows; the exact check must still pass them
    assert torch.equal(decode(as_bytes(encode(model_message(t=t)))).tensors["t"], t)


def _envelope(frames: list) -> dict:
    return msgpack.unpackb(bytes(frames[0]), raw=False)


def _with_envelope(frames: list, **changes: object) -> list[bytes]:
    env = _envelope(frames)
    env.update(changes)
    return [msgpack.packb(env), *as_bytes(frames[1:])]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"v": 99}, "version"),
        ({"type": "exec"}, "unknown message type"),
        ({"sender": ""}, "sender"),
        ({"round": -1}, "round"),
        ({"round": "3"}, "round"),
        ({"body": {"kind": "x"}}, "body"),
        ({"body": {"kind": "x", "samples": 1, "meta": {"a": [1]}}}, "scalar"),
        ({"tensors": [["w", "object", [3, 4]], ["b", "float32", [4]]]}, "not allowed"),
        ({"tensors": [["w", ["float32"], [3, 4]], ["b", "float32", [4]]]}, "not allowed"),  # unhashable dtypes
        ({"tensors": [["w", {"a": 1}, [3, 4]], ["b", "float32", [4]]]}, "not allowed"),
        ({"tensors": [["w", "float32", [4, 4]], ["b", "float32", [4]]]}, "frame has"),
        ({"tensors": [["w", "float32", [3, -4]], ["b", "float32", [4]]]}, "shape"),
        ({"tensors": [["w", "float32", [3, 4]]]}, "tensor frames"),
        ({"tensors": [["w", "float32", [3, 4]], ["w", "float32", [4]]]}, "twice"),
        ({"extra": 1}, "fields"),
    ],
)
def test_malformed_envelopes_are_refused(changes: dict, reason: str) -> None:
    frames = encode(model_message())
    with pytest.raises(WireError, match=reason):
        decode(_with_envelope(frames, **changes))


def test_limits_are_enforced() -> None:
    frames = as_bytes(encode(model_message(t=torch.zeros(1000))))
    with pytest.raises(WireError, match=r"tensor 't': 4000 bytes exceeds the message limit"):
        decode(frames, Limits(max_message_bytes=1000))
    with pytest.raises(WireError, match="envelope of"):
        decode(frames, Limits(max_envelope_bytes=10))
    with pytest.raises(WireError, match="at most"):
        decode(frames, Limits(max_tensors=0))


def test_the_whole_message_is_capped_not_only_each_tensor() -> None:
    frames = as_bytes(encode(model_message(a=torch.zeros(600), b=torch.zeros(600))))  # 2,400 bytes each
    total = sum(len(f) for f in frames)
    assert decode(frames, Limits(max_message_bytes=total)).tensors["b"].numel() == 600  # at the cap: accepted
    with pytest.raises(WireError, match=rf"^message exceeds {total - 1} bytes$"):
        decode(frames, Limits(max_message_bytes=total - 1))  # each tensor is under the cap, together over


UNPICKLED: list[bool] = []


def _mark_unpickled() -> None:
    UNPICKLED.append(True)


class _Payload:
    def __reduce__(self):  # unpickling this calls _mark_unpickled
        return (_mark_unpickled, ())


def test_pickle_is_never_unpacked() -> None:
    import pickle

    payload = pickle.dumps(_Payload())
    with pytest.raises(WireError):
        decode([payload])
    with pytest.raises(WireError):
        decode([msgpack.packb({"v": 1}), payload])
    frames = encode(model_message())
    with pytest.raises(WireError):
        decode([frames[0], payload, payload])
    assert not UNPICKLED


def test_shapes_are_checked_against_the_local_model() -> None:
    local = {"w": torch.zeros(3, 4), "b": torch.zeros(4)}
    check_tensors({"w": torch.ones(3, 4), "b": torch.ones(4)}, local)
    with pytest.raises(WireError, match="local model"):
        check_tensors({"w": torch.ones(4, 3), "b": torch.ones(4)}, local)
    with pytest.raises(WireError, match="missing"):
        check_tensors({"w": torch.ones(3, 4)}, local)
    with pytest.raises(WireError, match="local model"):
        check_tensors({"w": torch.ones(3, 4, dtype=torch.float64), "b": torch.ones(4)}, local)


# -- fuzzing: nothing but WireError may come out of decode -----------------------------------------

VALID = as_bytes(encode(model_message()))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=0, max_size=5))
def test_random_frames_only_raise_wire_error(frames: list[bytes]) -> None:
    with pytest.raises(WireError):
        decode(frames)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2), st.integers(0, 200), st.binary(max_size=50))
def test_truncated_and_spliced_frames_only_raise_wire_error(which: int, cut: int, junk: bytes) -> None:
    frames = list(VALID)
    frames[which] = frames[which][: cut % (len(frames[which]) + 1)] + junk
    try:
        out = decode(frames)
    except WireError:
        return
    # a splice that still decodes must be a well-formed message with the specs' byte counts
    assert out.type == "model"


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
                    | st.binary(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=20))
def test_random_msgpack_envelopes_only_raise_wire_error(obj: object) -> None:
    with pytest.raises(WireError):
        decode([msgpack.packb(obj), b"\x00" * 8])


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-5, 2**41) | st.floats() | st.text(max_size=10),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                    max_leaves=12))
def test_any_tensor_spec_only_raises_wire_error(spec: object) -> None:
    env = msgpack.unpackb(VALID[0], raw=False)
    env["tensors"] = [spec, ["b", "float32", [4]]]
    with pytest.raises(WireError):
        decode([msgpack.packb(env), *VALID[1:]])


def test_oversized_frame_count_is_refused() -> None:
    frames = [VALID[0], *([b""] * 5000)]
    with pytest.raises(WireError):
        decode(frames)
