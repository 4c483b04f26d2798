"""Where each key of the former shared tables, ``[pfedlia]`` and ``[central]`` (before 0.1), went: to every
method that has it now, in its own ``[methods.NAME]`` table. scenario/migrate.py turns a file that still has
them into one error naming each; tests/methods/test_options.py checks that every target is a field of that
method's options."""

from __future__ import annotations

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
    (old.partition(".")[0], old.partition(".")[2]): [(m, k) for m, _, k in (t.partition(".") for t in now.split())]
    for old, now in MOVES.items()}

