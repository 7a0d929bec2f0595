"""The user's torch backend, its layers (``nn.py``, as torch names its own): a classifier that prints its
activations' scale while it trains (a graph break in the user's own code)."""

from __future__ import annotations

import torch
from torch import nn


class PrintingClassifier(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.head = nn.Linear(16, classes)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.proj(features)).mean(1)
        print("scale", hidden.abs().mean())  # a user's debugging line
        return self.head(hidden)
