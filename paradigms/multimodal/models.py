"""The models of the multimodal paradigm: the dual encoder (trainable heads over frozen image features and frozen
sentence features or hashed text ids) and the image query head of the concept classifier."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from carls_dask.paradigms.multimodal.features import FEATURE_DIM

if TYPE_CHECKING:
    from carls_dask.paradigms.multimodal.data import Corpus, CorpusSpec

__all__ = ["DualEncoder", "ImageQueryHead", "dual_encoder"]


class ImageQueryHead(nn.Module):
    """Maps frozen features (of images, or of sentences) to an L2-normalised ``dim``-d embedding (an MLP)."""

    def __init__(self, feature_dim: int, dim: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(feature_dim), nn.Linear(feature_dim, hidden), nn.GELU(),
                                 nn.Linear(hidden, dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = nn.functional.normalize(self.net(features), dim=-1)
        return out


class DualEncoder(nn.Module):
    """CLIP-style dual encoder: an image head and a text head into one ``dim``-d unit sphere.

    The text head is a projection MLP over frozen sentence features (``text_dim`` given, e.g. the
    384-d all-MiniLM-L6-v2 features) or, without pretrained text weights, a bag of hashed token ids.

    Parameters
    ----------
    feature_dim
        Size of the frozen image features.
    text_buckets
        Number of hashed text token ids (id 0 is padding); unused with ``text_dim``.
    dim
        Embedding size.
    hidden
        Width of the heads.
    temperature
        Initial softmax temperature; its log is learned (bounded to [0.01, 1]).
    text_dim
        Size of frozen text features (``None``: the text input is hashed token ids).
    learn_temperature
        Learn the temperature (``False``: it stays at ``temperature``).
    """

    def __init__(self, feature_dim: int, text_buckets: int, dim: int = 64, hidden: int = 256,
                 temperature: float = 0.07, text_dim: int | None = None, learn_temperature: bool = True) -> None:
        super().__init__()
        self.image = ImageQueryHead(feature_dim, dim, hidden)
        self.text_dim = text_dim
        if text_dim is None:
            self.text_bag = nn.EmbeddingBag(text_buckets, hidden, mode="mean", padding_idx=0)
            self.text_out = nn.Sequential(nn.GELU(), nn.Linear(hidden, dim))
        else:
            self.text_head = ImageQueryHead(text_dim, dim, hidden)
        self.log_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)), requires_grad=learn_temperature)

    def encode_image(self, features: torch.Tensor) -> torch.Tensor:
        """Unit-norm image embeddings ``[n, dim]``."""
        out: torch.Tensor = self.image(features)
        return out

    def encode_text(self, text: torch.Tensor) -> torch.Tensor:
        """Unit-norm text embeddings ``[n, dim]`` of frozen features ``[n, text_dim]`` or 0-padded token ids ``[n, L]``."""
        if self.text_dim is not None:
            projected: torch.Tensor = self.text_head(text)
            return projected
        out: torch.Tensor = nn.functional.normalize(self.text_out(self.text_bag(text)), dim=-1)
        return out

    @property
    def scale(self) -> torch.Tensor:
        """The logit scale ``1 / temperature``, clamped to [1, 100]."""
        return self.log_scale.clamp(0.0, math.log(100.0)).exp()

    def forward(self, features: torch.Tensor, ids: torch.Tensor) -> Any:
        return self.encode_image(features), self.encode_text(ids)


def dual_encoder(corpus: Corpus, spec: CorpusSpec, dim: int, hidden: int, temperature: float = 0.07,
                 learn_temperature: bool = True) -> Any:
    """The :class:`DualEncoder` for ``corpus``'s text inputs."""
    return DualEncoder(FEATURE_DIM, spec.text_buckets, dim, hidden, temperature=temperature,
                       text_dim=corpus.text_dim, learn_temperature=learn_temperature)

