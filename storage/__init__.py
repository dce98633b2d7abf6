"""Persistence for carls-dask: Zarr bank snapshots, the delta log, xarray views and metric series.

Nothing here imports Dask or torch: the package reads and writes numpy arrays to Zarr stores. The public
names below load their module on first use, so ``import storage.errors`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from storage.errors import CarlsError

if TYPE_CHECKING:
    from storage.bankview import open_bank, read_bank
    from storage.deltalog import DeltaLog, DeltaRecord, replay, tail_seq
    from storage.metrics import MetricWriter, open_metrics
    from storage.snapshots import (
        SnapshotHandle,
        begin_snapshot,
        commit_snapshot,
        list_snapshots,
        prune_snapshots,
        read_manifest,
        read_snapshot,
        write_shard,
    )

_WHERE = {
    "open_bank": "storage.bankview",
    "read_bank": "storage.bankview",
    "DeltaLog": "storage.deltalog",
    "DeltaRecord": "storage.deltalog",
    "replay": "storage.deltalog",
    "tail_seq": "storage.deltalog",
    "MetricWriter": "storage.metrics",
    "open_metrics": "storage.metrics",
    "SnapshotHandle": "storage.snapshots",
    "begin_snapshot": "storage.snapshots",
    "commit_snapshot": "storage.snapshots",
    "list_snapshots": "storage.snapshots",
    "prune_snapshots": "storage.snapshots",
    "read_manifest": "storage.snapshots",
    "read_snapshot": "storage.snapshots",
    "write_shard": "storage.snapshots",
}

__all__ = [
    "CarlsError",
    "DeltaLog",
    "DeltaRecord",
    "MetricWriter",
    "SnapshotHandle",
    "begin_snapshot",
    "commit_snapshot",
    "list_snapshots",
    "open_bank",
    "open_metrics",
    "prune_snapshots",
    "read_bank",
    "read_manifest",
    "read_snapshot",
    "replay",
    "tail_seq",
    "write_shard",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'storage' has no attribute {name!r}")
