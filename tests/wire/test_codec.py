"""The codec round-trips tensors without copying and refuses every malformed input with WireError."""

from __future__ import annotations

import math
import subprocess
import sys

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pfed.wire import ITEMSIZES, NO_TENSORS, Limits, Message, WireError, check_tensors, decode, encode, peek
from p2pfed.wire.codec import dtypes
from p2pfed.wire.messages import clip


def model_message(**tensors: torch.Tensor) -> Message:
    return Message("model", "alice", body={"kind": "partial", "samples": 10, "meta": {"epochs": 2}},
                   tensors=tensors or {"w": torch.randn(3, 4), "b": torch.zeros(4)})


def as_bytes(frames: list) -> list[bytes]:
    return [bytes(memoryview(f)) for f in frames]


@pytest.mark.parametrize("dtype", list(dtypes().values()))
def test_round_trip_every_allowed_dtype(dtype: torch.dtype) -> None:
    t = (torch.arange(24) % 7).to(dtype).reshape(2, 3, 4)
    msg = model_message(x=t, scalar=torch.tensor(3).to(dtype), empty=torch.empty(0, 5, dtype=dtype))
    out = decode(as_bytes(encode(msg)))
    assert out.type == "model" and out.sender == "alice" and out.body == msg.body and out.id == msg.id
    for name, tensor in msg.tensors.items():
        assert out.tensors[name].dtype == dtype and out.tensors[name].shape == tensor.shape
        assert torch.equal(out.tensors[name], tensor)


def test_the_wires_dtype_sizes_are_torchs() -> None:
    assert {name: torch.empty(0, dtype=dtype).element_size() for name, dtype in dtypes().items()} == ITEMSIZES


def test_a_member_that_moves_no_model_never_imports_torch() -> None:
    """A bootstrap and `p2pfed mesh status` (the command line, the membership layer, a ping encoded and decoded)
    did import it: 3 s and some 300 MB a process on this machine."""
    code = ("import sys; import p2pfed.cli, p2pfed.launch.member, p2pfed.net.endpoint\n"
            "from p2pfed.wire import Message, decode, encode\n"
            "decode(encode(Message('leave', 'alice')))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.strip() == "[]"


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

    def refusal(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor] = local) -> str:
        with pytest.raises(WireError) as exc:
            check_tensors(tensors, reference)
        return str(exc.value)

    assert refusal({"w": torch.ones(4, 3), "b": torch.ones(4)}) == \
        "tensor 'w' is torch.float32 (4, 3), the local model has torch.float32 (3, 4)"
    assert refusal({"w": torch.ones(3, 4, dtype=torch.float64), "b": torch.ones(4)}) == \
        "tensor 'w' is torch.float64 (3, 4), the local model has torch.float32 (3, 4)"
    assert refusal({"w": torch.ones(3, 4)}) == "tensor names differ from the local model: missing ['b'], unexpected []"
    # what a sender named is echoed sorted, three names at most, each list cut short
    many = {f"n{i}": torch.zeros(1) for i in range(5)}
    assert refusal({**many, "w": torch.ones(3, 4)}) == ("tensor names differ from the local model: missing ['b'], "
                                                        "unexpected ['n0', 'n1', 'n2']")
    long = {"x" * 300: torch.zeros(1)}
    assert refusal(long, {"x" * 300 + "y": torch.zeros(1)}) == (
        f"tensor names differ from the local model: missing {clip(['x' * 300 + 'y'], 120)}, "
        f"unexpected {clip(['x' * 300], 120)}")
    assert refusal({"b": torch.ones(4)}, {**many, "w": torch.zeros(1), "b": torch.zeros(4)}) == (
        "tensor names differ from the local model: missing ['n0', 'n1', 'n2'], unexpected []")
    assert refusal({"w": torch.zeros([1] * 40), "b": torch.ones(4)}) == (  # a made-up shape is cut short
        f"tensor 'w' is torch.float32 {clip(tuple([1] * 40), 60)}, the local model has torch.float32 (3, 4)")


def test_peek_reads_the_sender_type_and_id_of_an_envelope_that_did_not_decode() -> None:
    msg = model_message()
    frame = as_bytes(encode(msg))[0]
    assert peek(frame) == {"sender": "alice", "type": "model", "id": msg.id}
    assert peek(frame[:40]) == {"sender": "?", "type": "model", "id": "?"}  # cut short: what was read before
    assert peek(b"") == peek(b"\xc1junk") == {"sender": "?", "type": "?", "id": "?"}

    def envelope(**fields: object) -> bytes:
        return msgpack.packb(fields, use_bin_type=True)

    # only well-formed names and ids are kept: a log line must not carry what the sender made up
    assert peek(envelope(sender="mallory\nWARNING forged", type="model", id="abc def")) == \
        {"sender": "?", "type": "model", "id": "?"}
    assert peek(envelope(sender="n1", type=7, id=["x"])) == {"sender": "n1", "type": "?", "id": "?"}
    assert peek(envelope(id="a" * 100))["id"] == "a" * 64  # an id is cut to 64 characters
    # at most 8 fields are read, none longer than 256, and only from the first 4 kB
    padded = {f"k{i}": i for i in range(8)}
    assert peek(envelope(**padded, sender="n1")) == {"sender": "?", "type": "?", "id": "?"}
    assert peek(envelope(**dict(list(padded.items())[:7]), sender="n1"))["sender"] == "n1"
    assert peek(envelope(pad="x" * 256, sender="n1"))["sender"] == "n1"
    assert peek(envelope(pad="x" * 257, sender="n1"))["sender"] == "?"
    assert peek(envelope(pad=["x" * 250] * 15, sender="n1"))["sender"] == "n1"  # 3.8 kB before the sender
    assert peek(envelope(pad=["x" * 250] * 17, sender="n1"))["sender"] == "?"  # 4.3 kB
    exactly = {len(e): e for k in range(30, 60) for e in [envelope(pad=["x" * 250] * 16 + ["y" * k], sender="n1")]}
    assert peek(exactly[4096])["sender"] == "n1" and peek(exactly[4097])["sender"] == "?"  # the sender's last byte
    # ... and no array, map or byte string longer than the unpacker's caps, and no extension types
    assert peek(envelope(pad=[0] * 64, sender="n1"))["sender"] == "n1"
    assert peek(envelope(pad=[0] * 65, sender="n1"))["sender"] == "?"
    assert peek(envelope(pad=dict.fromkeys(map(str, range(64)), 0), sender="n1"))["sender"] == "n1"
    assert peek(envelope(pad=dict.fromkeys(map(str, range(65)), 0), sender="n1"))["sender"] == "?"
    assert peek(envelope(pad=b"x" * 256, sender="n1"))["sender"] == "n1"
    assert peek(envelope(pad=b"x" * 257, sender="n1"))["sender"] == "?"
    assert peek(envelope(pad=msgpack.ExtType(1, b"x"), sender="n1"))["sender"] == "?"


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


def _refusal_of_spec(spec: list) -> str:
    env = msgpack.unpackb(VALID[0], raw=False)
    env["tensors"] = [spec, ["b", "float32", [4]]]
    with pytest.raises(WireError) as exc:
        decode([msgpack.packb(env), b"", VALID[2]])
    return str(exc.value)


def test_a_forged_empty_shape_hiding_huge_sizes_is_refused_not_a_crash() -> None:
    # torch's own RuntimeError ("Stride calculation overflowed") must not escape: a zero size made the byte count
    # 0, which the (empty) frame matched, while the other sizes overflow int64
    for shape in ([0, 2**39, 2**39, 2**39], [0, 2**40 - 1, 2**24], [2**39, 0, 2**39, 2**39, 2**39, 2**39, 2**39]):
        assert _refusal_of_spec(["w", "float32", shape]) == \
            f"tensor 'w': shape {clip(shape, 80)} is empty, but its other sizes exceed the message limit"
    long = [0, *[2**40 - 1] * 7]  # the echo is cut as every other echo of a shape
    assert _refusal_of_spec([LONG, "float64", long]) == \
        f"tensor {clip(LONG, 80)}: shape {clip(long, 80)} is empty, but its other sizes exceed the message limit"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**40 - 1) | st.just(0), min_size=1, max_size=8).filter(lambda s: 0 in s),
       st.sampled_from(sorted(ITEMSIZES)))
def test_any_empty_shape_decodes_or_is_refused_with_wire_error(shape: list[int], dtype: str) -> None:
    env = msgpack.unpackb(VALID[0], raw=False)
    env["tensors"] = [["w", dtype, shape], ["b", "float32", [4]]]
    try:
        out = decode([msgpack.packb(env), b"", VALID[2]])
    except WireError:
        return
    assert list(out.tensors["w"].shape) == shape and out.tensors["w"].numel() == 0


def test_oversized_frame_count_is_refused() -> None:
    frames = [VALID[0], *([b""] * 5000)]
    with pytest.raises(WireError):
        decode(frames)


# -- what a refusal says, exactly: it is what the sender is told and what the log shows -----------------------

LONG = "n" * 250  # a long tensor name, still under max_name_len


@pytest.mark.parametrize(("changes", "reason"), [
    ({"v": 99}, "wire version 99 is not 4"),
    ({"v": "x" * 100}, f"wire version {clip('x' * 100, 40)} is not 4"),
    ({"type": ""}, "envelope field 'type' must be a non-empty string of at most 64 chars"),
    ({"type": "t" * 65}, "envelope field 'type' must be a non-empty string of at most 64 chars"),
    ({"type": "exec"}, "unknown message type 'exec'"),
    ({"sender": "a b"}, "envelope field 'sender' must be a name of letters, digits, '-', '_' or '.' (got 'a b')"),
    ({"sender": LONG}, f"envelope field 'sender' must be a name of letters, digits, '-', '_' or '.' "
                       f"(got {clip(LONG, 80)})"),
    ({"mesh": 3}, "envelope field 'mesh' must be a name of letters, digits, '-', '_' or '.' (got 3)"),
    ({"id": "i" * 65}, "envelope field 'id' must be a non-empty string of at most 64 chars"),
    ({"round": 1 << 31}, "round 2147483648 is not an integer in [0, 2^31)"),
    ({"round": True}, "round True is not an integer in [0, 2^31)"),
    ({"round": [0] * 50}, f"round {clip([0] * 50, 40)} is not an integer in [0, 2^31)"),
    ({"body": []}, "body is not a map"),
    ({"type": "leave", "body": {}}, "a leave message carries no tensors"),  # only a model or a task carries some
    ({"body": {"kind": "x"}}, "model body: body keys: missing ['meta', 'samples'], unexpected []"),
    ({"tensors": {}}, "tensor list must be a list of at most 4096 specs"),
    ({"tensors": [["w", "float32", [3, 4]]]}, "1 tensor specs but 2 tensor frames"),
    ({"tensors": [["w", "float32"], ["b", "float32", [4]]]}, "a tensor spec must be [name, dtype, shape]"),
    ({"tensors": ["wfs", ["b", "float32", [4]]]}, "a tensor spec must be [name, dtype, shape]"),
    ({"tensors": [["", "float32", [3, 4]], ["b", "float32", [4]]]}, "tensor name must be a non-empty short string"),
    ({"tensors": [["w" * 257, "float32", [3, 4]], ["b", "float32", [4]]]},
     "tensor name must be a non-empty short string"),
    ({"tensors": [[LONG, "object", [3, 4]], ["b", "float32", [4]]]},
     f"tensor {clip(LONG, 80)}: dtype 'object' is not allowed"),
    ({"tensors": [["w", "o" * 100, [3, 4]], ["b", "float32", [4]]]},
     f"tensor 'w': dtype {clip('o' * 100, 40)} is not allowed"),
    ({"tensors": [["w", "float32", {"3": 4}], ["b", "float32", [4]]]},
     "tensor 'w': shape {'3': 4} is not a list of at most 8 sizes"),
    ({"tensors": [["w", "float32", [1] * 9], ["b", "float32", [4]]]},
     "tensor 'w': shape [1, 1, 1, 1, 1, 1, 1, 1, 1] is not a list of at most 8 sizes"),
    ({"tensors": [["w", "float32", [3, True]], ["b", "float32", [4]]]},
     "tensor 'w': shape [3, True] is not a list of at most 8 sizes"),
    ({"tensors": [["w", "float32", [0, 1 << 40]], ["b", "float32", [4]]]},
     "tensor 'w': shape [0, 1099511627776] is not a list of at most 8 sizes"),
    ({"tensors": [[LONG, "float32", list(range(1, 30))], ["b", "float32", [4]]]},
     f"tensor {clip(LONG, 80)}: shape {clip(list(range(1, 30)), 80)} is not a list of at most 8 sizes"),
    ({"tensors": [["w", "float32", [1 << 20, 1 << 9]], ["b", "float32", [4]]]},
     "tensor 'w': 2147483648 bytes exceeds the message limit"),
    ({"tensors": [[LONG, "float32", [1 << 20, 1 << 9]], ["b", "float32", [4]]]},
     f"tensor {clip(LONG, 80)}: 2147483648 bytes exceeds the message limit"),
    ({"tensors": [["w", "float32", [4, 4]], ["b", "float32", [4]]]}, "tensor 'w': frame has 48 bytes, spec needs 64"),
    ({"tensors": [[LONG, "float32", [4, 4]], ["b", "float32", [4]]]},
     f"tensor {clip(LONG, 80)}: frame has 48 bytes, spec needs 64"),
    ({"tensors": [["w", "float32", [3, 4]], ["w", "float32", [4]]]}, "tensor 'w' appears twice"),
    ({"extra": 1}, "envelope fields ['body', 'extra', 'id', 'mesh', 'round', 'sender', 'tensors', 'type', 'v'] "
                   "differ from ['body', 'id', 'mesh', 'round', 'sender', 'tensors', 'type', 'v']"),
])
def test_a_refusal_says_exactly_what_was_wrong(changes: dict, reason: str) -> None:
    frames = encode(model_message())
    with pytest.raises(WireError) as exc:
        decode(_with_envelope(frames, **changes))
    assert str(exc.value) == reason


def test_a_refusal_of_a_tensor_with_nan_names_it_cut_short() -> None:
    for name, said in [("w", "'w'"), (LONG, clip(LONG, 80))]:
        with pytest.raises(WireError) as exc:
            decode(as_bytes(encode(model_message(**{name: torch.tensor([1.0, math.nan])}))))
        assert str(exc.value) == f"tensor {said} holds NaN or Inf"


def test_values_at_the_decoding_limits_are_accepted() -> None:
    limits = Limits(max_ndim=3, max_name_len=5)
    ok = decode(as_bytes(encode(model_message(wwwww=torch.zeros(2, 2, 3)))), limits)  # 3 dims, 5 characters
    assert ok.tensors["wwwww"].shape == (2, 2, 3)
    # an empty tensor's other sizes are bounded as a full one's are: exactly the cap (2^28 float32s) passes
    assert decode(as_bytes(encode(model_message(e=torch.zeros(0, 1 << 28)))), limits).tensors["e"].numel() == 0
    with pytest.raises(WireError, match=r"^tensor 'e': shape \[0, 268435457\] is empty, but its other sizes "
                                        r"exceed the message limit$"):
        decode(as_bytes(encode(model_message(e=torch.zeros(0, (1 << 28) + 1)))), limits)
    # a tensor of exactly the cap passes the tensor's own check; the whole message (envelope too) does not
    with pytest.raises(WireError, match=r"^message exceeds 1000 bytes"):
        decode(as_bytes(encode(model_message(w=torch.zeros(250)))), Limits(max_message_bytes=1000))
    with pytest.raises(WireError, match=r"^tensor 'w': 1004 bytes exceeds the message limit$"):
        decode(as_bytes(encode(model_message(w=torch.zeros(251)))), Limits(max_message_bytes=1000))
    with pytest.raises(WireError, match="not valid msgpack"):
        decode([b"\x81\xa1"], limits)
    with pytest.raises(WireError, match=r"^envelope is not a map$"):
        decode([msgpack.packb([1, 2])], limits)


def test_more_refusals_at_their_exact_bounds() -> None:
    frames = encode(model_message())
    env = _envelope(frames)

    def refusal(frames: list, limits: Limits = Limits()) -> str:  # noqa: B008
        with pytest.raises(WireError) as exc:
            decode(frames, limits)
        return str(exc.value)

    assert refusal([]) == "empty message"
    many = {f"field-{i:02d}-{'x' * 12}": 0 for i in range(20)}  # their names, sorted, echo 12 cut to 160 chars
    assert refusal(_with_envelope(frames, **many)) == (
        f"envelope fields {clip(sorted(map(str, {**env, **many}))[:12], 160)} differ from "
        "['body', 'id', 'mesh', 'round', 'sender', 'tensors', 'type', 'v']")
    assert refusal(_with_envelope(frames, type="t" * 64)) == f"unknown message type '{'t' * 64}'"
    assert decode(_with_envelope(frames, id="i" * 64)).id == "i" * 64
    assert decode(_with_envelope(frames, round=(1 << 31) - 1)).round == (1 << 31) - 1
    assert refusal(_with_envelope(frames, tensors=[[LONG, "float32", [3, 4]], [LONG, "float32", [4]]])) == \
        f"tensor {clip(LONG, 80)} appears twice"
    two = as_bytes(frames)
    assert set(decode(two, Limits(max_tensors=2)).tensors) == {"w", "b"}
    assert refusal(two, Limits(max_tensors=1)) == "tensor list must be a list of at most 1 specs"
    # the envelope: its size cap, and msgpack's own caps on what it may hold
    assert decode(two, Limits(max_envelope_bytes=len(two[0]))).sender == "alice"
    assert refusal(two, Limits(max_envelope_bytes=len(two[0]) - 1)) == \
        f"envelope of {len(two[0])} bytes exceeds {len(two[0]) - 1}"
    assert refusal([msgpack.packb({1: 2})]) == (  # int keys
        "envelope is not valid msgpack (ValueError: 'int is not allowed for map key when strict_map_key=True')")
    assert refusal([msgpack.packb({"x": msgpack.ExtType(1, b"x")})]).startswith("envelope is not valid msgpack")
    big_list, big_map = [0] * ((1 << 20) + 1), {str(i): 0 for i in range((1 << 16) + 1)}
    assert refusal([msgpack.packb({"x": big_list})]).startswith("envelope is not valid msgpack")
    assert refusal([msgpack.packb({"x": big_list[:-1]})]).startswith("envelope fields")  # unpacked, then refused
    assert refusal([msgpack.packb({"x": big_map})]).startswith("envelope is not valid msgpack")
    assert refusal([msgpack.packb({"x": dict(list(big_map.items())[:-1])})]).startswith("envelope fields")


def test_a_decoded_message_keeps_its_mesh_and_round_and_encode_refuses_what_the_wire_cannot_carry() -> None:
    msg = Message("model", "alice", mesh="lab-1", round=17, body={"kind": "partial", "samples": 1, "meta": {}},
                  tensors={"w": torch.zeros(2)})
    out = decode(as_bytes(encode(msg)))
    assert (out.mesh, out.round, out.sender, out.type, out.id) == ("lab-1", 17, "alice", "model", msg.id)
    with pytest.raises(ValueError) as exc:
        encode(model_message(c=torch.zeros(2, dtype=torch.complex64)))
    assert str(exc.value) == "tensor 'c' has dtype torch.complex64, which the wire does not carry"
    with pytest.raises(ValueError) as exc:
        encode(Message("exec", "alice"))
    assert str(exc.value) == "unknown message type 'exec'"
    with pytest.raises(ValueError) as exc:
        encode(Message("leave", "alice", tensors={"w": torch.zeros(2)}))
    assert str(exc.value) == "a leave message carries no tensors"


def test_a_member_that_moves_no_model_refuses_tensors_before_reading_them() -> None:
    """A bootstrap and `p2pfed mesh status` decode with NO_TENSORS: a stray model would have made them import
    torch (seconds of a stalled loop) and hold its tensors."""
    with pytest.raises(WireError) as exc:
        decode(as_bytes(encode(model_message())), NO_TENSORS)
    assert str(exc.value) == ("tensor list must be a list of at most 0 specs: this member moves no model (a bootstrap "
                              "takes none)")
