"""FedProx + FM (Ye et al. 2023, Fig. 8a): feature matching as a plug-in on FedProx. FedFM's rounds (fedfm.py: the
anchor exchange, then training with task loss + λ·matching loss) whose local objective also has FedProx's
proximal term μ/2·||w − w_global||², w_global the global model the node trains from (sent with the task, or
kept from the round's anchor step). The paper's Fig. 8a reports it against FedProx alone; it says no more.

Choices where the paper is silent: μ acts in every round, before T_s too, where the method is FedProx (FedFM
is FedAvg there: the base method runs throughout, FM joins at T_s). The options are FedFM's and FedProx's μ
(its default), in the method's own table ``[methods.fedprox-fm]``, as fedfm-l2 has its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pfed.methods.fedfm import FedFMOptions, FedFMServer
from p2pfed.methods.fedprox import FedProxOptions, ProxTasks


@dataclass(frozen=True)
class FedProxFMOptions(FedFMOptions, FedProxOptions):
    """FedProx + FM's options, the scenario's [methods.fedprox-fm] table: FedFM's and FedProx's μ."""


    def validate(self, where: str) -> None:
        FedFMOptions.validate(self, where)
        FedProxOptions.validate(self, where)


class FedProxFMServer(ProxTasks, FedFMServer):
    """FedFM's rounds with FedProx's train tasks: every one carries μ (FedFM's node side adds the term)."""

    name = "fedprox-fm"
    options_type = FedProxFMOptions
    options: FedProxFMOptions
