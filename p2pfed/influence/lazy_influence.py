"""Lazy Influence Approximation (Rokvic et al. 2025, §III-D): a node trains a copy of w0 for a few epochs on a
batch of its training data (the partial model: learn.train.train_copy), and scores a peer's partial model on
its own validation split:

    influence_j = loss(w0) − loss(partial_j)        (eq. 1; positive: peer j's data helps me)

Scoring many peers is the hot loop. On CUDA the peers' parameters are stacked and evaluated in one vmapped
functional call (torch.func); on a CPU one model at a time (a small CNN is bound by arithmetic there, and
stacking saves only per-call overhead: slower for the Fashion-MNIST CNN, about even on digits, in
docs/performance.md). Both give the same scores.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from p2pfed.learn.tasks import CLASSIFICATION, LearningTask


@torch.no_grad()
def validation_loss(model: nn.Module, state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                    device: torch.device, task: LearningTask = CLASSIFICATION) -> float:
    """The task's mean loss of model with state on (x, y)."""
    model = model.to(device).eval()
    out = functional_call(model, {k: v.to(device) for k, v in state.items()}, (x.to(device),))
    return float(task.loss(out, y.to(device)))


@torch.no_grad()
def activation_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the intermediate outputs of one forward pass over x (what a vmapped model adds per copy)."""
    total = 0

    def hook(_m: nn.Module, _i: object, out: object) -> None:
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel() * out.element_size()

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return total


@torch.no_grad()
def score_peers(model: nn.Module, w0: dict[str, torch.Tensor], partials: list[dict[str, torch.Tensor]],
                x_val: torch.Tensor, y_val: torch.Tensor, device: torch.device, chunk: int | None = None,
                memory_budget: int = 256 << 20, batched: bool | None = None,
                task: LearningTask = CLASSIFICATION) -> list[float]:
    """Lazy influence of each partial model on (x_val, y_val), batched over models with vmap.

    Models are scored chunk at a time; by default the chunk is as large as memory_budget allows for the
    activations of the stacked models (a vmapped forward holds every model's activations at once), at
    most 16. batched=None batches on CUDA only: on this project's 2-core CPU, benchmarks/lia.py measured
    the vmapped small CNN at 0.2–1.4x of one model at a time (the work is FLOP-bound there), so the CPU
    takes the loop, which gives the same scores.
    """
    if not partials:
        return []
    if batched is None:
        batched = device.type == "cuda"
    if not batched:
        return score_peers_one_by_one(model, w0, partials, x_val, y_val, device, task)
    model = model.to(device).eval()
    x, y = x_val.to(device), y_val.to(device)
    base = validation_loss(model, w0, x, y, device, task)

    def loss_of(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return task.loss(functional_call(model, params, (x,)), y)

    losses = stacked(model, partials, x, loss_of, chunk, memory_budget).tolist()
    return [base - loss for loss in losses]


def stacked(model: nn.Module, states: list[dict[str, torch.Tensor]], x: torch.Tensor,
            loss_of: Callable[[dict[str, torch.Tensor]], torch.Tensor], chunk: int | None, memory_budget: int
            ) -> torch.Tensor:
    """loss_of of every state, vmapped over the states stacked chunk at a time (x already on the device):
    by default the chunk is as large as memory_budget allows for the activations of the stacked models, at
    most 16. One row per state."""
    if chunk is None:
        per_model = activation_bytes(model, x) + sum(t.numel() * t.element_size() for t in states[0].values())
        chunk = max(1, min(len(states), 16, memory_budget // max(1, per_model)))
    batched_loss = vmap(loss_of)
    rows = []
    for start in range(0, len(states), chunk):
        group = states[start:start + chunk]
        rows.append(batched_loss({k: stack_on(x.device, [p[k] for p in group]) for k in group[0]}))
    return torch.cat(rows)


def stack_on(device: torch.device, tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors stacked, on device: stacked where they lie and copied once when they lie together (host
    snapshots, as received models are), else each moved first (torch.stack refuses tensors of two devices)."""
    if any(t.device != tensors[0].device for t in tensors):
        tensors = [t.to(device) for t in tensors]
    return torch.stack(tensors).to(device)


@torch.no_grad()
def sample_losses(model: nn.Module, states: list[dict[str, torch.Tensor]], x: torch.Tensor, y: torch.Tensor,
                  device: torch.device, task: LearningTask = CLASSIFICATION, batched: bool | None = None,
                  chunk: int | None = None, memory_budget: int = 256 << 20) -> np.ndarray:
    """The task's loss of each state (on model's architecture) for each scored unit of (x, y): a (states,
    units) array; a unit is a sample (a token of a sequence for next-token prediction). Batched as
    score_peers is (on CUDA by default), with the same results."""
    return sample_losses_and_errors(model, states, x, y, device, task, batched, chunk, memory_budget)[0]


@torch.no_grad()
def sample_losses_and_errors(model: nn.Module, states: list[dict[str, torch.Tensor]], x: torch.Tensor,
                             y: torch.Tensor, device: torch.device, task: LearningTask = CLASSIFICATION,
                             batched: bool | None = None, chunk: int | None = None, memory_budget: int = 256 << 20
                             ) -> tuple[np.ndarray, np.ndarray]:
    """sample_losses, and from the same forward passes whether each state's prediction of each unit is wrong
    (1.0) or right (0.0): two (states, units) arrays."""
    if not states:
        return np.zeros((0, 0)), np.zeros((0, 0))
    if batched is None:
        batched = device.type == "cuda"
    model = model.to(device).eval()
    x, y = x.to(device), y.to(device)

    def both(output: torch.Tensor) -> torch.Tensor:
        wrong = (task.predict(output).reshape(-1) != y.reshape(-1)).to(output.dtype)
        return torch.stack([task.loss(output, y, reduction="none").reshape(-1), wrong])

    if batched:
        rows = stacked(model, states, x, lambda params: both(functional_call(model, params, (x,))), chunk,
                       memory_budget)
    else:
        rows = torch.stack([both(functional_call(model, {k: v.to(device) for k, v in s.items()}, (x,)))
                            for s in states])
    values = rows[:, :, task.scored(y)].double().cpu().numpy()
    return values[:, 0], values[:, 1]


@torch.no_grad()
def score_peers_one_by_one(model: nn.Module, w0: dict[str, torch.Tensor],
                           partials: list[dict[str, torch.Tensor]], x_val: torch.Tensor, y_val: torch.Tensor,
                           device: torch.device, task: LearningTask = CLASSIFICATION) -> list[float]:
    """The same scores, one model at a time (the reference the benchmark compares against)."""
    base = validation_loss(model, w0, x_val, y_val, device, task)
    local = copy.deepcopy(model).to(device).eval()
    scores = []
    for p in partials:
        local.load_state_dict(p)
        scores.append(base - float(task.loss(local(x_val.to(device)), y_val.to(device))))
    return scores
