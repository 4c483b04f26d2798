"""Bytes ⇄ messages: the envelope, the tensor frames and their validation."""

from p2pfed.wire.codec import (
    DEFAULT_LIMITS,
    ITEMSIZES,
    NO_TENSORS,
    WIRE_VERSION,
    Limits,
    Message,
    TryLater,
    WireError,
    check_tensors,
    decode,
    dtypes,
    encode,
    peek,
)
from p2pfed.wire.messages import GOODBYE, NO_REPLY, SCHEMAS
from p2pfed.wire.received import ModelIn, NoteIn

__all__ = [
    "DEFAULT_LIMITS",
    "GOODBYE",
    "ITEMSIZES",
    "NO_REPLY",
    "NO_TENSORS",
    "SCHEMAS",
    "WIRE_VERSION",
    "Limits",
    "Message",
    "ModelIn",
    "NoteIn",
    "TryLater",
    "WireError",
    "check_tensors",
    "decode",
    "dtypes",
    "encode",
    "peek",
]
