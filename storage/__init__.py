"""Persistence for carls-dask: Zarr bank snapshots, the delta log, xarray views and metric series.

Nothing here imports Dask or torch: the package reads and writes numpy arrays to Zarr stores.
"""

from __future__ import annotations

from storage.errors import CarlsError

__all__ = ["CarlsError"]
