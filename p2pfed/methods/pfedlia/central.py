"""pFedLIA with a center (Rokvic et al. 2025, §III-F, "Centralized"): warm-up FedAvg, one round of lazy
influence scoring, OPTICS on the N×N influence matrix (no number of clusters given), then FedAvg inside each
cluster.

The influence phase runs once, at round ``warmup_rounds`` (W): the center sends the warm-up
model w0 to every live node, each trains its partial model on a batch of its data (as in the p2p
method) and sends it back; the center sends every node all partial models, and each node returns the
lazy influence of each on its own validation split: row i of the matrix is node i's view of everyone.

Two clustering rules, ``[methods.pfedlia-central] optics``. ``"paper"`` is the paper's: OPTICS on the raw
matrix. The paper says nothing of OPTICS's noise points (label −1); this rule reads it literally, as OPTICS
leaves them: each a cluster of its own. ``"ours"`` (the default) adds what follows,
where the paper is silent about the scale of rows and about noise points:
- OPTICS clusters the rows after standardising each (zero mean, unit variance): nodes differ in the scale
  of their validation loss, and the pattern of whom a node gains from is what identifies its cluster.
- Noise points, and members of an OPTICS cluster whose own row says they gain nothing from their cluster
  mates (mean influence ≤ 0: OPTICS's xi extraction can absorb a cluster smaller than min_samples into a
  neighbour), are placed one by one in name order: each joins the cluster whose members help it most
  (highest mean influence in its row), if that mean is positive; otherwise it starts a cluster of its
  own, from w0, which the next ones may join. So two nodes that only help each other end up together,
  and every node gets the model its own scores say is best for it.

Under both rules ``optics_min_samples`` and ``optics_xi`` are OPTICS's own parameters. min_samples defaults
to 3: on simulated block matrices with clusters of 4 and noisy rows (tests/methods/pfedlia/test_central.py),
2 split clusters into pairs now and then (mean ARI 0.95 over 30 draws) and 4 merged small clusters (0.83),
while 3 recovered every draw. ``optics_xi`` keeps scikit-learn's default 0.05 (0.1 and 0.2 did the same
there).
- A node that joins after the phase scores the kept partial models and is placed by the placement rule
  above, under both rules: the paper clusters once and says nothing of nodes that come later.
- The node's own partial model is scored too (the diagonal): it is part of its row's pattern.

The node side (``PFedLIAClient``) answers the phase's two tasks: a ``compute`` task with w0 is answered with
the node's partial model, a ``note`` task with w0 and the partial models with their lazy influence.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from sklearn.cluster import OPTICS

from p2pfed.influence.lazy_influence import score_peers
from p2pfed.methods.central import ClientMethod, ServerMethod, Task, Update, keyed, unkeyed
from p2pfed.methods.pfedlia.options import CentralOptions, PaperCentralOptions
from p2pfed.wire import WireError

log = logging.getLogger(__name__)


def optics_clusters(matrix: np.ndarray, min_samples: int, xi: float, standardise: bool = True) -> np.ndarray:
    """OPTICS labels of the rows of an influence matrix, each row standardised first unless told not to
    (−1: noise)."""
    rows = matrix
    if standardise:
        rows = matrix - matrix.mean(axis=1, keepdims=True)
        rows = rows / np.maximum(rows.std(axis=1, keepdims=True), 1e-12)
    return OPTICS(min_samples=min(min_samples, len(rows)), xi=xi).fit(rows).labels_


def best_cluster(row: dict[str, float], groups: dict[str, int]) -> int | None:
    """The cluster whose members help this node most on average, if they help at all."""
    means: dict[int, list[float]] = {}
    for name, value in row.items():
        if name in groups and groups[name] >= 0:
            means.setdefault(groups[name], []).append(value)
    if not means:
        return None
    g, best = max(((g, float(np.mean(v))) for g, v in means.items()), key=lambda x: x[1])
    return g if best > 0 else None


class PFedLIAClient(ClientMethod):
    """The node side: its partial model (a compute task with w0), and its scores (a note task with w0 and the
    partial models, named by node)."""

    options: CentralOptions

    async def compute(self, task: Task) -> Update:
        if len(task.candidates) != 1:
            raise WireError("pfedlia: a partial model is trained from one model, w0")
        cfg = self.options
        partial = await self.node.train_copy(task.candidates[0], cfg.lia_batch, cfg.lia_epochs, cfg.lia_lr)
        return Update(partial)

    async def note(self, task: Task) -> dict[str, float]:
        if not task.models or len(task.names) != len(task.models) - 1:
            raise WireError("pfedlia: a score task is w0 and one named partial model per node")
        w0, partials = task.models[0], task.models[1:]
        values = await self.node.on_validation(
            lambda model, x_val, y_val, device, lt: score_peers(model, w0, partials, x_val, y_val, device, task=lt))
        self.node.record("scores", peers=task.names, values=values)
        return dict(zip(task.names, values, strict=True))


class PFedLIACentralServer(ServerMethod):
    """Warm-up FedAvg (group 0), influence phase at round W, then FedAvg per OPTICS cluster."""

    name = "pfedlia-central"
    options_type = CentralOptions
    client = PFedLIAClient
    options: CentralOptions

    def __init__(self, ctx: Any, options: CentralOptions) -> None:
        super().__init__(ctx, options)
        self.partials: dict[str, dict[str, torch.Tensor]] = {}
        self.w0: dict[str, torch.Tensor] | None = None
        self.matrix: dict[str, dict[str, float]] = {}

    @property
    def warmup(self) -> int:
        return self.options.warmup_rounds

    def admit(self, node: str) -> None:
        if self.w0 is None:  # warm-up: everyone in one FedAvg group
            super().admit(node)

    async def before_round(self, rnd: int, live: list[str]) -> None:
        if self.w0 is None and rnd >= self.warmup and live:
            await self._influence_phase(rnd, live)
        new = [n for n in live if n not in self.groups]
        if self.w0 is not None and new:
            await self._place_late(new)
        await super().before_round(rnd, live)

    async def _influence_phase(self, rnd: int, live: list[str]) -> None:
        self.models.setdefault(0, dict(self.ctx.initial))
        w0 = self.models[0]
        replies = await self.ctx.ask(live, {n: Task("compute", [w0]) for n in live})
        for n, u in replies.items():
            if isinstance(u, Update) and (u.state is None or u.extra):
                log.warning("pfedlia-central: %s answered with %d models, not its partial model; left out", n,
                            len(u.extra) + (u.state is not None))
        self.partials = {n: u.state for n, u in replies.items()
                         if isinstance(u, Update) and u.state is not None and not u.extra}
        names = sorted(self.partials)
        score_task = Task("note", [w0, *(self.partials[n] for n in names)], names=names)
        scores = await self.ctx.ask(names, {n: score_task for n in names}, timeout=self.options.lia_timeout)
        rows = {n: s for n, s in scores.items() if isinstance(s, dict)}
        scorers = sorted(rows)
        if len(scorers) < 2:
            raise RuntimeError(f"pfedlia-central: only {len(scorers)} nodes returned influence scores")
        matrix = np.array([[rows[i].get(j, 0.0) for j in names] for i in scorers])
        paper = self.options.optics == "paper"
        labels = optics_clusters(matrix, self.options.optics_min_samples, self.options.optics_xi,
                                 standardise=not paper)
        self.w0, self.matrix = w0, rows
        self.groups = {n: int(lab) for n, lab in zip(scorers, labels, strict=True)}
        found = sorted({g for g in self.groups.values() if g >= 0})
        self.models = {g: dict(w0) for g in found}
        for n, g in list(self.groups.items()):
            mates = [rows[n][m] for m, gm in self.groups.items() if gm == g and m != n and m in rows[n]]
            if not paper and g >= 0 and (not mates or sum(mates) <= 0):
                self.groups[n] = -1  # its own scores disown its OPTICS cluster
        noise = sorted(n for n, g in self.groups.items() if g < 0)
        for n in noise:
            if paper:
                self._alone(n)
            else:
                self._place(n, rows[n])
        log.info("pfedlia-central: round %d: OPTICS found %d clusters in %d nodes; %d nodes placed by their "
                 "own scores; %d clusters in all", rnd, len(found), len(scorers), len(noise),
                 len(set(self.groups.values())))

    def _alone(self, node: str) -> None:
        """node in a cluster of its own, from w0."""
        g = max([*self.models, -1]) + 1
        self.models[g] = dict(self.w0 or self.ctx.initial)
        self.groups[node] = g

    def _place(self, node: str, row: dict[str, float]) -> None:
        g = best_cluster(row, {n: g for n, g in self.groups.items() if n != node and g >= 0})
        if g is None:
            self._alone(node)
        else:
            self.groups[node] = g
        for empty in set(self.models) - set(self.groups.values()):
            del self.models[empty]  # an OPTICS cluster all of whose members left it

    async def _place_late(self, nodes: list[str]) -> None:
        names = sorted(self.partials)
        task = Task("note", [self.w0 or self.ctx.initial, *(self.partials[n] for n in names)], names=names)
        scores = await self.ctx.ask(nodes, {n: task for n in nodes}, timeout=self.options.lia_timeout)
        for node, row in scores.items():
            if isinstance(row, dict):
                self.matrix[node] = row
                self._place(node, row)
                log.info("pfedlia-central: late node %s placed in cluster %d", node, self.groups[node])

    def knows(self, node: str) -> bool:
        return node in self.groups

    def state(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        data, models = super().state()
        extra = keyed("partial", self.partials)
        if self.w0 is not None:
            extra["w0"] = self.w0
        return {**data, "matrix": self.matrix}, {**models, **extra}

    def restore(self, data: dict[str, Any], models: dict[str, dict[str, torch.Tensor]]) -> None:
        super().restore(data, models)
        self.matrix = data.get("matrix", {})
        self.partials = unkeyed("partial", models)
        self.w0 = models.get("w0")


class PFedLIACentralPaperServer(PFedLIACentralServer):
    """pFedLIA-central with the paper's clustering rule (OPTICS on the raw matrix, noise points alone): run
    beside pfedlia-central, it shows what the paper's method does and what our rules add."""

    name = "pfedlia-central-paper"
    options_type = PaperCentralOptions
