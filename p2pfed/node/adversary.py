"""Scripted adversaries (a scenario's ``[[adversaries]]``): nodes that poison their data or their models,
so a scenario measures what each method does against them (a method that scores its peers on its own
validation data gives a peer whose model raises its validation loss a negative score, and leaves it out).

- ``label-flip``: trains on flipped labels (y → C − 1 − y): data poisoning with well-formed models;
- ``noise-model``: every model it sends (round models, a method's own kinds, what it keeps for peers) is
  Gaussian noise with each tensor's own scale: model poisoning;
- ``free-rider``: trains nothing and sends back the models it was given, untouched (each method's node side
  says which those are, ``ClientMethod.given_back``: a coordinated task's chosen model and shared ones, or the
  node's own model where a method trains that): it takes without contributing. What it sends besides models
  (a method's statistics: control variates, anchors, prototypes) is left as the method computed it: the
  free-rider lies about its work, not about its data.

An adversary is an ordinary member in every other respect (it follows the protocol); its own accuracy is
not counted with the honest nodes'.
"""

from __future__ import annotations

import torch


def flip_labels(y: torch.Tensor, classes: int) -> torch.Tensor:
    """Labels mapped y → classes − 1 − y (every sample mislabelled when classes is even)."""
    return (classes - 1) - y


def noise_like(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A model of Gaussian noise: each floating tensor replaced by N(0, s²), s its own standard deviation
    (a poisoned model a naive average cannot tell from a real one by its scale); other tensors kept."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        if t.is_floating_point() and t.numel():
            scale = float(t.float().std()) if t.numel() > 1 else float(t.float().abs().max())
            out[name] = (torch.randn(t.shape, generator=gen) * max(scale, 1e-3)).to(t.dtype)
        else:
            out[name] = t.clone()
    return out
