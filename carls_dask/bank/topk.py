"""Exact top-k by dot product or cosine similarity over one vector column, with an optional FAISS backend.

A pure module (no Dask, no I/O): :meth:`carls_dask.bank.core.ShardCore.top_k` validates the call and
hands the shard's used rows to :func:`exact_top_k`. Two backends give the same answer:

``"numpy"``
    The rows are scored in chunks of :data:`CHUNK_ROWS` (``query @ chunk.T``) and the best ``k`` of the
    running candidates are kept with ``argpartition`` after each chunk, so memory stays at
    ``q x (CHUNK_ROWS + k)`` scores whatever the table size.
``"faiss"``
    An exact flat inner-product index (``faiss.IndexFlatIP``, float32) built from the rows on each call
    and dropped afterwards (no state is kept between calls). FAISS is optional:
    ``pip install 'carls-dask[faiss]'``.
``"auto"``
    FAISS when it is installed, the table holds at least :data:`FAISS_MIN_ROWS` rows and the query at least
    :data:`FAISS_MIN_QUERIES` rows, else NumPy. For a few query rows FAISS scores without BLAS, one query
    at a time, and the index is built on each call, so it pays only for large tables and query batches
    (``benchmarks/top_k.py`` compares the two; the thresholds come from its figures in ``docs/scaling.md``).

Both backends return ``(keys[q, k'], scores[q, k'])`` best first with ties broken by the smaller key, where
``k' = min(k, usable rows)``; under cosine a row whose norm is below :data:`MIN_NORM` is not usable. The
scores of the two backends agree to float32 rounding (about 1e-6 relative); both are exact searches.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from types import ModuleType

import numpy as np

from carls_dask.errors import ConfigError, InvalidBatchError, InvalidShapeError

__all__ = [
    "BACKENDS",
    "CHUNK_ROWS",
    "FAISS_MIN_QUERIES",
    "FAISS_MIN_ROWS",
    "METRICS",
    "MIN_NORM",
    "exact_top_k",
    "faiss_available",
]

logger = logging.getLogger(__name__)

METRICS = ("dot", "cosine")
BACKENDS = ("auto", "numpy", "faiss")
#: Rows scored at once by the NumPy backend (and added at once to a FAISS index).
CHUNK_ROWS = 65536
#: Under ``"auto"``, FAISS is used from this many table rows on (see ``benchmarks/top_k.py``).
FAISS_MIN_ROWS = 50_000
#: Under ``"auto"``, FAISS is used from this many query rows on (where it was faster in ``benchmarks/top_k.py``).
FAISS_MIN_QUERIES = 256
#: Under cosine, rows whose L2 norm is below this are not usable (they have no direction).
MIN_NORM = 1e-6
#: Floor of the query norm under cosine (a zero query scores 0 against every row).
_QUERY_NORM_FLOOR = 1e-12


@functools.cache
def _faiss() -> ModuleType | None:
    """The ``faiss`` module, imported on first use, or None when it is not installed."""
    try:
        import faiss
    except (ImportError, OSError) as exc:  # OSError: a wheel whose shared library cannot be loaded
        logger.debug("faiss is not usable (%s); top-k runs on NumPy", exc)
        return None
    return faiss


def faiss_available() -> bool:
    """Whether the optional ``faiss`` package can be imported.

    Returns
    -------
    bool
        True when ``import faiss`` works (``pip install 'carls-dask[faiss]'``).
    """
    return _faiss() is not None


def exact_top_k(
    vectors: np.ndarray,
    keys: np.ndarray,
    query: np.ndarray,
    k: int,
    metric: str = "dot",
    backend: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k rows of ``vectors`` for each query row, by dot product or cosine similarity.

    Parameters
    ----------
    vectors
        ``[n, d]`` float rows (any float dtype; scored in float32). ``n`` may be 0.
    keys
        ``[n]`` unique integer keys of the rows.
    query
        ``[q, d]`` finite query rows, ``q > 0`` (validated by the caller; cast to float32 here).
    k
        Rows wanted per query, a positive int.
    metric
        ``"dot"`` or ``"cosine"``. Under cosine the rows and the query are L2-normalised and rows with a
        norm below :data:`MIN_NORM` are left out.
    backend
        ``"numpy"``, ``"faiss"`` or ``"auto"`` (FAISS when installed, with at least
        :data:`FAISS_MIN_ROWS` rows and :data:`FAISS_MIN_QUERIES` query rows).

    Returns
    -------
    tuple of numpy.ndarray
        ``(keys[q, k'], scores[q, k'])`` best first, ties broken by the smaller key, with
        ``k' = min(k, usable rows)``; ``scores`` are float32 and ``keys`` have the dtype of ``keys``.

    Raises
    ------
    InvalidBatchError
        An unknown ``metric`` or ``backend``, or ``k`` not a positive int.
    InvalidShapeError
        ``vectors``, ``keys`` and ``query`` do not fit together.
    ConfigError
        ``backend="faiss"`` but FAISS is not installed.
    """
    if metric not in METRICS:
        raise InvalidBatchError(f"top_k: metric {metric!r} is unknown; expected one of {METRICS}")
    if backend not in BACKENDS:
        raise InvalidBatchError(f"top_k: backend {backend!r} is unknown; expected one of {BACKENDS}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or int(k) <= 0:
        raise InvalidBatchError(f"top_k: k must be a positive int, got {k!r}")
    k = int(k)
    vectors = np.asarray(vectors)
    keys = np.asarray(keys)
    q = np.asarray(query, dtype=np.float32)
    if vectors.ndim != 2 or keys.shape != (vectors.shape[0],):
        raise InvalidShapeError(
            f"top_k: vectors of shape {vectors.shape} and keys of shape {keys.shape}; expected [n, d] and [n]"
        )
    if q.ndim != 2 or q.shape[1] != vectors.shape[1] or q.shape[0] == 0:
        raise InvalidShapeError(f"top_k: query has shape {q.shape}; expected (q>0, {vectors.shape[1]})")
    if metric == "cosine":
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), _QUERY_NORM_FLOOR)
    if backend == "faiss" and not faiss_available():
        raise ConfigError(
            "top_k: backend 'faiss' needs the faiss-cpu package, which is not installed; "
            "expected it installed (pip install 'carls-dask[faiss]') or backend 'numpy' or 'auto'"
        )
    if backend == "auto":
        big = vectors.shape[0] >= FAISS_MIN_ROWS and q.shape[0] >= FAISS_MIN_QUERIES
        backend = "faiss" if big and faiss_available() else "numpy"
    logger.debug("top_k: %d rows x %d queries, k=%d, %s, backend %s", vectors.shape[0], q.shape[0], k, metric, backend)
    if backend == "faiss":
        return _faiss_top_k(vectors, keys, q, k, metric)
    return _numpy_top_k(vectors, keys, q, k, metric)


def _usable_chunks(vectors: np.ndarray, keys: np.ndarray, metric: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(float32 rows, keys)`` per chunk: under cosine only the usable rows, L2-normalised."""
    for lo in range(0, vectors.shape[0], CHUNK_ROWS):
        hi = min(vectors.shape[0], lo + CHUNK_ROWS)
        e = vectors[lo:hi].astype(np.float32, copy=False)
        ks = keys[lo:hi]
        if metric == "cosine":
            norms = np.linalg.norm(e, axis=1)
            ok = norms >= MIN_NORM
            e = e[ok] / norms[ok, None]
            ks = ks[ok]
        if ks.size:
            yield e, ks


def _best_first(keys: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order each row's candidates by descending score, then ascending key."""
    if scores.shape[1] == 0:
        return keys, scores
    order = np.lexsort((keys, -scores), axis=1)
    return np.take_along_axis(keys, order, axis=1), np.take_along_axis(scores, order, axis=1)


def _keep_best(cand_k: np.ndarray, cand_s: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``min(k, candidates)`` of each row (unordered), ties at the cut going to the smaller key.

    ``argpartition`` picks an arbitrary subset of the rows tied at the k-th score; a row where more
    candidates than ``k`` reach that score is resolved with a full sort of that row alone.
    """
    kk = min(k, cand_s.shape[1])
    if kk == cand_s.shape[1]:
        return cand_k, cand_s
    part = np.argpartition(-cand_s, kk - 1, axis=1)[:, :kk]
    best_s = np.take_along_axis(cand_s, part, axis=1)
    best_k = np.take_along_axis(cand_k, part, axis=1)
    kth = best_s.min(axis=1)
    for r in np.flatnonzero((cand_s >= kth[:, None]).sum(axis=1) > kk):
        order = np.lexsort((cand_k[r], -cand_s[r]))[:kk]
        best_s[r], best_k[r] = cand_s[r, order], cand_k[r, order]
    return best_k, best_s


def _numpy_top_k(
    vectors: np.ndarray, keys: np.ndarray, q: np.ndarray, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """Chunked NumPy scoring with a running ``argpartition`` merge (``q`` already normalised for cosine)."""
    best_s = np.full((q.shape[0], 0), -np.inf, dtype=np.float32)
    best_k = np.zeros((q.shape[0], 0), dtype=keys.dtype)
    for e, ks in _usable_chunks(vectors, keys, metric):
        s = q @ e.T
        cand_s = np.concatenate([best_s, s], axis=1)
        cand_k = np.concatenate([best_k, np.broadcast_to(ks, s.shape)], axis=1)
        best_k, best_s = _keep_best(cand_k, cand_s, k)
    return _best_first(best_k, best_s)


def _faiss_top_k(
    vectors: np.ndarray, keys: np.ndarray, q: np.ndarray, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """Exact search of a flat inner-product FAISS index built from the usable rows for this call only.

    The index is asked for ``k' + 1`` results so that a tie across the cut is seen: such a query row (and
    any row where FAISS returned the ``-1`` id of a missing result) is answered by the NumPy backend
    instead, so ties go to the smaller key exactly as there.
    """
    faiss = _faiss()
    assert faiss is not None  # checked by exact_top_k
    index = faiss.IndexFlatIP(vectors.shape[1])
    parts = []
    for e, ks in _usable_chunks(vectors, keys, metric):
        index.add(np.ascontiguousarray(e, dtype=np.float32))
        parts.append(ks)
    n = int(index.ntotal)
    kk = min(k, n)
    if kk == 0:
        return np.zeros((q.shape[0], 0), dtype=keys.dtype), np.zeros((q.shape[0], 0), dtype=np.float32)
    usable_keys = np.concatenate(parts)
    ask = min(kk + 1, n)
    scores, ids = index.search(np.ascontiguousarray(q), ask)
    index.reset()
    redo = (ids[:, :kk] < 0).any(axis=1)
    if ask > kk:
        redo |= scores[:, kk] >= scores[:, kk - 1]
    ids, scores = ids[:, :kk], scores[:, :kk].astype(np.float32, copy=False)
    out_k, out_s = _best_first(usable_keys[np.where(ids < 0, 0, ids)], scores)
    if redo.any():
        rows = np.flatnonzero(redo)
        logger.debug("top_k: %d of %d query rows tie across the cut; answered by NumPy", rows.size, q.shape[0])
        out_k[rows], out_s[rows] = _numpy_top_k(vectors, keys, q[rows], k, metric)
    return out_k, out_s
