"""Scenario files from before 0.1, in one place: where each setting that moved went.

Two kinds of key moved. The shared ``[pfedlia]`` and ``[central]`` tables became each method's own
``[methods.NAME]`` table (the table below, ``FORMER``: one former key can now be a key of several methods,
each of which must be set). The partition's options left ``[data]`` for ``[data.partition]`` (``DATA``).
``migrate`` does not rewrite a file: it says, all at once, where every such key went, so the user fixes the
file once. It knows the methods only by name (this module sits below them); tests/methods/test_options.py
checks that every target is a field of that method's options.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from p2pfed.config import ConfigError
from p2pfed.learn.partition import PARTITIONS
from p2pfed.wire.messages import clip

# "table.key" of a former table -> every "method.key" in [methods.METHOD] that key is now
MOVES = {
    "central.cam_warmup": "ifca-cam.warmup fesem-cam.warmup feddsmic.warmup fedds.warmup",
    "central.cfl_eps1": "cfl.eps1",
    "central.cfl_eps2": "cfl.eps2",
    "central.cfl_min_size": "cfl.min_size",
    "central.cfl_warmup": "cfl.warmup",
    "central.fedfm_every": "fedfm-lite.every",
    "central.fedfm_lambda": "fedfm.lam fedfm-l2.lam fedfm-lite.lam",
    "central.fedfm_start": "fedfm.start fedfm-l2.start fedfm-lite.start",
    "central.fedfm_temperature": "fedfm.temperature fedfm-l2.temperature fedfm-lite.temperature",
    "central.fedfm_uniform": "fedfm.uniform fedfm-l2.uniform fedfm-lite.uniform",
    "central.fesem_lambda": "fesem.penalty fesem-cam.penalty",
    "central.fomo_epsilon": "fedfomo.epsilon",
    "central.fomo_m": "fedfomo.m",
    "central.indicator_per_class": "feddsmic.indicator_per_class fedds.indicator_per_class",
    "central.k": "fesem.k ifca.k ifca-cam.k fesem-cam.k feddsmic.k fedds.k",
    "central.lia_timeout": "pfedlia-central.lia_timeout",
    "central.maml_inner_lr": "feddsmic.inner_lr fedds.inner_lr",
    "central.optics_min_samples": "pfedlia-central.optics_min_samples",
    "central.optics_xi": "pfedlia-central.optics_xi",
    "central.proto_lambda": "fedproto.lam",
    "central.prox_mu": "fedprox.mu",
    "pfedlia.gap": "pfedlia-p2p.gap",
    "pfedlia.lia_batch": "pfedlia-central.lia_batch pfedlia-p2p.lia_batch",
    "pfedlia.lia_epochs": "pfedlia-central.lia_epochs pfedlia-p2p.lia_epochs",
    "pfedlia.lia_lr": "pfedlia-central.lia_lr pfedlia-p2p.lia_lr",
    "pfedlia.warmup_rounds": "pfedlia-central.warmup_rounds pfedlia-p2p.warmup_rounds",
}
FORMER: dict[tuple[str, str], list[tuple[str, str]]] = {
    (old.split(".")[0], old.split(".")[1]): [(m, k) for m, _, k in (t.partition(".") for t in now.split())]
    for old, now in MOVES.items()}
FORMER_TABLES = tuple(sorted({table for table, _ in FORMER}))

# [data] keys that are now the options of a partition, [data.partition] (renamed where the partition's table
# makes a prefix redundant)
DATA = {"clusters": "clusters", "alpha": "alpha", "extra_labels": "extra_labels", "extra_prob": "extra_prob",
        "alpha_between": "alpha_between", "alpha_within": "alpha_within", "k_cluster": "k_cluster",
        "k_client": "k_client", "dominant_classes": "classes", "dominant_share": "share",
        "missing_classes": "classes"}


def migrate(data: dict[str, Any]) -> None:
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
    for table in FORMER_TABLES:
        keys = data.get(table)
        if not isinstance(keys, dict):
            continue
        for key in keys:
            now = FORMER.get((table, key))
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
