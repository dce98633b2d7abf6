"""Data loading shared between loops: a node-local shared loader (:mod:`carls_dask.loading.shared`)."""

from __future__ import annotations

from carls_dask.loading.shared import (
    ArraySpec,
    ConsumerDetached,
    LoaderClosed,
    LoaderConsumer,
    LoaderError,
    ProducerLost,
    SharedLoader,
    attach,
    loader_exists,
    shared_memory_available,
    shared_memory_free,
)

__all__ = [
    "ArraySpec",
    "ConsumerDetached",
    "LoaderClosed",
    "LoaderConsumer",
    "LoaderError",
    "ProducerLost",
    "SharedLoader",
    "attach",
    "loader_exists",
    "shared_memory_available",
    "shared_memory_free",
]
