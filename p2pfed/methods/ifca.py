"""IFCA (Ghosh et al., 2020), model-averaging form: K cluster models; each participant takes the one with
the lowest loss on its own training data, trains it, and each cluster model becomes the sample-weighted
mean of the models trained from it.

Choices: K is given (``[methods.ifca] k``, default the scenario's number of clusters), as for FeSEM. The K models
start from different random initialisations (seeds seed+1 .. seed+K), as in IFCA's experiments; with one
shared start every node would take the same model and the clusters could never separate. A node is
evaluated with the cluster model that fits its training data best (IFCA's inference rule), so every
evaluation sends it all K models.
"""

from __future__ import annotations

from p2pfed.methods.central import ServerMethod, Task
from p2pfed.methods.options import ClusteredOptions


class IFCAServer(ServerMethod):
    """K models; every node chooses by loss each time it trains."""

    name = "ifca"
    options_type = ClusteredOptions
    options: ClusteredOptions

    def admit(self, node: str) -> None:
        if not self.models:
            k = int(self.options.k or self.ctx.clusters_hint)
            self.models = {g: self.ctx.build(self.ctx.seed + 1 + g) for g in range(k)}

    def train_task(self, rnd: int, node: str) -> Task:
        groups = sorted(self.models)
        return Task("train", [self.models[g] for g in groups], groups=groups)  # the node chooses anew

    def eval_task(self, node: str) -> Task:
        groups = sorted(self.models)
        return Task("eval", [self.models[g] for g in groups], groups=groups)
