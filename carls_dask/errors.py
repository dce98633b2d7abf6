"""Exceptions raised by carls-dask (re-exported from :mod:`carls_dask.storage.errors`, the bottom layer)."""

from __future__ import annotations

from carls_dask.storage.errors import (
    BankError,
    CarlsError,
    ConfigError,
    CorruptStoreError,
    DeadlineExceeded,
    IncompatibleStoreError,
    InvalidBatchError,
    InvalidDTypeError,
    InvalidShapeError,
    LifecycleError,
    LoopFailedError,
    ShardLostError,
    StoreError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownColumnError,
    UnknownTableError,
)

__all__ = [
    "BankError",
    "CarlsError",
    "ConfigError",
    "CorruptStoreError",
    "DeadlineExceeded",
    "IncompatibleStoreError",
    "InvalidBatchError",
    "InvalidDTypeError",
    "InvalidShapeError",
    "LifecycleError",
    "LoopFailedError",
    "ShardLostError",
    "StoreError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnknownColumnError",
    "UnknownTableError",
]
