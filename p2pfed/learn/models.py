"""Models by name: multinomial logistic regression, a small CNN, the FedAvg CNN, ResNet-18, MobileNetV2, and a
character-level GRU language model for next-token prediction."""

from __future__ import annotations

import torch
from torch import nn


class LogReg(nn.Module):
    """Multinomial logistic regression on flattened inputs."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class MaxPool2(nn.MaxPool2d):
    """nn.MaxPool2d(2), the same values faster where no gradient is taken on a CPU (scoring peers, evaluating).

    torch's CPU max_pool2d was the largest cost of pFedLIA's scoring: 39 % of a Fashion-MNIST node's process, more
    than the convolutions (py-spy). The elementwise maximum of the window's four strided views gives the same
    values, and scoring 99 Fashion-MNIST partial models took 2.3x less time with it (benchmarks/lia.py,
    docs/performance.md). Training keeps max_pool2d (its backward gives a tie's gradient to the first of the
    tied; torch.maximum's would split it), and so does CUDA (one kernel there)."""

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2  # floor mode: an odd last row or column is left out
        if x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad) or not h or not w:
            return super().forward(x)  # (an input too small for a window: max_pool2d's own error)
        return torch.maximum(torch.maximum(x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2]),
                             torch.maximum(x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2]))


class SmallCNN(nn.Module):
    """Two 3x3 conv layers and a linear head: fits 8x8 digits and 28x28 images on a CPU."""

    def __init__(self, in_channels: int, side: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), MaxPool2(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), MaxPool2(),
            nn.Flatten(),
        )
        self.head = nn.Linear(2 * width * (side // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class FedAvgCNN(nn.Module):
    """The CNN of McMahan et al.: conv5-32, pool, conv5-64, pool, fc512, head."""

    def __init__(self, in_channels: int, side: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), MaxPool2(),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), MaxPool2(),
            nn.Flatten(), nn.Linear(64 * (side // 4) ** 2, 512), nn.ReLU(),
        )
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class CharGRU(nn.Module):
    """A causal character language model: embedding, one GRU layer, a linear head giving each position's
    next-token logits (batch, positions, vocabulary). 128 hidden units, about 69 k parameters for a
    vocabulary of 42: on this project's 2-core CPU an epoch of 1100 words took 0.5 s, against 1.2 s with 192
    units and 3.9 s with 256 (Rokvic et al. 2025 fine-tune GPT-2, which cannot be downloaded here)."""

    def __init__(self, vocabulary: int, embed: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, embed)
        self.rnn = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocabulary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


MODELS = ("logreg", "cnn", "fedavg-cnn", "resnet18", "mobilenetv2", "char-gru")
SEQUENCE_MODELS = ("char-gru",)  # take token sequences (N, T), not images


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0) -> nn.Module:
    """Build a model by name for inputs of input_shape (C, H, W), or (T,) token sequences for a sequence model
    whose num_classes is the vocabulary's size; weights are seeded."""
    torch.manual_seed(seed)
    if name in SEQUENCE_MODELS:
        if len(input_shape) != 1:
            raise ValueError(f"model {name!r} takes token sequences, not inputs of shape {input_shape}")
        return CharGRU(num_classes)
    channels, side = input_shape[0], input_shape[-1]
    if name == "logreg":
        return LogReg(int(torch.tensor(input_shape).prod()), num_classes)
    if name == "cnn":
        return SmallCNN(channels, side, num_classes)
    if name == "fedavg-cnn":
        return FedAvgCNN(channels, side, num_classes)
    if name in ("resnet18", "mobilenetv2"):
        import torchvision

        if name == "resnet18":
            model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
            if side <= 32:  # the CIFAR variant: 3x3 stem, no max-pool (the 7x7/2 stem loses 32x32 images)
                model.conv1 = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
                model.maxpool = nn.Identity()
            return model
        model = torchvision.models.mobilenet_v2(weights=None, num_classes=num_classes)
        if channels != 3:
            model.features[0][0] = nn.Conv2d(channels, 32, 3, 2, 1, bias=False)
        return model
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def head_of(model: nn.Module) -> nn.Module:
    """The model's final classifier layer (methods that share features need what goes into it)."""
    for attr in ("head", "fc", "linear", "classifier"):
        if isinstance(getattr(model, attr, None), nn.Module):
            return getattr(model, attr)
    raise ValueError(f"{type(model).__name__} has no head/fc/linear/classifier layer to take features from")


def features_and_logits(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The input of the model's head (its feature embedding, flattened) and the logits, in one pass."""
    seen: list[torch.Tensor] = []
    hook = head_of(model).register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        logits = model(x)
    finally:
        hook.remove()
    return seen[-1].flatten(1), logits
