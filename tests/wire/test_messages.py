"""Every rule of the body schemas: a body of the wrong type or size anywhere is refused, with its path."""

from __future__ import annotations

import math

import pytest

from p2pfed.wire.messages import MAX_LIST, MAX_STR, SCHEMAS, AnyMap, Opt, SchemaError, check_body, check_value

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
    check_body("heartbeat", identity)
    check_body("model", {"kind": "model", "samples": 3, "meta": GOOD_META})
    for mtype, body in [("heartbeat", {**identity, "heartbeat": math.nan}),
                        ("heartbeat", {**identity, "round": 1.5}),
                        ("model", {"kind": "model", "samples": 3, "meta": {"lr": math.inf}}),
                        ("scores", {"peers": ["a"], "values": [math.nan], "meta": {}}),
                        ("ack", {"ref": "x", "ok": 1, "reason": ""})]:
        with pytest.raises(SchemaError):
            check_body(mtype, body)
    assert {"hello", "heartbeat", "gossip", "model", "task", "ack"} <= set(SCHEMAS)
