"""The classifiers a curriculum run trains: an MLP or a small CNN, as its settings say."""

from __future__ import annotations

from typing import Any

from carls_dask.paradigms.curriculum.settings import CurriculumSettings

__all__ = ["make_model"]


def make_model(s: CurriculumSettings, image_shape: tuple[int, ...], n_classes: int) -> Any:
    """The classifier: an MLP or a small CNN; its last layer maps ``s.hidden`` features to the classes."""
    import torch
    from torch import nn

    torch.manual_seed(s.seed)
    c, h, w = image_shape

    def hidden(n_in: int) -> list[nn.Module]:
        out: list[nn.Module] = [nn.Linear(n_in, s.hidden), nn.ReLU()]
        return [*out, nn.Dropout(s.dropout)] if s.dropout > 0 else out

    if s.model == "mlp":
        body: list[nn.Module] = [nn.Flatten()]
        for i in range(s.layers):
            body += hidden(c * h * w if i == 0 else s.hidden)
        return nn.Sequential(*body, nn.Linear(s.hidden, n_classes))
    return nn.Sequential(
        nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), *hidden(32 * (h // 4) * (w // 4)), nn.Linear(s.hidden, n_classes),
    )

