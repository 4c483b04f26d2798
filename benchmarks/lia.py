"""Lazy influence benchmarks (pFedLIA's hot loop), each figure a ratio of two paths timed in the same run.

(a) Scoring N peer partial models on one validation split: batched over stacked parameters with
    torch.func.vmap (what the nodes do) against one model at a time. Target: at least 4x on CPU.
    Also one at a time with torch's own max_pool2d in place of MaxPool2 (learn/models.py): what its fast path
    saves.
(b) Lazy influence against exact influence for the same batch of 100 points (Rokvic et al. 2025, §III-E): exact
    retrains a model from scratch on the initial data plus the batch until the training loss falls below a
    threshold, then evaluates; lazy trains w0 for a few epochs on the batch only, then evaluates.
    The paper reports 40–500x.

Run: python benchmarks/lia.py [--dataset fmnist|digits] [--device cpu|cuda|auto] [--peers 99] [--repeat 5] [--threads N]
[--json FILE]. On CUDA the partial models start in host memory, as received models do, so (a) includes copying
them to the GPU; every figure ends in a value read back to the host, so the timings wait for the GPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from p2pfed.influence.lazy_influence import score_peers, score_peers_one_by_one, validation_loss
from p2pfed.learn.datasets import load_dataset
from p2pfed.learn.models import MaxPool2, build_model
from p2pfed.learn.train import describe_device, pick_device, state_of, train_copy, train_epochs


def timed(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_scoring(dataset: str, peers: int, val: int, repeat: int, device: torch.device) -> dict[str, Any]:
    d = load_dataset(dataset)
    model = build_model("cnn", d.input_shape, d.num_classes, seed=0)
    w0 = state_of(model)
    gen = torch.Generator().manual_seed(0)
    partials = [{k: v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                 for k, v in w0.items()} for _ in range(peers)]
    x_val, y_val = d.x_test[:val], d.y_test[:val]
    # the first calls also warm up (CUDA's context and kernels), outside the timings
    a = score_peers(model, w0, partials, x_val, y_val, device, batched=True)
    b = score_peers_one_by_one(model, w0, partials, x_val, y_val, device)
    assert max(abs(p - q) for p, q in zip(a, b, strict=True)) < 1e-3
    # the same model with torch's own max_pool2d for MaxPool2's fast path (the same scores, as a test checks)
    pooled = copy.deepcopy(model)
    for i, layer in enumerate(pooled.features):
        if isinstance(layer, MaxPool2):
            pooled.features[i] = torch.nn.MaxPool2d(2)
    assert score_peers_one_by_one(pooled, w0, partials, x_val, y_val, device) == b  # the very same scores
    timings: dict[str, list[float]] = {"batched": [], "looped": [], "max_pool2d": []}
    for _ in range(repeat):  # interleaved: the machine's noise falls on each path alike
        timings["batched"].append(timed(lambda: score_peers(model, w0, partials, x_val, y_val, device,
                                                            batched=True), 1))
        timings["looped"].append(timed(lambda: score_peers_one_by_one(model, w0, partials, x_val, y_val, device), 1))
        timings["max_pool2d"].append(timed(lambda: score_peers_one_by_one(pooled, w0, partials, x_val, y_val,
                                                                          device), 1))
    batched, looped, with_max_pool2d = (statistics.median(timings[k]) for k in ("batched", "looped", "max_pool2d"))
    print(f"(a) scoring {peers} partial models ({dataset}, small CNN, {val} validation samples, "
          f"{describe_device(device)}, {torch.get_num_threads()} threads)")
    print(f"    one at a time  {1e3 * looped:8.1f} ms")
    print(f"    batched (vmap) {1e3 * batched:8.1f} ms   speed-up {looped / batched:.1f}x")
    print(f"    one at a time, torch's max_pool2d {1e3 * with_max_pool2d:8.1f} ms   MaxPool2's speed-up "
          f"{with_max_pool2d / looped:.1f}x")
    return {"dataset": dataset, "device": describe_device(device), "peers": peers, "validation_samples": val,
            "threads": torch.get_num_threads(),
            "one_at_a_time_s": looped, "batched_s": batched, "speed_up": looped / batched,
            "one_at_a_time_max_pool2d_s": with_max_pool2d, "pool_speed_up": with_max_pool2d / looped}


def bench_lazy_vs_exact(dataset: str, repeat: int, threshold: float, lazy_epochs: int, device: torch.device
                        ) -> dict[str, Any]:
    d = load_dataset(dataset)
    n_init = min(9900, len(d.y_train) - 100)
    x_init, y_init = d.x_train[:n_init], d.y_train[:n_init]
    x_batch, y_batch = d.x_train[n_init:n_init + 100], d.y_train[n_init:n_init + 100]
    x_test, y_test = d.x_test[:100], d.y_test[:100]  # an IID test set of 100 points, as in the paper
    model = build_model("cnn", d.input_shape, d.num_classes, seed=0).to(device)
    train_epochs(model, x_init, y_init, epochs=3, batch_size=64, lr=0.05, seed=0, device=device)  # w0 = model_D
    w0 = state_of(model)

    def exact() -> float:
        fresh = build_model("cnn", d.input_shape, d.num_classes, seed=1).to(device)
        x = torch.cat([x_init, x_batch])
        y = torch.cat([y_init, y_batch])
        for epoch in range(200):  # retrain to the convergence threshold (capped)
            loss = train_epochs(fresh, x, y, epochs=1, batch_size=64, lr=0.05, seed=epoch, device=device)
            if loss < threshold:
                break
        with torch.no_grad():
            return validation_loss(model, w0, x_test, y_test, device) - float(
                F.cross_entropy(fresh(x_test.to(device)), y_test.to(device)))

    def lazy() -> float:
        p = train_copy(copy.deepcopy(model), w0, x_batch, y_batch, epochs=lazy_epochs, batch_size=32, lr=0.05,
                       seed=0, device=device)
        return validation_loss(model, w0, x_test, y_test, device) - validation_loss(model, p, x_test, y_test, device)

    t_exact = timed(exact, max(1, repeat // 2))
    t_lazy = timed(lazy, repeat)
    print(f"(b) influence of a 100-point batch on {n_init} initial points ({dataset}, small CNN, "
          f"{describe_device(device)})")
    print(f"    exact (retrain to loss < {threshold}) {t_exact:8.2f} s")
    print(f"    lazy ({lazy_epochs} epochs on the batch)   {t_lazy:8.3f} s   speed-up {t_exact / t_lazy:.0f}x")
    return {"dataset": dataset, "device": describe_device(device), "initial_points": n_init, "threshold": threshold,
            "lazy_epochs": lazy_epochs,
            "exact_s": t_exact, "lazy_s": t_lazy, "speed_up": t_exact / t_lazy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--peers", type=int, default=99)
    parser.add_argument("--val", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threshold", type=float, default=0.3)
    parser.add_argument("--lazy-epochs", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="cpu (the default), cuda, cuda:N or auto (the GPU if any)")
    parser.add_argument("--only", choices=["a", "b"])
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's own; a node process uses 1)")
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    args = parser.parse_args()
    try:
        device = pick_device(args.device)
    except (ValueError, RuntimeError) as e:  # CUDA asked for on a machine without it, or a malformed name
        parser.error(str(e))
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1 (got {args.threads})")
        torch.set_num_threads(args.threads)
    figures: dict[str, Any] = {"repeat": args.repeat}
    if args.only != "b":
        figures["scoring"] = bench_scoring(args.dataset, args.peers, args.val, args.repeat, device)
    if args.only != "a":
        figures["lazy_vs_exact"] = bench_lazy_vs_exact(args.dataset, args.repeat, args.threshold, args.lazy_epochs,
                                                      device)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
