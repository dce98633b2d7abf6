"""The PyTorch MLP on bag-of-words features that every variant trains."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["MLP"]


class MLP(nn.Module):
    """A multi-layer perceptron: ``[Dropout, Linear, ReLU] * len(hidden)``, then ``Dropout, Linear`` to logits.

    Parameters
    ----------
    n_features
        Input width.
    n_classes
        Output width (one logit per class).
    hidden
        Widths of the hidden layers.
    dropout
        Dropout probability before each linear layer.
    """

    def __init__(self, n_features: int, n_classes: int, hidden: Sequence[int] = (64,), dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers += [nn.Dropout(dropout), nn.Linear(width, h), nn.ReLU()]
            width = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(width, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits ``[batch, n_classes]``."""
        return self.head(self.body(x))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Return the last hidden layer ``[batch, hidden[-1]]`` (the node embedding)."""
        return self.body(x)
