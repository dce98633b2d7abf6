"""CARLS's ``DynamicNormalization`` as a ``torch.nn.Module``: normalization by a Gaussian memory's statistics.

Batch normalization divides by the batch's statistics; this layer looks each input up in a dynamic
Gaussian memory (:class:`carls_dask.memory.GaussianMemory` in-process, or
:class:`carls_dask.memory.BankGaussianMemory` in the knowledge bank) and uses the nearest cluster's mean
``mu`` and variance ``var`` instead, so it works at any batch size and keeps one set of statistics per
cluster of activations. With learnable per-feature ``mean_scale``, ``mean_offset`` (as in CARLS,
initialised to 1 and 0) and ``prior_scale``, ``prior_offset`` (1 and 0):

    s = (||mu||^2 + prior_scale * mu + prior_offset) / (||x||^2 + eps)
    out = ((1 + s) * x - 2 * (mean_scale * mu + mean_offset)) / sqrt(var + eps)

``use_batch_normalization=True`` uses batch normalization's formula with the memory's statistics:
``(x - mu) / sqrt(var + eps) * mean_scale + mean_offset``. As in CARLS, no gradient flows through the
memory's statistics, and in grow mode (3) none flows to the inputs either (a new cluster should not
disturb the layers below). In training the layer looks up with ``mode`` (default 2, update); in eval mode
with ``eval_mode`` (default 1, lookup only, so evaluation never changes the memory). Unlike CARLS, every
layer names its own memory (CARLS hard-codes one shared memory per process).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from carls_dask.errors import ConfigError
from carls_dask.memory.gaussian import LookupMode, MemoryConfig, MemoryLookupResult

__all__ = ["DynamicNormalization", "MemoryLike"]


class MemoryLike(Protocol):
    """What the layer needs of a memory: its settings and CARLS's lookup call."""

    config: MemoryConfig

    def lookup(self, inputs: Any, mode: int | LookupMode = ..., *, model_step: int = ...) -> MemoryLookupResult:
        """Nearest cluster per input (see :func:`carls_dask.memory.memory_lookup`)."""
        ...


class DynamicNormalization(nn.Module):
    """Normalize the last dimension of the input with a Gaussian memory's nearest-cluster statistics.

    Parameters
    ----------
    memory
        A :class:`~carls_dask.memory.GaussianMemory` or :class:`~carls_dask.memory.BankGaussianMemory`;
        its ``config.dim`` is the number of features.
    mode
        Lookup mode in training: 1, 2 or 3 (:class:`~carls_dask.memory.LookupMode`).
    eval_mode
        Lookup mode in eval mode (default 1: the memory is not changed).
    epsilon
        Added to the variance (and to ``||x||^2``).
    use_batch_normalization
        Use batch normalization's formula with the memory's statistics.

    Raises
    ------
    ConfigError
        If a mode is not 1, 2 or 3, or ``epsilon`` is not positive.
    """

    def __init__(self, memory: MemoryLike, *, mode: int | LookupMode = LookupMode.UPDATE,
                 eval_mode: int | LookupMode = LookupMode.LOOKUP, epsilon: float = 1e-3,
                 use_batch_normalization: bool = False) -> None:
        super().__init__()
        for name, value in (("mode", mode), ("eval_mode", eval_mode)):
            if not isinstance(value, int) or value not in (1, 2, 3):
                raise ConfigError(f"DynamicNormalization: {name} is {value!r}; expected 1 (lookup), "
                                  "2 (update) or 3 (grow)")
        if not epsilon > 0:
            raise ConfigError(f"DynamicNormalization: epsilon is {epsilon!r}; expected a number > 0")
        self.memory = memory
        self.mode = LookupMode(int(mode))
        self.eval_mode = LookupMode(int(eval_mode))
        self.epsilon = float(epsilon)
        self.use_batch_normalization = bool(use_batch_normalization)
        dim = memory.config.dim
        self.num_features = dim
        self.mean_scale = nn.Parameter(torch.ones(dim))
        self.mean_offset = nn.Parameter(torch.zeros(dim))
        if self.use_batch_normalization:
            self.register_parameter("prior_scale", None)
            self.register_parameter("prior_offset", None)
        else:
            self.prior_scale = nn.Parameter(torch.ones(dim))
            self.prior_offset = nn.Parameter(torch.zeros(dim))
        self.last_lookup: MemoryLookupResult | None = None
        self.model_step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize ``x`` (``[..., num_features]``; 16-bit inputs are computed in float32)."""
        mode = self.mode if self.training else self.eval_mode
        dtype = x.dtype
        xf = x.float()
        result = self.memory.lookup(xf.detach().cpu().numpy(), mode, model_step=self.model_step)
        self.last_lookup = result
        mu = torch.from_numpy(result.mean).to(device=x.device)
        var = torch.from_numpy(result.variance).to(device=x.device)
        if mode == LookupMode.GROW:
            xf = xf.detach()
        inv = torch.rsqrt(var + self.epsilon)
        if self.use_batch_normalization:
            out = (xf - mu) * inv * self.mean_scale + self.mean_offset
        else:
            dividend = (mu * mu).sum(-1, keepdim=True) + self.prior_scale * mu + self.prior_offset
            scale = dividend / ((xf * xf).sum(-1, keepdim=True) + self.epsilon)
            out = ((1 + scale) * xf - 2 * (mu * self.mean_scale + self.mean_offset)) * inv
        return out.to(dtype)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, mode={int(self.mode)}, eval_mode={int(self.eval_mode)}, "
                f"epsilon={self.epsilon}, use_batch_normalization={self.use_batch_normalization}")
