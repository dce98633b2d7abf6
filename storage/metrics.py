"""The metric store: per-step time series a run appends and dashboards read while it runs.

Layout of ``RUN/metrics.zarr`` (a Zarr v3 group)::

    metrics.json     what is committed: rows, the series (name, shape, dims, array path), the run
    step             int64[capacity]            the step of each row
    wall_time        float64[capacity]          unix seconds of each row
    series/<i>       float64[capacity, *shape]  one array per named series, NaN where it has no value

Arrays are created with a large fixed capacity along ``step`` and chunked along it, so appending never
changes their metadata and never touches a full chunk again: a flush writes the new rows (rewriting at
most the one partly filled chunk at the end, atomically, with the same earlier values) and then swaps
``metrics.json``. A reader that opens the store at any moment sees a consistent prefix: the rows listed
in ``metrics.json``, whose chunks are already on disk. A series that first appears mid-run reads as NaN
for the earlier steps.
"""

from __future__ import annotations

import logging
import math
import os
import pathlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr
import zarr

from carls_dask.errors import (
    CorruptStoreError,
    IncompatibleStoreError,
    InvalidBatchError,
    InvalidShapeError,
    LifecycleError,
    StoreNotFoundError,
)
from carls_dask.storage.fsutil import WriterLock, atomic_write_json, read_json
from carls_dask.storage.runfolder import METRICS, part_hint

__all__ = ["MetricWriter", "open_metrics"]

logger = logging.getLogger(__name__)

FORMAT = 1
KIND = "carls-dask metrics"
INDEX = "metrics.json"
#: The lock file of the store's one writer.
WRITER_LOCK = "writer.lock"
#: Steps a store can hold (metadata only: unwritten chunks take no space).
CAPACITY = 1 << 31


def _load_index(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_dir():
        raise StoreNotFoundError(f"metric store {path}: no such folder; expected a run's {METRICS} folder (RUN/{METRICS})"
                                 + part_hint(path, METRICS))
    if not (path / INDEX).exists():
        raise StoreNotFoundError(f"metric store {path}: holds no {INDEX}, so it is not a metric store; expected a "
                                 f"run's {METRICS} folder (RUN/{METRICS})" + part_hint(path, METRICS))
    idx = read_json(path / INDEX, f"metric store {path}")
    if idx.get("kind") != KIND or idx.get("format") != FORMAT:
        raise IncompatibleStoreError(
            f"metric store {path}: kind {idx.get('kind')!r}, format {idx.get('format')!r}; "
            f"expected {KIND!r}, format {FORMAT}"
        )
    return idx


class MetricWriter:
    """Append rows of named series to a metric store; the single writer of that store.

    Parameters
    ----------
    path : path-like
        The store folder (``RUN/metrics.zarr``); created if missing, continued if it exists.
    run : str, optional
        Name of the run; an existing store of another run is refused.
    flush_rows : int
        Buffered rows that trigger a flush.
    flush_seconds : float
        Age of the oldest buffered row that triggers a flush (checked on each append).
    chunk_steps : int
        Rows per Zarr chunk (new stores only).

    Raises
    ------
    StoreLockedError
        If another writer holds the store.
    IncompatibleStoreError
        If the store is of another format or run.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        run: str | None = None,
        *,
        flush_rows: int = 64,
        flush_seconds: float = 5.0,
        chunk_steps: int = 256,
    ) -> None:
        self.path = pathlib.Path(path)
        if int(flush_rows) < 1 or not flush_seconds >= 0 or int(chunk_steps) < 1:
            raise InvalidBatchError(
                f"metric store {self.path}: flush_rows={flush_rows!r}, flush_seconds={flush_seconds!r}, "
                f"chunk_steps={chunk_steps!r}; expected integers >= 1 and seconds >= 0"
            )
        self.flush_rows = int(flush_rows)
        self.flush_seconds = float(flush_seconds)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(self.path / WRITER_LOCK, f"metric store {self.path}")
        try:
            if (self.path / INDEX).exists():
                self._index = _load_index(self.path)
                if run is not None and self._index.get("run") not in (None, run):
                    raise IncompatibleStoreError(
                        f"metric store {self.path}: belongs to run {self._index.get('run')!r}; given run {run!r}"
                    )
                self._group = zarr.open_group(str(self.path), mode="r+", zarr_format=3)
            else:
                self._group = zarr.open_group(str(self.path), mode="a", zarr_format=3)
                c = int(chunk_steps)
                self._group.create_array("step", shape=(CAPACITY,), dtype="int64", chunks=(c,), fill_value=-1,
                                         compressors=None)
                self._group.create_array("wall_time", shape=(CAPACITY,), dtype="float64", chunks=(c,),
                                         fill_value=math.nan, compressors=None)
                self._index = {"format": FORMAT, "kind": KIND, "run": run, "rows": 0, "chunk_steps": c,
                               "series": {}, "last_step": None, "created": time.time()}
                atomic_write_json(self.path / INDEX, self._index)
        except BaseException:
            self._lock.release()
            raise
        self._rows: list[tuple[int, float, dict[str, np.ndarray]]] = []
        self._oldest = 0.0
        self._last_step: int | None = self._index.get("last_step")

    @property
    def last_step(self) -> int | None:
        """The step of the newest row (buffered or committed), or ``None`` for an empty store."""
        return self._last_step

    @property
    def rows(self) -> int:
        """Rows committed to the store (buffered rows not included)."""
        return int(self._index["rows"])

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return not self._lock.held

    def append(self, step: int, **values: float | np.ndarray) -> None:
        """Buffer one row: the values of some named series at ``step`` (strictly increasing).

        Scalars and arrays are stored as float64; a series keeps the shape it first had. Series not
        given in this row read as NaN at this step. Raises :class:`InvalidBatchError` /
        :class:`InvalidShapeError` without buffering anything when the row is unusable.
        """
        if self.closed:
            raise LifecycleError(f"metric store {self.path}: writer is closed; expected an open writer")
        step = int(step)
        if self._last_step is not None and step <= self._last_step:
            raise InvalidBatchError(
                f"metric store {self.path}: step {step} after step {self._last_step}; expected increasing steps"
            )
        row: dict[str, np.ndarray] = {}
        for name, v in values.items():
            try:
                a = np.asarray(v, dtype=np.float64)
            except (TypeError, ValueError):
                raise InvalidBatchError(
                    f"metric store {self.path}, series {name!r}: got {type(v).__name__}; expected a number or array"
                ) from None
            known = self._pending_shape(name)
            if known is not None and list(a.shape) != list(known):
                raise InvalidShapeError(
                    f"metric store {self.path}, series {name!r}: shape {a.shape}; expected {tuple(known)}"
                )
            row[name] = a
        if not self._rows:
            self._oldest = time.monotonic()
        self._rows.append((step, time.time(), row))
        self._last_step = step
        if len(self._rows) >= self.flush_rows or time.monotonic() - self._oldest >= self.flush_seconds:
            self.flush()

    def _pending_shape(self, name: str) -> list[int] | None:
        entry = self._index["series"].get(name)
        if entry is not None:
            return list(entry["shape"])
        for _, _, row in self._rows:
            if name in row:
                return list(row[name].shape)
        return None

    def flush(self) -> int:
        """Write the buffered rows and commit them; return how many were written."""
        if not self._rows:
            return 0
        rows, self._rows = self._rows, []
        start, n = self.rows, len(rows)
        c = int(self._index["chunk_steps"])
        series = dict(self._index["series"])
        for _, _, row in rows:
            for name, a in row.items():
                if name not in series:
                    path = f"series/{len(series)}"
                    dims = [f"{name}_dim{i}" if i else f"{name}_dim" for i in range(a.ndim)]
                    self._group.create_array(path, shape=(CAPACITY, *a.shape), dtype="float64",
                                             chunks=(c, *a.shape), fill_value=math.nan, compressors=None)
                    series[name] = {"path": path, "shape": list(a.shape), "dims": dims}
        region = slice(start, start + n)
        self._array("step")[region] = np.array([r[0] for r in rows], dtype=np.int64)
        self._array("wall_time")[region] = np.array([r[1] for r in rows], dtype=np.float64)
        for name, entry in series.items():
            if not any(name in r[2] for r in rows):
                continue
            block = np.full((n, *entry["shape"]), math.nan)
            for i, (_, _, row) in enumerate(rows):
                if name in row:
                    block[i] = row[name]
            self._array(entry["path"])[region] = block
        self._index = {**self._index, "series": series, "rows": start + n, "last_step": rows[-1][0],
                       "updated": time.time()}
        atomic_write_json(self.path / INDEX, self._index)
        return n

    def _array(self, name: str) -> zarr.Array:
        node = self._group[name]
        if not isinstance(node, zarr.Array):
            raise CorruptStoreError(f"metric store {self.path}: {name} is not an array")
        return node

    def close(self) -> None:
        """Flush what is buffered and release the store (idempotent)."""
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self._lock.release()

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_metrics(path: str | os.PathLike[str]) -> xr.Dataset:
    """Read a metric store as an :class:`xarray.Dataset` over ``step``; safe while a writer appends.

    Returns
    -------
    xarray.Dataset
        Coordinate ``step`` (int64) and ``wall_time``; one float64 variable per series (vector series
        get ``<name>_dim`` dims); attrs ``run`` and ``rows``.

    Raises
    ------
    StoreNotFoundError, IncompatibleStoreError, CorruptStoreError
    """
    p = pathlib.Path(path)
    idx = _load_index(p)
    n = int(idx["rows"])
    try:
        group = zarr.open_group(str(p), mode="r", zarr_format=3)
        steps = np.asarray(group["step"][:n])  # type: ignore[index]
        wall = np.asarray(group["wall_time"][:n])  # type: ignore[index]
        data = {
            name: (("step", *e["dims"]), np.asarray(group[e["path"]][:n]))  # type: ignore[index]
            for name, e in idx["series"].items()
        }
    except Exception as exc:
        raise CorruptStoreError(f"metric store {p}: cannot read {n} committed rows: {exc}") from exc
    if n and (steps < 0).any():
        raise CorruptStoreError(f"metric store {p}: {int((steps < 0).sum())} of {n} committed rows are missing")
    return xr.Dataset(
        data,
        coords={"step": steps, "wall_time": ("step", wall)},
        attrs={"run": idx.get("run") or "", "rows": n},
    )


def series_names(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """The committed series of a metric store, with their shapes and dims, without reading values."""
    return dict(_load_index(pathlib.Path(path))["series"])
