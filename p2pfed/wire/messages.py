"""The protocol's message types and the schema each body must match.

A schema is a small structure read by :func:`check_body`: ``str``, ``int``, ``float`` (finite; ints are
accepted), ``bool``, :class:`Text`, :class:`Int` and :class:`Num` for bounded values, :class:`OneOf` for one
of a few strings, :class:`Address` for a ``tcp://HOST:PORT`` a member may be dialled at, ``[spec]`` or
:class:`Many` for a list of items of one spec, ``{key: spec}`` for a map with exactly those keys (wrap a spec
in :class:`Opt` when the key may be absent), and :class:`AnyMap` for a map of short string keys to scalars.
Every number a member acts on has bounds here, so no well-formed message can carry a value that stops a
task or makes a member wait forever (a heartbeat period of 1e300, a round of 2^31 − 1 for a heartbeat...).
Adding a message type is adding one entry to ``SCHEMAS``.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_STR = 4096
MAX_LIST = 100_000
MAX_NAME = 64  # a member's name and a mesh's name: letters, digits, '-', '_', '.'
MAX_PEERS_LISTED = 1024  # peers in one gossip, welcome or status message
MAX_NEWS = 16  # membership changes carried by one ping or pong (net/endpoint.py's probing membership)
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
ROLES = ("node", "bootstrap", "coordinator")
STATES = ("joining", "alive", "suspect", "dead", "left")
MAX_ROUND = (1 << 31) - 1
MIN_HEARTBEAT, MAX_HEARTBEAT = 0.01, 60.0  # seconds: a member's advertised heartbeat period


class SchemaError(ValueError):
    """A body did not match its message type's schema."""


def clip(value: Any, limit: int = 200) -> str:
    """repr(value) cut to about limit characters: what an error message or a log line may echo of input."""
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    return text if len(text) <= limit else f"{text[:limit]}… ({len(value) if hasattr(value, '__len__') else '?'} long)"


def cut(text: str, limit: int = 300) -> str:
    """Text for a log line or a refusal's reason: control characters escaped, at most about limit characters."""
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


def is_name(value: Any) -> bool:
    """True for a valid member or mesh name (also the only names log lines may carry unquoted)."""
    return isinstance(value, str) and NAME.fullmatch(value) is not None


@dataclass(frozen=True)
class Opt:
    """A map key that may be absent."""

    spec: Any


@dataclass(frozen=True)
class AnyMap:
    """A map of short string keys to scalars (str, int, finite float, bool, None): free-form metadata."""

    max_items: int = 256


@dataclass(frozen=True)
class Text:
    """A string of at most max_len characters; pattern, if given, must match all of it."""

    max_len: int = MAX_STR
    pattern: re.Pattern[str] | None = None


@dataclass(frozen=True)
class Int:
    """An integer in [lo, hi]."""

    lo: int
    hi: int


@dataclass(frozen=True)
class Num:
    """A finite number in [lo, hi]."""

    lo: float
    hi: float


@dataclass(frozen=True)
class OneOf:
    """One of a few strings."""

    values: tuple[str, ...]


@dataclass(frozen=True)
class Many:
    """A list of at most max_items items of one spec."""

    spec: Any
    max_items: int


@dataclass(frozen=True)
class Address:
    """tcp://HOST:PORT with a host name, IPv4 or [IPv6] address and a port in 1..65535: what a member
    dials. Anything else would make the dialling socket raise (one bad entry must never stop a member)."""

    max_len: int = 256


LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"  # '_' too: container and lab host names use it
HOSTNAME = re.compile(rf"(?=.{{1,253}}$){LABEL}(\.{LABEL})*")


def check_address(value: Any, max_len: int = 256) -> str:
    """Return the reason value is not a dialable tcp://HOST:PORT address, or "" if it is one."""
    if not isinstance(value, str) or len(value) > max_len or not value.startswith("tcp://"):
        return "must be tcp://HOST:PORT"
    host, sep, port = value[len("tcp://"):].rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        return "must be tcp://HOST:PORT with a port in 1..65535"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return "has a bad IPv6 address"
    elif not HOSTNAME.fullmatch(host):
        return "has a bad host"
    return ""


NAME_SPEC = Text(MAX_NAME, NAME)
ROUND = Int(0, MAX_ROUND)
INCARNATION = Int(0, (1 << 63) - 1)
PUBKEY = Text(64)  # a CURVE public key in z85 is 40 characters; "" in an unkeyed mesh

PEER = {
    "name": NAME_SPEC,
    "address": Address(),
    "role": OneOf(ROLES),
    "incarnation": INCARNATION,
    "pubkey": PUBKEY,
    "state": OneOf(STATES),
    "age": Num(0.0, 1e9),
    "round": ROUND,
}

# heartbeat: the sender's heartbeat period in seconds, so members configured with different periods
# judge each other's silence by the slower of the two (see PeerTable.sweep).
# recipe: the fingerprint of what a learning member trains (Scenario.fingerprint); "" or absent for a member
# that trains nothing (a bootstrap) or does not know its method yet (a node told it by its coordinator)
RECIPE = Text(16, re.compile(r"[0-9a-f]{0,16}"))
# membership: the member's form of membership ("probe" or "all", net/endpoint.py); members of one mesh must share
# it (an "all" member would time the silence of "probe" members, who heartbeat only their partners)
MEMBERSHIP_FORMS = ("probe", "all")
IDENTITY = {"address": Address(), "role": OneOf(ROLES), "incarnation": INCARNATION, "pubkey": PUBKEY,
            "round": ROUND, "heartbeat": Num(MIN_HEARTBEAT, MAX_HEARTBEAT), "recipe": Opt(RECIPE),
            "membership": Opt(OneOf(MEMBERSHIP_FORMS))}
PEERS = Many(PEER, MAX_PEERS_LISTED)
KIND = Text(32)
# a note's number (a score, an influence): bounded so that a method's arithmetic on it (squares, means, a
# standardised row) stays finite; 1e308 made a coordinator's OPTICS fail on NaN
NOTE_VALUE = Num(-1e9, 1e9)

# What a learning member tells whoever asks for its status (p2pfed dashboard): its method, its last CURVE
# evaluations (round, accuracy, loss; -1: no loss), the peers it chose, the peers it dropped from its choice
# (absent from a member that drops none, or from one older than the field), its scores of peers (names and values
# pair up) and, from a coordinator, its grouping of nodes (names and groups pair up). Nothing of its data.
CURVE = 200
LEARNING = {"method": Text(64), "rounds": Many(ROUND, CURVE), "accuracy": Many(Num(0.0, 1.0), CURVE),
            "loss": Many(Num(-1.0, 1e9), CURVE), "chosen": Many(NAME_SPEC, MAX_PEERS_LISTED),
            "names": Many(NAME_SPEC, MAX_PEERS_LISTED), "values": Many(NOTE_VALUE, MAX_PEERS_LISTED),
            "groups": Many(Int(-1, 1 << 20), MAX_PEERS_LISTED), "dropped": Opt(Many(NAME_SPEC, MAX_PEERS_LISTED))}

SCHEMAS: dict[str, dict[str, Any]] = {
    # membership
    "hello": IDENTITY,
    "welcome": {**IDENTITY, "peers": PEERS},
    "heartbeat": IDENTITY,
    "gossip": {**IDENTITY, "peers": PEERS},
    # the probing membership (net/endpoint.py): a member asks one peer a period whether it is alive (ping, answered
    # by pong, on a connection the sender closes once answered), and both carry the few changes of membership their
    # sender saw first-hand (news)
    "ping": {**IDENTITY, "news": Many(PEER, MAX_NEWS)},
    "pong": {**IDENTITY, "news": Many(PEER, MAX_NEWS)},
    "leave": {},
    "status_req": {},
    "status": {**IDENTITY, "name": NAME_SPEC, "peers": PEERS, "learning": Opt(LEARNING)},
    # delivery
    "ack": {"ref": Text(64), "ok": bool, "reason": Text(512), "retry": Opt(bool)},
    # learning: a model (or part of one) as tensors, with what it is for and metadata
    "model": {"kind": KIND, "samples": Int(0, 1 << 40), "meta": AnyMap()},
    "request": {"kind": KIND, "meta": AnyMap()},
    # a method's small message about peers, with no tensors (a node's choice of peers, a node's scores asked
    # for by a coordinator): which kinds a member takes is its method's to say; names and values pair up
    "note": {"kind": KIND, "names": Many(NAME_SPEC, MAX_PEERS_LISTED), "values": Many(NOTE_VALUE, MAX_PEERS_LISTED),
             "meta": AnyMap()},
    "control": {"kind": KIND, "meta": AnyMap()},
    # a coordinator's task for a node (methods/central.py): candidate models travel as tensors named
    # "<index>/<parameter>"; groups names each candidate's group, names what a note task's numbers are for,
    # shared how many leading models every node shares (not candidates); meta is the method's typed instructions
    "task": {"kind": KIND, "method": Text(64), "groups": Many(Int(-1, 1 << 20), MAX_LIST),
             "names": Many(NAME_SPEC, MAX_LIST), "shared": Int(0, MAX_LIST), "meta": AnyMap()},
}

# The message types that may carry tensors; any other type's message carrying some is refused before its frames are
# read (and a member that moves no models never imports torch to read them: wire/codec.py, ITEMSIZES).
TENSORS = frozenset({"model", "task"})


def check_body(mtype: str, body: Any) -> None:
    """Raise SchemaError unless body matches the schema of message type mtype.

    Every message sent and received is checked, so the usual case, a body that matches, is answered by the
    schema's compiled form (_compile: about 5x faster on a ping and its news); only a body that fails is
    walked again by check_value, for the error that says where and why."""
    if not _MATCHES[mtype](body):
        check_value(body, SCHEMAS[mtype], "body")
        raise TypeError(f"the compiled schema of {mtype} refused a body check_value takes")  # pragma: no cover


def check_value(value: Any, spec: Any, where: str) -> None:
    """Raise SchemaError unless value matches spec (see the module docstring for the spec language)."""
    if spec is str:
        spec = Text()
    if isinstance(spec, Text):
        if not isinstance(value, str) or len(value) > spec.max_len:
            raise SchemaError(f"{where} must be a string of at most {spec.max_len} chars")
        if spec.pattern is not None and not spec.pattern.fullmatch(value):
            raise SchemaError(f"{where} must be letters, digits, '-', '_' or '.' (got {clip(value, 80)})")
    elif spec is bool:
        if not isinstance(value, bool):
            raise SchemaError(f"{where} must be a boolean")
    elif spec is int or isinstance(spec, Int):
        lo, hi = (spec.lo, spec.hi) if isinstance(spec, Int) else (-(1 << 63) + 1, (1 << 63) - 1)
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise SchemaError(f"{where} must be an integer in [{lo}, {hi}] (got {clip(value, 40)})")
    elif spec is float or isinstance(spec, Num):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SchemaError(f"{where} must be a finite number")
        if isinstance(spec, Num) and not spec.lo <= value <= spec.hi:
            raise SchemaError(f"{where} must be in [{spec.lo:g}, {spec.hi:g}] (got {value:g})")
    elif isinstance(spec, OneOf):
        if value not in spec.values:
            raise SchemaError(f"{where} must be one of {', '.join(spec.values)} (got {clip(value, 40)})")
    elif isinstance(spec, Address):
        reason = check_address(value, spec.max_len)
        if reason:
            raise SchemaError(f"{where} {reason} (got {clip(value, 80)})")
    elif isinstance(spec, (list, Many)):
        item, most = (spec[0], MAX_LIST) if isinstance(spec, list) else (spec.spec, spec.max_items)
        if not isinstance(value, list) or len(value) > most:
            raise SchemaError(f"{where} must be a list of at most {most} items")
        for i, v in enumerate(value):
            check_value(v, item, f"{where}[{i}]")
    elif isinstance(spec, dict):
        if not isinstance(value, dict):
            raise SchemaError(f"{where} must be a map")
        required = {k for k, s in spec.items() if not isinstance(s, Opt)}
        missing = required - set(value)
        extra = set(value) - set(spec)
        if missing or extra:
            raise SchemaError(f"{where} keys: missing {sorted(missing)}, unexpected "
                              f"{clip(sorted(map(str, extra))[:5], 120)}")
        for key, item in value.items():
            sub = spec[key]
            check_value(item, sub.spec if isinstance(sub, Opt) else sub, f"{where}.{key}")
    elif isinstance(spec, AnyMap):
        if not isinstance(value, dict) or len(value) > spec.max_items:
            raise SchemaError(f"{where} must be a map of at most {spec.max_items} items")
        for key, item in value.items():
            if not isinstance(key, str) or len(key) > 128:
                raise SchemaError(f"{where} keys must be short strings")
            if item is None or isinstance(item, (bool, int)):
                continue
            if isinstance(item, float) and not math.isfinite(item):
                raise SchemaError(f"{where}.{key} must be finite")
            if isinstance(item, str) and len(item) > MAX_STR:
                raise SchemaError(f"{where}.{key} is too long")
            if not isinstance(item, (str, float)):
                raise SchemaError(f"{where}.{key} must be a scalar")
    else:  # pragma: no cover - a bug in SCHEMAS, not in the input
        raise TypeError(f"bad schema at {where}: {spec!r}")


def _compile(spec: Any) -> Callable[[Any], bool]:
    """spec as one function that says whether a value matches it: what check_value accepts, without building the
    path of each value checked (check_value's names for its errors, the bulk of its time on a valid body)."""
    if spec is str:
        spec = Text()
    if isinstance(spec, Text):
        most, pattern = spec.max_len, spec.pattern
        if pattern is None:
            return lambda v: isinstance(v, str) and len(v) <= most
        full = pattern.fullmatch
        return lambda v: isinstance(v, str) and len(v) <= most and full(v) is not None
    if spec is bool:
        return lambda v: isinstance(v, bool)
    if spec is int or isinstance(spec, Int):
        lo, hi = (spec.lo, spec.hi) if isinstance(spec, Int) else (-(1 << 63) + 1, (1 << 63) - 1)
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    if spec is float or isinstance(spec, Num):
        lo_f, hi_f = (spec.lo, spec.hi) if isinstance(spec, Num) else (-math.inf, math.inf)
        isfinite = math.isfinite
        return lambda v: (not isinstance(v, bool) and isinstance(v, (int, float)) and isfinite(v)
                          and lo_f <= v <= hi_f)
    if isinstance(spec, OneOf):
        values = spec.values
        return lambda v: v in values
    if isinstance(spec, Address):
        most_chars = spec.max_len
        return lambda v: isinstance(v, str) and len(v) <= most_chars and _dialable(v)
    if isinstance(spec, (list, Many)):
        item_spec, most_items = (spec[0], MAX_LIST) if isinstance(spec, list) else (spec.spec, spec.max_items)
        item = _compile(item_spec)
        return lambda v: isinstance(v, list) and len(v) <= most_items and all(map(item, v))
    if isinstance(spec, dict):
        keys = {k: _compile(s.spec if isinstance(s, Opt) else s) for k, s in spec.items()}
        required = frozenset(k for k, s in spec.items() if not isinstance(s, Opt))

        def matches(v: Any) -> bool:
            if not isinstance(v, dict) or not required.issubset(v):
                return False
            for key, value in v.items():
                check = keys.get(key)
                if check is None or not check(value):
                    return False
            return True

        return matches
    if isinstance(spec, AnyMap):
        return lambda v: _any_map(v, spec.max_items)
    raise TypeError(f"bad schema: {spec!r}")  # pragma: no cover - a bug in SCHEMAS, not in the input


@functools.lru_cache(maxsize=4096)
def _dialable(address: str) -> bool:
    """check_address without its reasons, remembered: the same few addresses come in every ping and table."""
    return not check_address(address, len(address))


def _any_map(v: Any, most: int) -> bool:
    if not isinstance(v, dict) or len(v) > most:
        return False
    for key, item in v.items():
        if not isinstance(key, str) or len(key) > 128:
            return False
        if item is None or isinstance(item, (bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif not isinstance(item, str) or len(item) > MAX_STR:
            return False
    return True


_MATCHES = {mtype: _compile(spec) for mtype, spec in SCHEMAS.items()}


# Messages that never get a reply; every other message is answered (at least with an ack) so that its
# sender learns it arrived or that it timed out.
NO_REPLY = frozenset({"heartbeat", "gossip", "leave", "ack", "welcome", "status", "pong"})
GOODBYE = "leave"  # what a member says as it leaves: the connection it came by closes next
