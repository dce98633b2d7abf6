"""Persistence for carls-dask: Zarr bank snapshots, the delta log, xarray views and metric series.

Nothing here imports Dask or torch: the package reads and writes numpy arrays to Zarr stores.
"""

from __future__ import annotations

from storage.bankview import open_bank, read_bank
from storage.deltalog import DeltaLog, DeltaRecord, replay, tail_seq
from storage.errors import CarlsError
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
