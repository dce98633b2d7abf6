"""CARLS's dynamic Gaussian memory and the DynamicNormalization layer built on it.

- :mod:`carls_dask.memory.gaussian`: the pure state machine (clusters with FIFO buffers, three lookup modes,
  two distances) and :class:`GaussianMemory`, an in-process memory;
- :mod:`carls_dask.memory.banked`: :class:`BankGaussianMemory`, the same memory held in a knowledge-bank
  table, so snapshots, the delta log and restore keep it exactly;
- :mod:`carls_dask.memory.normalization`: :class:`DynamicNormalization`, a ``torch.nn.Module`` that
  normalizes with the memory's statistics instead of the batch's.
"""

from __future__ import annotations

from carls_dask.memory.banked import BankGaussianMemory, memory_table
from carls_dask.memory.gaussian import (
    GaussianMemory,
    LookupMode,
    MemoryConfig,
    MemoryLookupResult,
    MemoryState,
    memory_lookup,
)
from carls_dask.memory.normalization import DynamicNormalization

__all__ = [
    "BankGaussianMemory",
    "DynamicNormalization",
    "GaussianMemory",
    "LookupMode",
    "MemoryConfig",
    "MemoryLookupResult",
    "MemoryState",
    "memory_lookup",
    "memory_table",
]
