"""Models for the end-to-end tests, one per scenario of the core issue."""

from __future__ import annotations

import torch
from torch import nn

RELU = "torch.ops.aten.relu.default"


class ConvBnRelu(nn.Module):
    """The seed scenario: conv -> batchnorm -> relu stacks, then a multi-output engine."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, channels, 3, padding=1)
        self.b1 = nn.BatchNorm2d(channels)
        self.c2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.b2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        a, b = x.chunk(2, dim=1)
        scaled = a * 2
        return torch.relu(scaled) + b, scaled


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + x)


class TinyResNet(nn.Module):
    """ResNet-style: stem, three residual blocks, pooled linear head."""

    def __init__(self, channels: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*(Residual(channels) for _ in range(3)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(torch.relu(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


class EdgesFallBack(nn.Module):
    """First and last op fall back; the engine also reads the graph input directly."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        z = self.conv(y) + x * 0.5
        return torch.sigmoid(z)


class MultiOutputBothSides(nn.Module):
    """chunk inside an engine, topk in a fallback; both feed later blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.lin(x).chunk(2, dim=-1)
        values, indices = torch.topk(a, k=3, dim=-1)
        left, right = b.split([5, 3], dim=-1)
        return values * 2 + right, indices + left.sum(dim=-1, keepdim=True).long()


class TaggedTensor(torch.Tensor):
    """A tensor subclass: torch.export.save pickles such constants (``use_pickle``); loading one runs its class."""
