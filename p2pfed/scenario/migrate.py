"""Scenario files from before 0.1: one function, ``migrate``, says where each setting that moved went.

Two kinds of key moved. The tables several methods once shared became each method's own ``[methods.NAME]``
table: one former key can now be a key of several methods, each of which must be set.
Where each went is the methods' to say (methods/former.py), handed in as ``former``: this module sits below
the methods and names none. The partition's options left ``[data]`` for ``[data.partition]`` (``DATA``).
``migrate`` does not rewrite a file: it says, all at once, where every such key went, so the user fixes the
file once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from p2pfed.config import ConfigError
from p2pfed.learn.partition import PARTITIONS
from p2pfed.wire.messages import clip

# where each key of a former shared table went, (table, key) -> every (method, its key in [methods.METHOD]):
# the methods' table (methods/former.py), passed in by the loader, since this module sits below the methods
Former = Mapping[tuple[str, str], Sequence[tuple[str, str]]]

# [data] keys that are now the options of a partition, [data.partition] (renamed where the partition's table
# makes a prefix redundant)
DATA = {"clusters": "clusters", "alpha": "alpha", "extra_labels": "extra_labels", "extra_prob": "extra_prob",
        "alpha_between": "alpha_between", "alpha_within": "alpha_within", "k_cluster": "k_cluster",
        "k_client": "k_client", "dominant_classes": "classes", "dominant_share": "share",
        "missing_classes": "classes"}


def tables(former: Former) -> list[str]:
    """The former tables, whose keys former says where they went."""
    return sorted({table for table, _ in former})


def migrate(data: dict[str, Any], former: Former) -> None:
    """Raise ConfigError naming, all at once, where each key of a former shared table went (a table left
    empty goes too), and each [data] key that is now a partition's option; do nothing for a current file."""
    gone = []
    keys = data.get("data")
    if isinstance(keys, dict):
        kind = keys.get("partition")
        if isinstance(kind, str):
            gone.append(f"data.partition is now a table: [data.partition] kind = {clip(kind, 40)}, with the "
                        "partition's options")
        # the file's partition (pathological when it named none) says whether each key is one of its options
        options = PARTITIONS.get(kind if isinstance(kind, str) else "pathological")
        known = {f.name for f in dataclasses.fields(options)} if options is not None else set()  # type: ignore[arg-type]
        for key, new in DATA.items():
            if key not in keys:
                continue
            if options is None or new in known:
                gone.append(f"data.{key} is now data.partition.{new} ([data.partition] {new} = ...)")
            else:
                gone.append(f"data.{key} is not an option of the {options.kind} partition: drop it"
                            + (" (a method with K models takes k in its own table)" if key == "clusters" else ""))
    for table in tables(former):
        keys = data.get(table)
        if not isinstance(keys, dict):
            continue
        for key in keys:
            now = former.get((table, key))
            if now is None:
                gone.append(f"{table}.{key} is not a known key (the [{table}] table is gone: a method's options "
                            f"are in its own [methods.NAME] table)")
            else:
                method, new = now[0]
                where = ", ".join(f"methods.{m}.{k}" for m, k in now)
                gone.append(f"{table}.{key} is now {where} ([methods.{method}] {new} = ...)")
        if not keys:
            gone.append(f"the [{table}] table is gone: a method's options are in its own [methods.NAME] table")
    if gone:
        raise ConfigError("; ".join(gone))
