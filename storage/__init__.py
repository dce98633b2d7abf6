"""Persistence for carls-dask: Zarr bank snapshots, the delta log, the two as one bank store, xarray views and
metric series.

Nothing here imports Dask or torch: the package reads and writes numpy arrays to Zarr stores. The public
names below load their module on first use, so importing one module of the package stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from carls_dask.errors import CarlsError, UnknownAttributeError

if TYPE_CHECKING:
    from carls_dask.storage.bankstore import BankReplay, RowBatch, prune_snapshots
    from carls_dask.storage.bankview import open_bank, open_snapshot, read_bank
    from carls_dask.storage.deltalog import DeltaLog, DeltaRecord, replay
    from carls_dask.storage.manifest import list_snapshots, read_manifest
    from carls_dask.storage.metrics import MetricWriter, open_metrics
    from carls_dask.storage.snapshots import (
        SnapshotHandle,
        begin_snapshot,
        commit_snapshot,
        read_snapshot,
        write_shard,
    )

_WHERE = {
    "BankReplay": "carls_dask.storage.bankstore",
    "RowBatch": "carls_dask.storage.bankstore",
    "prune_snapshots": "carls_dask.storage.bankstore",
    "open_bank": "carls_dask.storage.bankview",
    "open_snapshot": "carls_dask.storage.bankview",
    "read_bank": "carls_dask.storage.bankview",
    "DeltaLog": "carls_dask.storage.deltalog",
    "DeltaRecord": "carls_dask.storage.deltalog",
    "replay": "carls_dask.storage.deltalog",
    "MetricWriter": "carls_dask.storage.metrics",
    "open_metrics": "carls_dask.storage.metrics",
    "SnapshotHandle": "carls_dask.storage.snapshots",
    "begin_snapshot": "carls_dask.storage.snapshots",
    "commit_snapshot": "carls_dask.storage.snapshots",
    "list_snapshots": "carls_dask.storage.manifest",
    "read_manifest": "carls_dask.storage.manifest",
    "read_snapshot": "carls_dask.storage.snapshots",
    "write_shard": "carls_dask.storage.snapshots",
}

__all__ = [
    "BankReplay",
    "CarlsError",
    "DeltaLog",
    "DeltaRecord",
    "MetricWriter",
    "RowBatch",
    "SnapshotHandle",
    "begin_snapshot",
    "commit_snapshot",
    "list_snapshots",
    "open_bank",
    "open_metrics",
    "open_snapshot",
    "prune_snapshots",
    "read_bank",
    "read_manifest",
    "read_snapshot",
    "replay",
    "write_shard",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise UnknownAttributeError(f"module 'carls_dask.storage' has no attribute {name!r}")
