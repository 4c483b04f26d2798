"""Train and evaluate a model on tensors; runs in worker threads, never on the event loop."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from p2pfed.learn.tasks import CLASSIFICATION, LearningTask


def round_seed(seed: int, index: int, rnd: int) -> int:
    """The seed of node index's local work in round rnd of a scenario seeded seed: the same on a rerun, on any
    machine, and different for every node and round."""
    return seed * 100003 + index * 1009 + rnd


def pick_device(requested: str = "auto") -> torch.device:
    """CUDA when available (or asked for), else CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} asked for, but CUDA is not available on this machine")
    return torch.device(requested)


def describe_device(device: torch.device) -> str:
    """What a run's records and benchmarks name the device by: "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)"."""
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


@dataclass
class Evaluation:
    """Loss, accuracy and macro-F1 of a model on one labelled set."""

    loss: float
    accuracy: float
    macro_f1: float
    samples: int


def _epochs(n: int, epochs: int, batch_size: int, seed: int, device: torch.device
            ) -> Iterator[list[torch.Tensor]]:
    """Per epoch, the shuffled mini-batch indices of n samples (seeded: the same on every rerun)."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen).to(device)
        yield [perm[start:start + batch_size] for start in range(0, n, batch_size)]


def epochs_for(steps: int, n: int, batch_size: int) -> int:
    """The shuffled epochs that steps mini-batch steps over n samples reach into (local steps τ)."""
    return -(-steps // -(-n // batch_size))


def train_epochs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                 lr: float, seed: int, device: torch.device, momentum: float = 0.0,
                 weight_decay: float = 0.0, penalty: Callable[[nn.Module], torch.Tensor] | None = None,
                 loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 task: LearningTask = CLASSIFICATION, steps: int = 0) -> float:
    """SGD over (x, y) for some epochs in shuffled mini-batches; return the last epoch's mean loss. With
    steps > 0, exactly that many mini-batch steps instead (local steps τ, as Li et al. 2022 and Ma et al. 2023
    count local work), through as many shuffled epochs as they take; the loss is then the mean over the last
    epoch's steps.

    penalty, if given, is added to every mini-batch's loss (FedProx's proximal term, FeSEM's distance to
    the cluster center); the returned loss is the data loss alone. loss_fn(model, x, y), if given,
    replaces the task's loss (FedProto adds its prototype term there).
    """
    if len(y) == 0 or epochs <= 0:
        return float("nan")
    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    x, y = x.to(device), y.to(device)
    if steps > 0:
        epochs = epochs_for(steps, len(y), batch_size)
    last, done = 0.0, 0
    for batches in _epochs(len(y), epochs, batch_size, seed, device):
        total, seen = 0.0, 0
        for idx in batches[: steps - done] if steps > 0 else batches:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model, x[idx], y[idx]) if loss_fn else task.loss(model(x[idx]), y[idx])
            (loss + penalty(model) if penalty is not None else loss).backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
            done += 1
        last = total / seen if seen else last
    return last


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
             batch_size: int = 1024, task: LearningTask = CLASSIFICATION) -> Evaluation:
    """The task's mean loss (per target: per sample, or per token of a sequence) and metrics (for
    classification: cross-entropy, accuracy and macro-F1 over the labels present) of model on (x, y)."""
    if len(y) == 0:
        return Evaluation(float("nan"), float("nan"), float("nan"), 0)
    model.to(device).eval()
    losses, preds = [], []
    for start in range(0, len(y), batch_size):
        logits = model(x[start:start + batch_size].to(device))
        losses.append(task.loss(logits, y[start:start + batch_size].to(device), reduction="sum"))
        preds.append(task.predict(logits).cpu())
    accuracy, macro_f1 = task.metrics(torch.cat(preds).numpy(), y.numpy())
    return Evaluation(loss=float(torch.stack(losses).sum()) / max(1, task.count(y)), accuracy=accuracy,
                      macro_f1=macro_f1, samples=len(y))


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU snapshot of the model's state (safe to send while the model keeps training)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def train_copy(model: nn.Module, start: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, *,
               epochs: int, batch_size: int, lr: float, seed: int, device: torch.device,
               task: LearningTask = CLASSIFICATION) -> dict[str, torch.Tensor]:
    """A copy of model with the weights start, trained for a few epochs on (x, y); model itself is left as it
    is (pFedLIA's partial model: w0 trained on one batch of a node's data)."""
    local = copy.deepcopy(model)
    local.load_state_dict(start)
    train_epochs(local, x, y, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, device=device, task=task)
    return state_of(local)


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """FedAvg: the weighted mean of states (integer buffers such as BatchNorm counters take the first's)."""
    total = float(sum(weights))
    if not states or total <= 0:
        raise ValueError("nothing to average")
    out = {}
    for name, ref in states[0].items():
        if ref.is_floating_point():
            acc = torch.zeros_like(ref, dtype=torch.float32)
            for s, w in zip(states, weights, strict=True):
                acc += s[name].to(torch.float32) * (w / total)
            out[name] = acc.to(ref.dtype)
        else:
            out[name] = ref.clone()
    return out


def distance_penalty(anchor: dict[str, torch.Tensor], coef: float, device: torch.device
                     ) -> Callable[[nn.Module], torch.Tensor]:
    """coef/2 · ||w − anchor||² over the model's parameters (FedProx's proximal term with coef = μ)."""
    fixed = {k: v.detach().to(device) for k, v in anchor.items()}

    def term(model: nn.Module) -> torch.Tensor:
        total = torch.zeros((), device=device)
        for name, p in model.named_parameters():
            total = total + ((p - fixed[name]) ** 2).sum()
        return 0.5 * coef * total

    return term


def maml_first_order(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                     inner_lr: float, outer_lr: float, seed: int, device: torch.device,
                     task: LearningTask = CLASSIFICATION, independent: bool = False, steps: int = 0,
                     momentum: float = 0.0) -> float:
    """First-order MAML local update (Li et al. 2022, Algorithm 2, Eq. 15–16): for each mini-batch D,
    ŵ = w − η∇l(w; D), then w ← w − ε∇l(ŵ; D'), where D' is D, or with independent the next mini-batch of
    the epoch (Per-FedAvg's independent batches; the first one after the last; with one batch, D itself).
    With steps > 0, exactly that many such steps (the τ of Li et al. 2022) through as many shuffled epochs
    as they take, as train_epochs counts them. With momentum μ, the outer step is SGD's with momentum
    (v ← μ·v + ∇l(ŵ; D'), w ← w − ε·v; Li et al. 2022 train "all algorithms" with momentum 0.9, and the
    inner step η, the adaptation a personalisation repeats, stays a plain gradient step). Return the last
    epoch's mean loss at ŵ."""
    if len(y) == 0 or epochs <= 0:
        return float("nan")
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    velocity = [torch.zeros_like(p) for p in params] if momentum else []
    x, y = x.to(device), y.to(device)
    if steps > 0:
        epochs = epochs_for(steps, len(y), batch_size)
    last, done = 0.0, 0
    for batches in _epochs(len(y), epochs, batch_size, seed, device):
        total, seen = 0.0, 0
        for i, idx in enumerate(batches[: steps - done] if steps > 0 else batches):
            before = [p.detach().clone() for p in params]
            grads = torch.autograd.grad(task.loss(model(x[idx]), y[idx]), params)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    p.sub_(inner_lr * g)  # ŵ, Eq. 15
            outer = batches[(i + 1) % len(batches)] if independent else idx
            loss = task.loss(model(x[outer]), y[outer])
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for j, (p, w, g) in enumerate(zip(params, before, grads, strict=True)):
                    if momentum:
                        velocity[j].mul_(momentum).add_(g)
                        g = velocity[j]
                    p.copy_(w - outer_lr * g)  # Eq. 16: the step is taken from w with ŵ's gradient
            total += float(loss.detach()) * len(outer)
            seen += len(outer)
            done += 1
        last = total / seen if seen else last
    return last


def personalise(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float, batch_size: int,
                seed: int, device: torch.device, task: LearningTask = CLASSIFICATION) -> None:
    """steps gradient steps (one_step), each on its own random mini-batch (seeds seed, seed + 1, ...): a model
    learned as a starting point (first-order MAML) made a node's own."""
    for step in range(steps):
        one_step(model, x, y, lr=lr, batch_size=batch_size, seed=seed + step, device=device, task=task)


def one_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float, batch_size: int, seed: int,
             device: torch.device, task: LearningTask = CLASSIFICATION) -> None:
    """One gradient step on one random mini-batch (FedDSMIC's personalisation from a center model)."""
    if len(y) == 0:
        return
    model.to(device).train()
    idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:batch_size]
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(task.loss(model(x[idx].to(device)), y[idx].to(device)), params)
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.sub_(lr * g)
