"""Approximate top-k of one shard: a FAISS inverted-file index (``IndexIVFFlat``) kept current as rows change.

The index holds one vector column of one table under one metric, with the row *keys* as FAISS ids
(keys do not move when a delete compacts the rows). The shard tells it which keys were written or
deleted (:meth:`AnnIndex.touch`, ``O(batch)``); before the next query it takes those keys out of the
index (``remove_ids``) and adds the present ones again with their current vectors (``add_with_ids``),
so a query always searches the table as it is. The scores returned are the exact inner products of
the vectors found (``IndexIVFFlat`` stores them uncompressed); only *which* rows are found is
approximate (the ``nprobe`` nearest of ``nlist`` cells are scanned).

The index is trained (k-means over a sample of the rows) and filled in full, reading the column in
chunks, when it is first queried, when the table has grown to ``retrain_growth`` times the rows it
was trained on (cells fill up and the centroids no longer fit), and when more keys were touched
since the last query than ``pending_fraction`` of the rows (re-adding them would cost about as much as a
rebuild, and keeping the list would cost memory).

IVF rather than HNSW: ``IndexHNSWFlat`` cannot remove vectors, so every delete or gradient step would
need a rebuild. Under ``cosine`` vectors are L2-normalised and rows below
:data:`carls_dask.bank.topk.MIN_NORM` are left out, as in the exact search.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from carls_dask.bank.topk import CHUNK_ROWS, MIN_NORM, _best_first, _faiss
from carls_dask.errors import ConfigError

__all__ = ["METHODS", "AnnIndex", "AnnSettings"]

logger = logging.getLogger(__name__)

METHODS = ("exact", "ivf")
#: k-means training points per cell (FAISS warns below 39).
_TRAIN_PER_LIST = 64


@dataclasses.dataclass(frozen=True)
class AnnSettings:
    """Shape and upkeep of the per-shard IVF index (``carls.bank.ann.*``).

    Attributes
    ----------
    nlist
        Cells of the inverted file; 0 picks ``sqrt(rows)`` (at most ``rows / 39``, at least 1).
    nprobe
        Cells scanned per query.
    retrain_growth
        Retrain and refill when the table holds this many times the rows the index was trained on.
    pending_fraction
        Refill in full instead of updating when more keys than this fraction of the rows were touched.
    """

    nlist: int = 0
    nprobe: int = 32
    retrain_growth: float = 4.0
    pending_fraction: float = 0.5

    def __post_init__(self) -> None:
        for name, lo in (("nlist", 0), ("nprobe", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
                raise ConfigError(f"AnnSettings.{name} must be an int >= {lo}, got {v!r}")
        for name in ("retrain_growth", "pending_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"AnnSettings.{name} must be a finite number > 0, got {v!r}")


def _prepare(e: np.ndarray, ks: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """float32 rows (normalised under cosine, unusable rows dropped) and their keys."""
    e = np.ascontiguousarray(e, dtype=np.float32)
    if metric == "cosine":
        norms = np.linalg.norm(e, axis=1)
        ok = norms >= MIN_NORM
        e = np.ascontiguousarray(e[ok] / norms[ok, None])
        ks = ks[ok]
    return e, np.ascontiguousarray(ks, dtype=np.int64)


class AnnIndex:
    """An IVF index over one column of one table of a shard, under one metric.

    Parameters
    ----------
    dim
        Vector width.
    metric
        ``"dot"`` or ``"cosine"``.
    settings
        Shape and upkeep.

    Raises
    ------
    ConfigError
        FAISS is not installed.
    """

    def __init__(self, dim: int, metric: str, settings: AnnSettings) -> None:
        if _faiss() is None:
            raise ConfigError("top_k: method 'ivf' needs the faiss-cpu package, which is not installed; "
                              "expected it installed (pip install 'carls-dask[faiss]') or method 'exact'")
        self.dim = int(dim)
        self.metric = metric
        self.settings = settings
        self.index: Any = None
        self.trained_rows = 0
        self.pending: list[np.ndarray] = []
        self.pending_count = 0
        self.builds = 0
        self.updates = 0

    @property
    def nbytes(self) -> int:
        """Approximate bytes held by the index (vectors and ids)."""
        return 0 if self.index is None else int(self.index.ntotal) * (4 * self.dim + 8)

    def touch(self, keys: np.ndarray, rows: int) -> None:
        """Note keys written or deleted (``rows``: the table's rows now)."""
        if self.index is None:
            return
        self.pending.append(np.array(keys, dtype=np.int64, copy=True))
        self.pending_count += int(np.size(keys))
        if self.pending_count > self.settings.pending_fraction * max(rows, 1):
            self.drop()

    def drop(self) -> None:
        """Forget the index (rebuilt on the next query)."""
        self.index = None
        self.pending = []
        self.pending_count = 0

    def _build(self, read: Callable[[int, int], np.ndarray], gather: Callable[[np.ndarray], np.ndarray],
               keys: np.ndarray, n: int) -> None:
        faiss = _faiss()
        assert faiss is not None
        nlist = self.settings.nlist or int(math.sqrt(max(n, 1)))
        nlist = max(1, min(nlist, n // 39 if n >= 39 else 1))
        rng = np.random.default_rng(0)
        want = min(n, nlist * _TRAIN_PER_LIST)
        sample = np.unique(rng.integers(0, n, size=want)) if want < n else np.arange(n)
        train, _ = _prepare(gather(sample), keys[sample], self.metric)
        quantizer = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.min_points_per_centroid = 1  # small tables: no warning, the cells are just coarse
        if train.shape[0] == 0:
            train = np.zeros((1, self.dim), dtype=np.float32)
        index.train(train)
        self._quantizer = quantizer  # kept alive with the index
        for lo in range(0, n, CHUNK_ROWS):
            hi = min(n, lo + CHUNK_ROWS)
            e, ks = _prepare(read(lo, hi), keys[lo:hi], self.metric)
            if ks.size:
                index.add_with_ids(e, ks)
        index.nprobe = min(self.settings.nprobe, nlist)
        self.index = index
        self.trained_rows = n
        self.pending = []
        self.pending_count = 0
        self.builds += 1
        logger.debug("ivf index built over %d rows, nlist %d (build %d)", n, nlist, self.builds)

    def refresh(self, read: Callable[[int, int], np.ndarray], gather: Callable[[np.ndarray], np.ndarray],
                find: Callable[[np.ndarray], np.ndarray], keys: np.ndarray, n: int) -> None:
        """Bring the index up to date with the table (see the module notes for when it is rebuilt).

        Parameters
        ----------
        read
            ``read(i, j)``: the column's rows ``i..j-1`` (a copy).
        gather
            ``gather(rows)``: the column's rows at ``rows``.
        find
            ``find(keys)``: the rows of ``keys`` (-1 where absent).
        keys
            Per-row keys (rows ``0..n-1`` live).
        n
            Live rows.
        """
        if self.index is None or n > self.settings.retrain_growth * max(self.trained_rows, 1):
            self._build(read, gather, keys, n)
            return
        if not self.pending:
            return
        faiss = _faiss()
        assert faiss is not None
        touched = np.unique(np.concatenate(self.pending))
        self.pending = []
        self.pending_count = 0
        self.index.remove_ids(faiss.IDSelectorBatch(touched))
        rows = find(touched)
        present = rows >= 0
        if present.any():
            e, ks = _prepare(gather(rows[present]), touched[present], self.metric)
            if ks.size:
                self.index.add_with_ids(e, ks)
        self.updates += 1

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(keys[q, k'], scores[q, k'], short)`` best first; ``short`` marks query rows that found fewer
        than ``k'`` rows (the caller answers them exactly). ``k' = min(k, indexed rows)``."""
        assert self.index is not None
        kk = min(int(k), int(self.index.ntotal))
        if kk == 0:
            return (np.zeros((q.shape[0], 0), dtype=np.int64), np.zeros((q.shape[0], 0), dtype=np.float32),
                    np.zeros(q.shape[0], dtype=bool))
        scores, ids = self.index.search(np.ascontiguousarray(q, dtype=np.float32), kk)
        short = (ids < 0).any(axis=1)
        out_k, out_s = _best_first(np.where(ids < 0, np.iinfo(np.int64).max, ids),
                                   np.where(ids < 0, -np.inf, scores).astype(np.float32))
        return out_k, out_s, short

