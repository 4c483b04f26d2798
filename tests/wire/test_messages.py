"""Every rule of the body schemas: a body of the wrong type or size anywhere is refused, with its path."""

from __future__ import annotations

import math
import random

import pytest

from p2pfed.wire.messages import (
    MAX_LIST,
    MAX_STR,
    NAME,
    NAME_SPEC,
    SCHEMAS,
    Address,
    AnyMap,
    Int,
    Many,
    Num,
    OneOf,
    Opt,
    SchemaError,
    Text,
    check_address,
    check_body,
    check_value,
    clip,
    cut,
)

GOOD_META = {"epochs": 2, "lr": 0.1, "name": "x", "flag": True, "none": None}


@pytest.mark.parametrize(("value", "spec", "reason"), [
    (3, str, r"body must be a string of at most 4096"),
    ("x" * (MAX_STR + 1), str, r"body must be a string"),
    (1, bool, r"body must be a boolean"),
    (True, int, r"body must be an integer"),
    (1.0, int, r"body must be an integer"),
    (1 << 63, int, r"body must be an integer"),
    (-(1 << 63), int, r"body must be an integer"),
    (math.nan, float, r"body must be a finite number"),
    (math.inf, float, r"body must be a finite number"),
    (-math.inf, float, r"body must be a finite number"),
    (True, float, r"body must be a finite number"),
    ("1.0", float, r"body must be a finite number"),
    ((1, 2), [int], r"body must be a list"),
    ([0] * (MAX_LIST + 1), [int], r"body must be a list of at most 100000 items"),
    ([1, "2"], [int], r"body\[1\] must be an integer"),
    ([1, 2], {"a": int}, r"body must be a map"),
    ({}, {"a": int}, r"missing \['a'\]"),
    ({"a": 1, "b": 2}, {"a": int}, r"unexpected \['b'\]"),
    ({"a": math.nan}, {"a": Opt(float)}, r"body\.a must be a finite number"),
    ([], AnyMap(), r"body must be a map of at most 256 items"),
    ({str(i): i for i in range(3)}, AnyMap(max_items=2), r"at most 2 items"),
    ({1: 1}, AnyMap(), r"keys must be short strings"),
    ({"k" * 129: 1}, AnyMap(), r"keys must be short strings"),
    ({"lr": math.nan}, AnyMap(), r"body\.lr must be finite"),
    ({"lr": math.inf}, AnyMap(), r"body\.lr must be finite"),
    ({"s": "x" * (MAX_STR + 1)}, AnyMap(), r"body\.s is too long"),
    ({"l": [1]}, AnyMap(), r"body\.l must be a scalar"),
    ({"b": b"x"}, AnyMap(), r"body\.b must be a scalar"),
])
def test_a_value_that_breaks_its_spec_is_refused_with_its_path(value: object, spec: object, reason: str) -> None:
    with pytest.raises(SchemaError, match=reason):
        check_value(value, spec, "body")


@pytest.mark.parametrize(("value", "spec"), [
    ("x" * MAX_STR, str), (False, bool), ((1 << 63) - 1, int), (-(1 << 63) + 1, int), (3, float), (2.5, float),
    ([], [int]), ({"a": 1}, {"a": int, "b": Opt(int)}), (GOOD_META, AnyMap()), ({"k" * 128: 1}, AnyMap()),
])
def test_values_at_the_limits_are_accepted(value: object, spec: object) -> None:
    check_value(value, spec, "body")


def test_every_message_type_checks_its_body() -> None:
    identity = {"address": "tcp://10.0.0.1:7000", "role": "node", "incarnation": 1, "pubkey": "", "round": 0,
                "heartbeat": 1.0}
    check_body("heartbeat", identity)  # without a recipe (a member that trains nothing)
    check_body("heartbeat", {**identity, "recipe": "0123456789abcdef"})
    check_body("model", {"kind": "model", "samples": 3, "meta": GOOD_META})
    check_body("note", {"kind": "scores", "names": ["a", "b"], "values": [1e9, -1e9], "meta": {}})
    for mtype, body in [("heartbeat", {**identity, "heartbeat": math.nan}),
                        ("heartbeat", {**identity, "round": 1.5}),
                        ("heartbeat", {**identity, "recipe": "0123456789abcdef0"}),  # 17 digits
                        ("heartbeat", {**identity, "recipe": "0123\n6789abcdef"}),  # not hex: a forged log line
                        ("heartbeat", {**identity, "recipe": 7}),
                        ("model", {"kind": "model", "samples": 3, "meta": {"lr": math.inf}}),
                        ("note", {"kind": "scores", "names": ["a"], "values": [math.nan], "meta": {}}),
                        ("note", {"kind": "scores", "names": ["a"], "values": [1e308], "meta": {}}),
                        ("note", {"kind": "scores", "names": ["a"], "values": [-1.0000001e9], "meta": {}}),
                        ("ack", {"ref": "x", "ok": 1, "reason": ""})]:
        with pytest.raises(SchemaError):
            check_body(mtype, body)
    assert {"hello", "heartbeat", "gossip", "model", "task", "ack"} <= set(SCHEMAS)


def test_clip_echoes_at_most_about_limit_characters_of_any_value() -> None:
    assert clip("abc") == "'abc'" and clip([1, 2, 3]) == "[1, 2, 3]" and clip(None) == "None"
    assert clip("x" * 198) == repr("x" * 198)  # 200 characters with the quotes: whole
    assert clip("x" * 199) == repr("x" * 199)[:200] + "… (199 long)"
    assert clip("x" * 10**6) == repr("x" * 201)[:200] + "… (1000000 long)"  # a huge string is never repr'd whole
    assert clip(list(range(100)), 20) == "[0, 1, 2, 3, 4, 5, 6… (100 long)"
    assert clip(10**300, 10) == "1000000000… (? long)"  # no length to tell


def test_cut_escapes_control_characters_and_keeps_about_limit_characters() -> None:
    assert cut("plain text") == "plain text"
    assert cut("a\nb\x1b[31m") == "a\\nb\\x1b[31m"  # a forged log line or a terminal escape stays one line
    assert cut("é ü") == "é ü"  # printable non-ASCII stays as it is
    assert cut("x" * 300) == "x" * 300
    assert cut("x" * 301) == "x" * 300 + "… (301 chars)"
    assert cut("\n" * 200, 10) == "\\n" * 5 + "… (400 chars)"  # the escaped text is what is cut and counted


HOST_245 = ".".join(["h" * 60] * 3 + ["h" * 62])  # a host name of 245 characters (labels of at most 63)


@pytest.mark.parametrize(("address", "reason"), [
    ("tcp://10.0.0.1:1", ""), ("tcp://10.0.0.1:65535", ""), ("tcp://host-1.example.org:7000", ""),
    ("tcp://[::1]:7000", ""), ("tcp://[fe80::1]:1", ""), (f"tcp://{HOST_245}:7000", ""),  # 256 chars
    (f"tcp://{HOST_245}0:7000", "must be tcp://HOST:PORT"),  # 257 chars
    (7000, "must be tcp://HOST:PORT"), ("udp://10.0.0.1:7000", "must be tcp://HOST:PORT"),
    ("garbage", "must be tcp://HOST:PORT"),
    ("tcp://10.0.0.1", "must be tcp://HOST:PORT with a port in 1..65535"),
    ("tcp://10.0.0.1:", "must be tcp://HOST:PORT with a port in 1..65535"),
    ("tcp://10.0.0.1:x", "must be tcp://HOST:PORT with a port in 1..65535"),
    ("tcp://10.0.0.1:0", "must be tcp://HOST:PORT with a port in 1..65535"),
    ("tcp://10.0.0.1:65536", "must be tcp://HOST:PORT with a port in 1..65535"),
    ("tcp://[::zz]:7000", "has a bad IPv6 address"), ("tcp://[]:7000", "has a bad IPv6 address"),
    ("tcp://[::1x]:7000", "has a bad IPv6 address"),
    ("tcp://[::1:7000", "has a bad host"), ("tcp://::1]:7000", "has a bad host"), ("tcp://::1:7000", "has a bad host"),
    ("tcp://no such host:7000", "has a bad host"), ("tcp://:7000", "has a bad host"),
])
def test_an_address_is_a_dialable_tcp_host_and_port(address: object, reason: str) -> None:
    assert check_address(address) == reason
    if reason:
        with pytest.raises(SchemaError) as exc:
            check_value(address, Address(), "body.address")
        assert str(exc.value) == f"body.address {reason} (got {clip(address, 80)})"
    else:
        check_value(address, Address(), "body.address")
    assert check_address("tcp://h:1", max_len=9) == "" and check_address("tcp://h:10", max_len=9) != ""
    check_value("tcp://h:1", Address(max_len=9), "a")
    with pytest.raises(SchemaError, match="must be tcp://HOST:PORT"):  # the spec's own length
        check_value("tcp://h:10", Address(max_len=9), "a")


LONG = "z" * 300


@pytest.mark.parametrize(("value", "spec", "reason"), [
    ("a b", NAME_SPEC, "body must be letters, digits, '-', '_' or '.' (got 'a b')"),
    ("n" * 65, NAME_SPEC, "body must be a string of at most 64 chars"),
    (LONG, Text(400, NAME), f"body must be letters, digits, '-', '_' or '.' (got {clip(LONG, 80)})"),
    (11, Int(0, 10), "body must be an integer in [0, 10] (got 11)"),
    (-1, Int(0, 10), "body must be an integer in [0, 10] (got -1)"),
    (1 << 63, int, f"body must be an integer in [{-(1 << 63) + 1}, {(1 << 63) - 1}] (got {1 << 63})"),
    ("9" * 100, Int(0, 10), f"body must be an integer in [0, 10] (got {clip('9' * 100, 40)})"),
    (0.005, Num(0.01, 60), "body must be in [0.01, 60] (got 0.005)"),
    (60.5, Num(0.01, 60), "body must be in [0.01, 60] (got 60.5)"),
    (math.nan, Num(0.01, 60), "body must be a finite number"),
    ("x", OneOf(("node", "bootstrap")), "body must be one of node, bootstrap (got 'x')"),
    (LONG, OneOf(("node",)), f"body must be one of node (got {clip(LONG, 40)})"),
    (["a"] * 4, Many(str, 3), "body must be a list of at most 3 items"),
    ({"a": 1, **{f"x{i}": 0 for i in range(9)}}, {"a": int},
     f"body keys: missing [], unexpected {clip(['x0', 'x1', 'x2', 'x3', 'x4'], 120)}"),
    ({f"{'k' * 60}{i}": 0 for i in range(5)}, {},
     f"body keys: missing [], unexpected {clip([f'{chr(107) * 60}{i}' for i in range(5)], 120)}"),
    ({"s": "x" * (MAX_STR + 1)}, AnyMap(), "body.s is too long"),
    ({"k": 1.5, "m": [1]}, AnyMap(), "body.m must be a scalar"),
    ({"n": None, "t": True, "i": 3, "m": [1]}, AnyMap(), "body.m must be a scalar"),  # every item is checked
    ({"a": 1, "b": 2, "c": 3}, AnyMap(max_items=2), "body must be a map of at most 2 items"),
])
def test_a_schema_refusal_says_exactly_what_was_wrong(value: object, spec: object, reason: str) -> None:
    with pytest.raises(SchemaError) as exc:
        check_value(value, spec, "body")
    assert str(exc.value) == reason


@pytest.mark.parametrize(("value", "spec"), [
    ("n" * 64, NAME_SPEC), (0, Int(0, 10)), (10, Int(0, 10)), (0.01, Num(0.01, 60)), (60, Num(0.01, 60)),
    ("node", OneOf(("node",))), (["a"] * 3, Many(str, 3)), ({"a": 1, "b": 2}, AnyMap(max_items=2)),
    ({"s": "x" * MAX_STR, "n": None, "b": True, "f": 1.5}, AnyMap()),
])
def test_values_at_the_schema_bounds_are_accepted(value: object, spec: object) -> None:
    check_value(value, spec, "body")


def test_a_schema_the_code_got_wrong_is_a_type_error_not_a_refusal() -> None:
    with pytest.raises(TypeError, match=r"^bad schema at body\.x: 3$"):
        check_value(1, 3, "body.x")


def _example(spec: object, rng: random.Random) -> object:
    """A value that matches spec (optional keys kept or left out at random)."""
    if spec is str or isinstance(spec, Text):
        pattern = spec.pattern if isinstance(spec, Text) else None
        return next(v for v in ("n1", "0a", "x") if pattern is None or pattern.fullmatch(v))
    if spec is bool:
        return True
    if spec is int or spec is float:
        return 1
    if isinstance(spec, (Int, Num)):
        return spec.lo
    if isinstance(spec, OneOf):
        return rng.choice(spec.values)
    if isinstance(spec, Address):
        return rng.choice(["tcp://10.0.0.1:7000", "tcp://[::1]:5", "tcp://host_1.lab:65535"])
    if isinstance(spec, (list, Many)):
        item = spec[0] if isinstance(spec, list) else spec.spec
        return [_example(item, rng) for _ in range(rng.randint(0, 3))]
    if isinstance(spec, dict):
        return {k: _example(s.spec if isinstance(s, Opt) else s, rng) for k, s in spec.items()
                if not isinstance(s, Opt) or rng.random() < 0.5}
    assert isinstance(spec, AnyMap)
    return dict(GOOD_META)


ODD = [None, True, False, 0, -1, 1 << 63, -(1 << 63), 2.5, math.nan, math.inf, -math.inf, 1e308, "", "x" * 5000,
       "a b", "n1", "alive", "node", "probe", "0123456789abcdef0", "tcp://h:1", "tcp://h:0", "tcp://[::1]:70000",
       "tcp://[zz]:5", "tcp://-bad-:5", [], {}, [1], [math.nan], {"a": 1}, {"k" * 129: 1}, {"l": [1]}, b"x"]


def _mutate(value: object, rng: random.Random) -> object:
    """value with one thing somewhere in it changed: a leaf replaced by an odd value, a key dropped or added."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        roll = rng.random()
        if roll < 0.15:
            return {k: v for k, v in value.items() if k != key}
        if roll < 0.25:
            return {**value, rng.choice(["extra", "news", "peers", 1]): rng.choice(ODD)}
        return {**value, key: _mutate(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.7:
        i = rng.randrange(len(value))
        return [*value[:i], _mutate(value[i], rng), *value[i + 1:]]
    return rng.choice(ODD)


def test_the_compiled_schemas_take_exactly_what_check_value_takes() -> None:
    """check_body answers a matching body from the schema's compiled form and walks it again only to word an
    error: the two must agree on every body, or a message would pass one check and not the other."""
    from p2pfed.wire.messages import _MATCHES

    rng = random.Random(0)
    refused = 0
    for _ in range(4000):
        mtype = rng.choice(sorted(SCHEMAS))
        body = _example(SCHEMAS[mtype], rng)
        for _ in range(rng.randint(0, 2)):
            body = _mutate(body, rng)
        try:
            check_value(body, SCHEMAS[mtype], "body")
            takes = True
        except SchemaError:
            takes = False
        assert _MATCHES[mtype](body) == takes, (mtype, body)
        if takes:
            check_body(mtype, body)
        else:
            refused += 1
            with pytest.raises(SchemaError):
                check_body(mtype, body)
    assert 1000 < refused < 3900  # both sides of the line were tried, many times
