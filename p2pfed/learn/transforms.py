"""Input transforms for feature-space heterogeneity (Rokvic et al. 2025, §II and §IV: "two types of
heterogeneity, label space and feature space"): clients of one cluster see their inputs through the same
transform, as the clustered-FL work the paper cites does with rotated images.

A transform is written as a string, so that a scenario file names it and a node on another machine derives
the same shard: one step or several joined by ``+``, applied left to right, e.g. ``rotate:90``,
``invert``, ``blur:1.0``, ``contrast:0.5``, ``noise:0.5``, ``rotate:180+noise:0.3``; ``none`` leaves the
inputs as they are. Steps work on the dataset's normalised tensors (N, C, H, W), per channel zero mean and
unit variance over the training split:

- ``rotate:DEG``: rotation by DEG degrees counter-clockwise; multiples of 90 exactly (torch.rot90), other
  angles bilinear, with the corners filled by each channel's minimum over the split (the background of
  digit-like images); a quarter turn needs square images.
- ``invert``: x → −x, a photographic negative about the data's mean.
- ``blur:SIGMA``: Gaussian blur, kernel 2·⌈2σ⌉+1 wide (at most the image's side, odd).
- ``contrast:F``: x → F·x, contrast scaled about the mean (F < 1 flattens, F > 1 sharpens).
- ``noise:STD``: additive Gaussian noise of that standard deviation (in units of the data's), drawn from a
  seed, so the same node gets the same noise on every run and machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

_MAX_PARAMETER = 1e4  # no step needs a larger value; a typo such as blur:1e9 is refused


@dataclass(frozen=True)
class Step:
    """One step of a transform: its name and its parameter (0 for the steps that take none)."""

    name: str
    value: float = 0.0


def _rotate(x: torch.Tensor, degrees: float, _gen: torch.Generator) -> torch.Tensor:
    quarter = degrees / 90
    if quarter == round(quarter):
        if round(quarter) % 2 and x.shape[-2] != x.shape[-1]:
            raise ValueError(f"a quarter turn of {x.shape[-2]}x{x.shape[-1]} images changes their shape: rotate "
                             "square images only, or by a half turn")
        return torch.rot90(x, round(quarter) % 4, dims=(-2, -1))
    from torchvision.transforms.functional import InterpolationMode, rotate

    fill = x.amin(dim=(0, 2, 3)).tolist()  # each channel's background: its darkest value
    return rotate(x, degrees, interpolation=InterpolationMode.BILINEAR, fill=fill)


def _blur(x: torch.Tensor, sigma: float, _gen: torch.Generator) -> torch.Tensor:
    from torchvision.transforms.functional import gaussian_blur

    side = min(x.shape[-2:])
    size = min(2 * math.ceil(2 * sigma) + 1, side if side % 2 else side - 1)
    return gaussian_blur(x, [size, size], [sigma, sigma])


def _noise(x: torch.Tensor, std: float, gen: torch.Generator) -> torch.Tensor:
    return x + std * torch.randn(x.shape, generator=gen, dtype=x.dtype)


# name -> (the step, whether it takes a value, the values it accepts and how they are told)
STEPS: dict[str, tuple[Callable[[torch.Tensor, float, torch.Generator], torch.Tensor], bool,
                       Callable[[float], bool], str]] = {
    "none": (lambda x, _v, _g: x, False, lambda _v: True, ""),
    "rotate": (_rotate, True, lambda v: abs(v) <= 360, "degrees in [-360, 360]"),
    "invert": (lambda x, _v, _g: -x, False, lambda _v: True, ""),
    "blur": (_blur, True, lambda v: 0 < v <= 10, "a sigma in (0, 10]"),
    "contrast": (lambda x, v, _g: v * x, True, lambda v: 0 < v <= 10, "a factor in (0, 10]"),
    "noise": (_noise, True, lambda v: 0 <= v <= 10, "a standard deviation in [0, 10]"),
}


def parse(spec: str) -> list[Step]:
    """The steps of a transform written as a string; ValueError naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a transform is a string such as 'rotate:90' or 'invert+noise:0.3' (got {spec!r})")
    steps = []
    for part in spec.split("+"):
        name, sep, raw = part.strip().partition(":")
        if name not in STEPS:
            raise ValueError(f"unknown transform step {name!r} in {spec!r}; choose among {', '.join(STEPS)}")
        _, takes_value, accepts, told = STEPS[name]
        if takes_value != bool(sep):
            raise ValueError(f"{name} in {spec!r} " + (f"needs a value: {name}:VALUE, {told}" if takes_value
                                                       else "takes no value"))
        value = 0.0
        if takes_value:
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{name} in {spec!r}: {raw!r} is not a number") from None
            if not (math.isfinite(value) and abs(value) <= _MAX_PARAMETER and accepts(value)):
                raise ValueError(f"{name} in {spec!r}: {value:g} is out of range: {told}")
        steps.append(Step(name, value))
    return steps


def apply(spec: str, x: torch.Tensor, seed: int) -> torch.Tensor:
    """x (N, C, H, W) seen through the transform spec; random steps (noise) drawn from seed."""
    if x.dim() != 4:
        raise ValueError(f"transforms work on images (N, C, H, W); these inputs have shape {tuple(x.shape)}")
    if x.numel() == 0:  # an empty split (no validation samples, or a shard label skew left empty)
        return x
    gen = torch.Generator().manual_seed(seed)
    for step in parse(spec):
        x = STEPS[step.name][0](x, step.value, gen)
    return x.contiguous()
