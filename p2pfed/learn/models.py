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


class SmallCNN(nn.Module):
    """Two 3x3 conv layers and a linear head: fits 8x8 digits and 28x28 images on a CPU."""

    def __init__(self, in_channels: int, side: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
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
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
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
