"""Lazy influence: a partial model trained on my labels helps me, one trained on other labels hurts;
batched (vmap) scoring gives the same numbers as one model at a time."""

from __future__ import annotations

import pytest
import torch

from p2pfed.influence.lazy_influence import (
    sample_losses,
    sample_losses_and_errors,
    score_peers,
    score_peers_one_by_one,
)
from p2pfed.learn.datasets import load_dataset
from p2pfed.learn.models import build_model
from p2pfed.learn.tasks import NEXT_TOKEN, PAD
from p2pfed.learn.train import state_of, train_copy

CPU = torch.device("cpu")


def test_same_distribution_peers_score_higher_and_batched_equals_looped() -> None:
    d = load_dataset("digits")
    model = build_model("cnn", d.input_shape, 10, seed=0)
    w0 = state_of(model)
    mine = (d.y_train == 0) | (d.y_train == 1)
    other = (d.y_train == 5) | (d.y_train == 6)
    x_val, y_val = d.x_test[(d.y_test == 0) | (d.y_test == 1)], d.y_test[(d.y_test == 0) | (d.y_test == 1)]
    partials = []
    for mask, seed in [(mine, 1), (mine, 2), (other, 3), (other, 4)]:
        x, y = d.x_train[mask][:60], d.y_train[mask][:60]
        partials.append(train_copy(model, w0, x, y, epochs=10, batch_size=16, lr=0.05, seed=seed, device=CPU))
    batched = score_peers(model, w0, partials, x_val, y_val, CPU, chunk=3, batched=True)
    looped = score_peers_one_by_one(model, w0, partials, x_val, y_val, CPU)
    assert torch.allclose(torch.tensor(batched), torch.tensor(looped), atol=1e-4)
    assert min(batched[:2]) > 0 > max(batched[2:])
    assert score_peers(model, w0, partials, x_val, y_val, CPU) == looped  # the CPU default is the loop
    assert score_peers(model, w0, [], x_val, y_val, CPU) == []
    # per sample, batched (CUDA's default) or looped alike; their means are the scores
    per_sample = sample_losses(model, [w0, *partials], x_val, y_val, CPU, batched=True, chunk=2)
    assert per_sample.shape == (5, len(y_val))
    assert torch.allclose(torch.tensor(per_sample), torch.tensor(sample_losses(model, [w0, *partials], x_val, y_val,
                                                                               CPU)), atol=1e-5)
    assert torch.allclose(torch.tensor(per_sample[0] - per_sample[1:]).mean(1), torch.tensor(looped).double(),
                          atol=1e-5)


def test_per_token_losses_leave_the_padding_out_batched_or_not() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7))
    x = torch.randint(0, 7, (3, 5))
    y = torch.randint(0, 7, (3, 5))
    y[0, 3:] = PAD
    y[2, 1:] = PAD
    states = [{k: v + 0.1 * i for k, v in model.state_dict().items()} for i in range(3)]
    looped = sample_losses(model, states, x, y, CPU, NEXT_TOKEN)
    batched = sample_losses(model, states, x, y, CPU, NEXT_TOKEN, batched=True)
    assert looped.shape == batched.shape == (3, 15 - 2 - 4)  # every token but the six of padding
    assert torch.allclose(torch.tensor(looped), torch.tensor(batched), atol=1e-5)
    # each token's error, from the same forward passes: the arg-max is not the next token
    for on in (False, True):
        losses, errors = sample_losses_and_errors(model, states, x, y, CPU, NEXT_TOKEN, batched=on)
        assert torch.allclose(torch.tensor(losses), torch.tensor(looped), atol=1e-5)
        for i, state in enumerate(states):
            wrong = torch.func.functional_call(model, state, (x,)).argmax(-1) != y
            assert errors[i].tolist() == wrong[y != PAD].double().tolist()


def test_training_a_partial_model_leaves_the_nodes_own_model_as_it_was() -> None:
    # The partial model is trained on a copy: the node goes on from its own weights (w0), and the partial
    # model it sends is not the model it trains next.
    d = load_dataset("digits")
    model = build_model("cnn", d.input_shape, 10, seed=0)
    before = state_of(model)
    partial = train_copy(model, before, d.x_train[:60], d.y_train[:60], epochs=2, batch_size=16, lr=0.05, seed=1,
                            device=CPU)
    after = state_of(model)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert not all(torch.equal(partial[k], before[k]) for k in before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (run on one: see docs/performance.md)")
def test_on_a_gpu_states_that_lie_on_the_host_and_on_the_gpu_are_scored_alike() -> None:
    """Received models lie on the host, a node's live models on the GPU: scoring both together gives the CPU's
    losses (torch.stack refuses two devices; an H100 run found it)."""
    d = load_dataset("digits")
    model = build_model("cnn", d.input_shape, 10, seed=0)
    w0 = state_of(model)
    partial = train_copy(model, w0, d.x_train[:60], d.y_train[:60], epochs=2, batch_size=16, lr=0.05, seed=1,
                         device=CPU)
    gpu = torch.device("cuda")
    mixed = [w0, {k: v.to(gpu) for k, v in partial.items()}]
    on_gpu = sample_losses(model, mixed, d.x_test[:50], d.y_test[:50], gpu)
    on_cpu = sample_losses(model, [w0, partial], d.x_test[:50], d.y_test[:50], CPU)
    assert on_gpu.shape == (2, 50) and abs(on_gpu - on_cpu).max() < 1e-3
