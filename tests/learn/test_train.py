"""Local training and FedAvg: seeded training, the distance penalty (FedProx's μ, FeSEM's λ), sample weights;
first-order MAML and one-step personalisation (FedDSMIC, Li et al. 2022); the device."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from p2pfed.learn.train import (
    describe_device,
    distance_penalty,
    evaluate,
    maml_first_order,
    one_step,
    pick_device,
    round_seed,
    state_of,
    train_epochs,
    weighted_average,
)

CPU = torch.device("cpu")


def test_a_larger_penalty_keeps_the_trained_model_closer_to_its_start() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 5, generator=gen), torch.randint(0, 3, (64,), generator=gen)
    distances = []
    for coef in (0.0, 0.5, 5.0):  # lr·coef < 2, or the penalty itself diverges
        torch.manual_seed(0)
        model = nn.Linear(5, 3)
        start = state_of(model)
        penalty = distance_penalty(start, coef, torch.device("cpu")) if coef else None
        train_epochs(model, x, y, epochs=5, batch_size=16, lr=0.1, seed=1, device=torch.device("cpu"),
                     penalty=penalty)
        end = state_of(model)
        distances.append(sum(float((end[k] - start[k]).norm() ** 2) for k in start))
    assert distances[0] > distances[1] > distances[2] > 0
    model = nn.Linear(5, 3)
    anchor = {k: v + 1.0 for k, v in state_of(model).items()}
    assert float(distance_penalty(anchor, 2.0, torch.device("cpu"))(model).detach()) == 18.0  # 2/2 · (15 + 3) · 1²


def test_fedavg_weights_each_model_by_its_sample_count() -> None:
    states = [{"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(3)},
              {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(5)}]
    avg = weighted_average(states, [10.0, 30.0])
    assert torch.allclose(avg["w"], torch.tensor([3.25, 6.0]))  # (10·1 + 30·4) / 40, (30·8) / 40
    assert avg["n"].item() == 3 and avg["n"].dtype == torch.int64  # integer buffers: the first model's
    half = {"w": torch.tensor([1.0, 2.0], dtype=torch.float16)}
    assert weighted_average([half, half], [1.0, 3.0])["w"].dtype == torch.float16
    for bad in ([], [0.0, 0.0]):
        with pytest.raises(ValueError, match="nothing to average"):
            weighted_average(states if bad else [], bad)


def test_training_is_seeded_and_the_loss_is_the_last_epochs_mean() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 5, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(0)
        model = nn.Linear(5, 3)
        loss = train_epochs(model, x, y, epochs=3, batch_size=8, lr=0.1, seed=seed, device=torch.device("cpu"))
        runs.append((loss, state_of(model)["weight"]))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])  # the same seed, the same model
    assert not torch.equal(runs[0][1], runs[2][1])  # another shuffle, another model
    ev = evaluate(model, x, y, torch.device("cpu"))
    assert ev.samples == 40 and 0 <= ev.accuracy <= 1 and math.isclose(
        ev.loss, float(torch.nn.functional.cross_entropy(model(x), y).detach()), rel_tol=1e-5)
    assert math.isnan(train_epochs(model, x[:0], y[:0], epochs=1, batch_size=8, lr=0.1, seed=0,
                                   device=torch.device("cpu")))


def data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def linear(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(5, 3)


def gradient(w: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> tuple[dict[str, torch.Tensor], float]:
    """∇l(w; (x, y)) of a Linear(5, 3) with weights w under cross-entropy, and l itself."""
    params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    loss = F.cross_entropy(x @ params["weight"].T + params["bias"], y)
    grads = torch.autograd.grad(loss, list(params.values()))
    return dict(zip(params, grads, strict=True)), float(loss.detach())


def test_momentum_and_weight_decay_reach_the_optimiser_and_zero_epochs_train_nothing() -> None:
    x, y = data(40)
    runs = {}
    for name, momentum, decay in [("plain", 0.0, 0.0), ("momentum", 0.9, 0.0), ("decay", 0.0, 0.5)]:
        model = linear()
        train_epochs(model, x, y, epochs=3, batch_size=8, lr=0.1, seed=1, device=CPU, momentum=momentum,
                     weight_decay=decay)
        runs[name] = state_of(model)["weight"]
    assert not torch.allclose(runs["plain"], runs["momentum"])
    assert float(runs["decay"].norm()) < float(runs["plain"].norm())  # decay pulls the weights toward 0
    model = linear()
    assert math.isnan(train_epochs(model, x, y, epochs=0, batch_size=8, lr=0.1, seed=1, device=CPU))
    assert torch.equal(state_of(model)["weight"], state_of(linear())["weight"])


def test_first_order_maml_steps_from_w_with_the_gradient_at_w_hat() -> None:
    # Li et al. 2022, Eq. 15-16, on one mini-batch D (here all the data): ŵ = w − η∇l(w; D), w ← w − ε∇l(ŵ; D);
    # the loss reported is the last epoch's at ŵ.
    x, y = data(12)
    model = linear()
    w = state_of(model)
    eta, eps = 0.5, 0.1
    for _ in range(2):
        g, _ = gradient(w, x, y)
        w_hat = {k: w[k] - eta * g[k] for k in w}
        g_hat, loss_at_w_hat = gradient(w_hat, x, y)
        w = {k: w[k] - eps * g_hat[k] for k in w}
    loss = maml_first_order(model, x, y, epochs=2, batch_size=16, inner_lr=eta, outer_lr=eps, seed=0, device=CPU)
    assert all(torch.allclose(state_of(model)[k], w[k], atol=1e-6) for k in w)
    assert loss == pytest.approx(loss_at_w_hat, rel=1e-5)


def test_first_order_maml_without_an_inner_step_is_sgd_over_the_same_mini_batches() -> None:
    x, y = data(30)  # 8 + 8 + 8 + 6: the last epoch's loss is a mean weighted by batch size
    sgd, maml = linear(), linear()
    sgd_loss = train_epochs(sgd, x, y, epochs=3, batch_size=8, lr=0.1, seed=4, device=CPU)
    maml_loss = maml_first_order(maml, x, y, epochs=3, batch_size=8, inner_lr=0.0, outer_lr=0.1, seed=4, device=CPU)
    assert all(torch.allclose(state_of(sgd)[k], state_of(maml)[k], atol=1e-6) for k in state_of(sgd))
    assert maml_loss == pytest.approx(sgd_loss, rel=1e-6)


@pytest.mark.parametrize(("steps", "momentum"), [(5, 0.0), (5, 0.9), (0, 0.9), (9, 0.5)])
def test_first_order_maml_counts_local_steps_and_takes_momentum_as_sgd_does(steps: int, momentum: float) -> None:
    """The τ steps of Li et al. 2022 and their momentum 0.9 "for all algorithms": without an inner step, MAML's
    outer steps are the SGD steps train_epochs takes with the same steps (into a second epoch: 4 batches of 8 an
    epoch) and momentum."""
    x, y = data(30)
    sgd, maml = linear(), linear()
    sgd_loss = train_epochs(sgd, x, y, epochs=2, batch_size=8, lr=0.1, seed=4, device=CPU, steps=steps,
                            momentum=momentum)
    maml_loss = maml_first_order(maml, x, y, epochs=2, batch_size=8, inner_lr=0.0, outer_lr=0.1, seed=4, device=CPU,
                                 steps=steps, momentum=momentum)
    assert all(torch.allclose(state_of(sgd)[k], state_of(maml)[k], atol=1e-6) for k in state_of(sgd))
    assert maml_loss == pytest.approx(sgd_loss, rel=1e-6)
    plain = linear()
    maml_first_order(plain, x, y, epochs=2, batch_size=8, inner_lr=0.0, outer_lr=0.1, seed=4, device=CPU, steps=steps)
    assert momentum == 0 or not torch.allclose(state_of(plain)["weight"], state_of(maml)["weight"])


def test_meta_updates_leave_frozen_parameters_and_do_nothing_without_data_or_epochs() -> None:
    x, y = data(12)
    model = linear()
    model.bias.requires_grad_(False)
    start = state_of(model)
    maml_first_order(model, x, y, epochs=1, batch_size=4, inner_lr=0.5, outer_lr=0.1, seed=0, device=CPU)
    one_step(model, x, y, lr=0.1, batch_size=4, seed=0, device=CPU)
    assert torch.equal(model.bias.detach(), start["bias"]) and not torch.equal(model.weight.detach(), start["weight"])
    model = linear()
    for epochs, n in ((1, 0), (0, 12)):
        assert math.isnan(maml_first_order(model, x[:n], y[:n], epochs=epochs, batch_size=4, inner_lr=0.5,
                                           outer_lr=0.1, seed=0, device=CPU))
    one_step(model, x[:0], y[:0], lr=0.1, batch_size=4, seed=0, device=CPU)
    assert all(torch.equal(state_of(model)[k], v) for k, v in state_of(linear()).items())


def test_one_step_is_one_gradient_step_on_one_seeded_mini_batch() -> None:
    # FedDSMIC's personalisation (Li et al. 2022): w − lr·∇l(w; B) for one random mini-batch B of batch_size samples
    x, y = data(6)
    w = state_of(linear())
    steps = []
    for i in range(6):  # every batch of one sample it could draw
        g, _ = gradient(w, x[i:i + 1], y[i:i + 1])
        steps.append({k: w[k] - 0.1 * g[k] for k in w})
    took = []
    for seed in range(4):
        model = linear()
        one_step(model, x, y, lr=0.1, batch_size=1, seed=seed, device=CPU)
        took.append([i for i, s in enumerate(steps) if all(torch.allclose(state_of(model)[k], s[k]) for k in s)])
    assert all(len(t) == 1 for t in took)  # exactly one step on exactly one sample
    assert len({t[0] for t in took}) > 1  # which one depends on the seed ...
    again = linear()
    one_step(again, x, y, lr=0.1, batch_size=1, seed=3, device=CPU)
    assert all(torch.allclose(state_of(again)[k], steps[took[3][0]][k]) for k in w)  # ... and only on it
    whole = linear()
    one_step(whole, x, y, lr=0.1, batch_size=64, seed=0, device=CPU)  # a batch larger than the data: all of it
    g, _ = gradient(w, x, y)
    assert all(torch.allclose(state_of(whole)[k], w[k] - 0.1 * g[k], atol=1e-6) for k in w)


def test_a_single_epoch_or_a_single_sample_is_enough_to_learn_from() -> None:
    x, y = data(1)
    w = state_of(linear())
    g, _ = gradient(w, x, y)
    model = linear()
    one_step(model, x, y, lr=0.1, batch_size=4, seed=0, device=CPU)  # a node with one sample personalises too
    assert all(torch.allclose(state_of(model)[k], w[k] - 0.1 * g[k], atol=1e-6) for k in w)
    for meta in (True, False):
        model = linear()
        loss = (maml_first_order(model, x, y, epochs=1, batch_size=4, inner_lr=0.0, outer_lr=0.1, seed=0, device=CPU)
                if meta else train_epochs(model, x, y, epochs=1, batch_size=4, lr=0.1, seed=0, device=CPU))
        assert math.isfinite(loss) and all(torch.allclose(state_of(model)[k], w[k] - 0.1 * g[k], atol=1e-6)
                                           for k in w)


def test_the_device_is_cuda_when_there_is_one_and_a_missing_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device() == pick_device("auto") == torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")
    for asked in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=f"device '{asked}' asked for, but CUDA is not available"):
            pick_device(asked)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device() == torch.device("cuda") and pick_device("cuda:1") == torch.device("cuda:1")
    assert pick_device("cpu") == torch.device("cpu")


def test_a_device_is_named_with_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert describe_device(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU {i}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert describe_device(torch.device("cuda:1")) == "cuda:1 (GPU 1)"
    assert describe_device(torch.device("cuda")) == "cuda:3 (GPU 3)"  # the current one, as torch picks it


def test_fedavg_of_identical_models_is_that_model_in_half_precision_too() -> None:
    # When a group's members already agree, their average must not move them. Half-precision models are
    # accumulated in float32: rounding every partial sum (or every weighted term) to 8 bits of bfloat16 would
    # move most weights of an average of 50 models.
    gen = torch.Generator().manual_seed(0)
    model = {"bf16": torch.randn(1000, generator=gen).bfloat16(), "f16": torch.randn(1000, generator=gen).half()}
    for n in (10, 50):
        avg = weighted_average([model] * n, [3.0] * n)
        assert all(torch.equal(avg[k], model[k]) for k in model)


def test_fedavg_takes_any_positive_weights_but_exactly_one_per_model() -> None:
    states = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([5.0, 4.0])}]
    assert torch.allclose(weighted_average(states, [0.25, 0.75])["w"], torch.tensor([4.0, 3.0]))  # shares
    for weights in ([1.0], [1.0, 1.0, 1.0]):  # a model without a weight is an error, not silently left out
        with pytest.raises(ValueError):
            weighted_average(states, weights)
    with pytest.raises(ValueError, match=r"^nothing to average$"):
        weighted_average(states, [0.0, 0.0])


def test_a_loss_function_given_replaces_the_cross_entropy_on_each_mini_batch() -> None:
    # FedProto's path: loss_fn(model, x, y) of the mini-batch is what is minimised and reported
    x, y = data(24)
    seen: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []

    def doubled(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        seen.append((model, xb, yb))
        return 2 * F.cross_entropy(model(xb), yb)

    model, plain = linear(), linear()
    loss = train_epochs(model, x, y, epochs=1, batch_size=8, lr=0.1, seed=3, device=CPU, loss_fn=doubled)
    plain_loss = train_epochs(plain, x, y, epochs=1, batch_size=8, lr=0.1, seed=3, device=CPU)
    assert len(seen) == 3 and all(m is model for m, _, _ in seen)
    assert sorted(int(i) for _, xb, _ in seen for i in (xb[:, :1] == x[:, :1].T).nonzero()[:, 1]) == list(range(24))
    assert all(yb.shape == (8,) and xb.shape == (8, 5) for _, xb, yb in seen)
    assert loss > plain_loss  # twice the data loss at the start, and reported as such
    assert not torch.allclose(state_of(model)["weight"], state_of(plain)["weight"])  # the doubled gradient


def test_the_round_seed_differs_per_node_and_round_and_never_changes() -> None:
    # Pinned: a rerun of a scenario (and a node restarted mid-run) must draw the same batches and noise.
    assert round_seed(0, 0, 0) == 0 and round_seed(1, 2, 3) == 100003 + 2 * 1009 + 3
    seeds = {round_seed(7, i, r) for i in range(50) for r in range(99)}
    assert len(seeds) == 50 * 99


def test_local_steps_take_exactly_that_many_mini_batches_through_as_many_epochs() -> None:
    x, y = data(20)  # batches of 8: 3 a pass (8, 8, 4)
    calls: list[int] = []

    def counted(m: nn.Module) -> torch.Tensor:  # the penalty is added once per step
        calls.append(1)
        return torch.zeros(())

    for steps in (7, 3, 2):
        calls.clear()
        train_epochs(linear(), x, y, epochs=1, batch_size=8, lr=0.1, seed=1, device=CPU, steps=steps, penalty=counted)
        assert len(calls) == steps
    by_steps, by_epochs = linear(), linear()  # three steps over 20 samples are one epoch, the same one
    a = train_epochs(by_steps, x, y, epochs=5, batch_size=8, lr=0.1, seed=1, device=CPU, steps=3)
    b = train_epochs(by_epochs, x, y, epochs=1, batch_size=8, lr=0.1, seed=1, device=CPU)
    assert a == b and torch.equal(state_of(by_steps)["weight"], state_of(by_epochs)["weight"])


def test_a_nodes_training_takes_the_scenarios_steps_and_weight_decay(tmp_path: Path) -> None:
    from p2pfed.config import ConfigError
    from p2pfed.scenario.config import load_scenario

    path = tmp_path / "s.toml"
    path.write_text("[scenario]\nnodes = 5\n[train]\nsteps = 20\nweight_decay = 1e-5\nmomentum = 0.9\n")
    cfg = load_scenario(path).train
    assert (cfg.steps, cfg.weight_decay, cfg.momentum) == (20, 1e-5, 0.9)
    path.write_text("[scenario]\nnodes = 5\n[train]\nsteps = -1\n")
    with pytest.raises(ConfigError, match=r"train\.steps in"):
        load_scenario(path)
