"""CAM (Ma et al. 2023): the additive model, the server's Eq. 6 and Eq. 9, FeSEM-CAM's warm-up, and both
methods end to end over real sockets."""

from __future__ import annotations

import asyncio

import torch
from torch import nn

from p2pfed.methods.cam import Additive, FeSEMCAMOptions, FeSEMCAMServer, IFCACAMOptions, IFCACAMServer
from p2pfed.methods.central import Task, Update
from tests.methods.fake import FakeCoordinator, vec


def test_the_additive_model_sums_the_logits_of_its_parts() -> None:
    h, f = nn.Linear(3, 2), nn.Linear(3, 2)
    x = torch.randn(4, 3)
    assert torch.allclose(Additive(h, f)(x), h(x) + f(x))


def test_ifca_cam_warms_up_with_fedavg_then_updates_clusters_by_eq6_and_the_global_model_by_eq9() -> None:
    ctx = FakeCoordinator(lambda n, t: None)
    method = IFCACAMServer(ctx, IFCACAMOptions(k=2, warmup=1))
    asyncio.run(method.before_round(0, ["a", "b"]))
    task = method.train_task(0, "a")
    assert task.shared == 0 and len(task.models) == 1  # warm-up: plain FedAvg of the global model
    method.aggregate(0, {"a": Update(vec(1, 1, 1, 1), 10), "b": Update(vec(3, 3, 3, 3), 30)})
    assert torch.allclose(method.global_model["w"], torch.full((4,), 2.5))
    asyncio.run(method.before_round(1, ["a", "b"]))
    task = method.train_task(1, "a")
    assert task.shared == 1 and len(task.models) == 3 and task.groups == [0, 1]
    k0 = method.models[0]["w"].clone()
    method.place("a", 0)
    method.place("b", 1)
    method.aggregate(1, {"a": Update(vec(1, 0, 0, 0), 10, extra=[vec(0, 0, 0, 4)]),
                         "b": Update(vec(0, 1, 0, 0), 30, extra=[vec(0, 0, 0, 8)])})
    # Eq. 6 for cluster 0: (1 − 10/40)·Θ_0 + 10/40·θ_a
    assert torch.allclose(method.models[0]["w"], 0.75 * k0 + 0.25 * torch.tensor([1.0, 0, 0, 0]))
    assert torch.allclose(method.global_model["w"], torch.tensor([0, 0, 0, 7.0]))  # Eq. 9: (10·4 + 30·8) / 40
    assert method.clusters() == {"a": 0, "b": 1}


def test_fesem_cam_warm_up_trains_local_epochs_and_clusters_them() -> None:
    firsts = {"a": vec(1, 1, 0, 0), "b": vec(1.1, 0.9, 0, 0), "c": vec(-1, -1, 0, 0), "d": vec(-0.9, -1, 0, 0)}
    seen: list[Task] = []

    def answer(node: str, task: Task) -> Update:
        seen.append(task)
        return Update(firsts[node], 10)

    method = FeSEMCAMServer(FakeCoordinator(answer), FeSEMCAMOptions(k=2, warmup=3, penalty=0.2))
    asyncio.run(method.before_round(0, sorted(firsts)))
    assert all(t.instructions.epochs == 3 for t in seen)
    groups = method.clusters()
    assert groups["a"] == groups["b"] != groups["c"] == groups["d"]
    task = method.train_task(0, "a")
    assert task.shared == 1 and task.groups == [groups["a"]] and task.instructions.penalty == 0.2


def test_fesem_cam_measures_distances_on_the_fully_connected_layers_only() -> None:
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2, 2))
    base = {k: torch.zeros_like(v) for k, v in net.state_dict().items()}

    def model(conv: float, fc: float) -> dict[str, torch.Tensor]:
        return {k: torch.full_like(v, conv if k.startswith("0.") else fc) for k, v in base.items()}

    # a and b share their head but not their conv layer; c and d likewise: the heads decide.
    firsts = {"a": model(50, 1), "b": model(-50, 1.1), "c": model(50, -1), "d": model(-50, -1.1)}
    ctx = FakeCoordinator(lambda n, t: Update(firsts[n], 10))
    ctx.initial = base
    ctx.module = lambda state: net  # type: ignore[method-assign]
    method = FeSEMCAMServer(ctx, FeSEMCAMOptions(k=2, warmup=1))
    assert method.fc_keys == ["2.weight", "2.bias"]
    asyncio.run(method.before_round(0, sorted(firsts)))
    groups = method.clusters()
    assert groups["a"] == groups["b"] != groups["c"] == groups["d"]
