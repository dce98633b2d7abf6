"""Embedding drift between bank snapshots: per-shard change statistics, neighbour churn, aligned 2-D maps.

Every function takes snapshot datasets of one bank table (see :mod:`carls_dask.dashboards.bankdata`) and returns
numbers or small :class:`xarray.Dataset` objects; none of them plots or reads a store.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import xarray as xr

from carls_dask.dashboards.bankdata import column, common_rows, has_column, keys_of, shards_of, stable_sample
from carls_dask.errors import InvalidBatchError, InvalidShapeError

__all__ = [
    "COLOURINGS",
    "PERCENTILES",
    "PROVENANCE",
    "aligned_projection",
    "attach",
    "colour_categories",
    "drift_over_snapshots",
    "drift_stats",
    "knn",
    "neighbour_churn",
    "pca_2d",
    "predictions",
    "procrustes_rotation",
]

#: Percentiles of the per-row change that :func:`drift_stats` reports.
PERCENTILES = (50, 90, 99)

#: What a map can be coloured by: its label on the page and the projection variable holding it.
COLOURINGS = {"true class": "truth", "pseudo label": "pseudo_label", "model prediction": "prediction", "difficulty": "difficulty"}
#: The provenance a projection carries for each row (shown when hovering a point).
PROVENANCE = ("maker", "model_step", "wall_time")
#: Difficulty is shown in this many quantile bins (light: easy, dark: hard).
DIFFICULTY_BINS = 6


def _matrix(ds: xr.Dataset, name: str) -> np.ndarray:
    x = np.asarray(column(ds, name), dtype=np.float64)
    if x.ndim != 2:
        raise InvalidShapeError(f"column {name!r}: expected rows of vectors (2-D), got shape {x.shape}")
    return x


def _cosine_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    denom = na * nb
    dot = np.einsum("ij,ij->i", a, b)
    cos = np.divide(dot, denom, out=np.ones_like(dot), where=denom > 0)
    return 1.0 - np.clip(cos, -1.0, 1.0)


def drift_stats(before: xr.Dataset, after: xr.Dataset, column_name: str = "embedding") -> xr.Dataset:
    """Per-shard change of an embedding column between two snapshots.

    Rows are matched by key; rows present in only one snapshot are ignored.

    Parameters
    ----------
    before, after
        Two snapshots of the same table.
    column_name
        The vector column to compare.

    Returns
    -------
    xarray.Dataset
        Dimension ``shard`` (the shards of ``after``'s rows, plus ``-1`` for all rows together) with
        variables ``rows``, ``l2_mean``, ``l2_p50``, ``l2_p90``, ``l2_p99``, ``cos_mean``, ``cos_p50``,
        ``cos_p90``, ``cos_p99``. Statistics of a shard with no common rows are NaN.
    """
    a, b = _matrix(before, column_name), _matrix(after, column_name)
    if a.shape[1:] != b.shape[1:]:
        raise InvalidShapeError(
            f"column {column_name!r}: snapshots have different widths, {a.shape[1:]} before and {b.shape[1:]} after"
        )
    _, ia, ib = common_rows(before, after)
    l2 = np.linalg.norm(b[ib] - a[ia], axis=1)
    cos = _cosine_distance(a[ia], b[ib])
    shard = shards_of(after)[ib]
    shard_ids = [-1, *sorted(int(s) for s in np.unique(shards_of(after)))]
    out: dict[str, list[float]] = {"rows": []}
    for kind in ("l2", "cos"):
        out[f"{kind}_mean"] = []
        for p in PERCENTILES:
            out[f"{kind}_p{p}"] = []
    for s in shard_ids:
        sel = np.ones(l2.shape, bool) if s == -1 else shard == s
        out["rows"].append(float(sel.sum()))
        for kind, vals in (("l2", l2[sel]), ("cos", cos[sel])):
            empty = vals.size == 0
            out[f"{kind}_mean"].append(np.nan if empty else float(vals.mean()))
            for p in PERCENTILES:
                out[f"{kind}_p{p}"].append(np.nan if empty else float(np.percentile(vals, p)))
    return xr.Dataset({k: ("shard", np.asarray(v)) for k, v in out.items()}, coords={"shard": shard_ids})


def drift_over_snapshots(
    snapshots: Sequence[tuple[int, xr.Dataset]], column_name: str = "embedding"
) -> xr.Dataset | None:
    """Drift between each pair of consecutive snapshots, indexed by the later snapshot's step.

    Parameters
    ----------
    snapshots
        ``(step, dataset)`` pairs in increasing step order.

    Returns
    -------
    xarray.Dataset or None
        :func:`drift_stats` stacked along a ``step`` dimension, or ``None`` with fewer than two snapshots.
    """
    if len(snapshots) < 2:
        return None
    parts = []
    for (_, prev), (step, cur) in itertools.pairwise(snapshots):
        parts.append(drift_stats(prev, cur, column_name).expand_dims(step=[step]))
    return xr.concat(parts, dim="step", join="outer")


def knn(x: np.ndarray, queries: np.ndarray, k: int, block: int | None = None) -> np.ndarray:
    """Indices of the ``k`` nearest rows of ``x`` (Euclidean) to each row of ``x[queries]``, self excluded.

    Works in blocks of queries so memory stays ``block * len(x)`` distances (by default about 8M,
    64 MB, whatever the table size).
    """
    n = x.shape[0]
    if not 0 < k < n:
        raise InvalidBatchError(f"knn: expected 0 < k < rows ({n}), got k={k}")
    if block is None:
        block = max(1, 8_000_000 // n)
    sq = np.einsum("ij,ij->i", x, x)
    out = np.empty((queries.size, k), dtype=np.int64)
    for start in range(0, queries.size, block):
        q = queries[start : start + block]
        # |q|^2 is the same along a row, so it does not change the ranking: left out. In place, to keep
        # one block-sized temporary (memory traffic, not arithmetic, is what this costs).
        d = x[q] @ x.T
        d *= -2.0
        d += sq[None, :]
        d[np.arange(q.size), q] = np.inf
        part = np.argpartition(d, k - 1, axis=1)[:, :k]
        out[start : start + block] = part
    return out


def neighbour_churn(
    before: xr.Dataset,
    after: xr.Dataset,
    k: int = 10,
    queries: int = 500,
    column_name: str = "embedding",
    candidates: int = 20_000,
) -> float:
    """Fraction of the ``k`` nearest neighbours that changed between two snapshots.

    Neighbours are searched among the rows both snapshots share (a stable sample of ``candidates`` of
    them in a bigger table, so the cost stops growing with the table: the same rows in both
    snapshots, and in every later pair); the same query rows (a stable sample of those) are used in
    both. 0 means identical neighbourhoods, 1 means none kept.

    Returns
    -------
    float
        ``1 - mean(|N_before(q) & N_after(q)| / k)`` over the query rows; NaN with ``k + 1`` shared rows or fewer.
    """
    keys, ia, ib = common_rows(before, after)
    if keys.size <= k:
        return float("nan")
    rows = stable_sample(keys, candidates)
    keys, ia, ib = keys[rows], ia[rows], ib[rows]
    a = _matrix(before, column_name)[ia]
    b = _matrix(after, column_name)[ib]
    q = stable_sample(keys, queries)
    na, nb = knn(a, q, k), knn(b, q, k)
    kept = np.array([np.intersect1d(ra, rb).size for ra, rb in zip(na, nb, strict=True)], dtype=np.float64)
    return float(1.0 - kept.mean() / k)


def pca_2d(x: np.ndarray) -> np.ndarray:
    """Project rows onto their first two principal components (centred), with a deterministic sign."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise InvalidShapeError(f"pca_2d: expected at least two rows of vectors, got shape {x.shape}")
    xc = x - x.mean(axis=0)
    if x.shape[1] <= x.shape[0]:
        # Eigenvectors of the (d x d) scatter matrix: the same axes as an SVD of the rows, at a small
        # fraction of its cost for tall tables (100k rows x 64 dims: milliseconds instead of seconds).
        _, vecs = np.linalg.eigh(xc.T @ xc)
        comps = vecs[:, ::-1][:, :2].T
    else:
        _, _, vt = np.linalg.svd(xc, full_matrices=False)
        comps = vt[:2]
    if comps.shape[0] < 2:  # one-dimensional data: pad the second axis with zeros
        comps = np.vstack([comps, np.zeros_like(comps)])
    proj = xc @ comps.T
    # Fix each axis's sign so that its largest-magnitude coordinate is positive.
    for j in range(2):
        i = np.argmax(np.abs(proj[:, j]))
        if proj[i, j] < 0:
            proj[:, j] = -proj[:, j]
    return proj


def procrustes_rotation(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Orthogonal matrix ``R`` minimising ``||source @ R - target||`` (both centred by the caller)."""
    if source.shape != target.shape:
        raise InvalidShapeError(f"procrustes: shapes differ, {source.shape} and {target.shape}")
    u, _, vt = np.linalg.svd(source.T @ target)
    return u @ vt


def aligned_projection(
    ds: xr.Dataset,
    previous: xr.Dataset | None = None,
    sample: int = 100_000,
    column_name: str = "embedding",
    label: str | None = "pseudo_label",
) -> xr.Dataset:
    """2-D projection of a stable sample of a snapshot's embeddings, aligned to the previous projection.

    The projection is PCA of the sampled rows; when ``previous`` (an earlier result of this function)
    is given, it is then rotated/reflected by orthogonal Procrustes on the keys both share, and
    re-centred onto the previous one, so that successive maps do not spin or flip.

    Returns
    -------
    xarray.Dataset
        Dimension ``key``, variables ``x``, ``y`` and ``label`` (``-1`` where the table has no label).
    """
    keys = keys_of(ds)
    rows = stable_sample(keys, sample)
    x = _matrix(ds, column_name)[rows]
    proj = pca_2d(x)
    if previous is not None and previous.sizes.get("key", 0) >= 2:
        kp = np.asarray(previous["key"].values, dtype=np.int64)
        common, ic, ip = np.intersect1d(keys[rows], kp, return_indices=True)
        if common.size >= 3:
            src = proj[ic]
            tgt = np.column_stack([previous["x"].values[ip], previous["y"].values[ip]])
            src_c, tgt_c = src.mean(axis=0), tgt.mean(axis=0)
            r = procrustes_rotation(src - src_c, tgt - tgt_c)
            proj = (proj - src_c) @ r + tgt_c
    if label and has_column(ds, label):
        lab = np.asarray(column(ds, label))[rows].astype(np.int64)
    else:
        lab = np.full(rows.size, -1, dtype=np.int64)
    out = xr.Dataset(
        {"x": ("key", proj[:, 0]), "y": ("key", proj[:, 1]), "label": ("key", lab)},
        coords={"key": keys[rows]},
    )
    for name in PROVENANCE:
        if has_column(ds, name):
            out[name] = ("key", np.asarray(column(ds, name))[rows])
    return out


def predictions(ds: xr.Dataset) -> np.ndarray | None:
    """The model's predicted class of every row: a ``prediction`` column, else the arg-max of a ``logits`` column.

    Returns ``None`` when the table has neither.
    """
    if has_column(ds, "prediction"):
        return np.asarray(column(ds, "prediction"), dtype=np.int64)
    if has_column(ds, "logits"):
        logits = np.asarray(column(ds, "logits"), dtype=np.float64)
        if logits.ndim == 2 and logits.shape[1] > 0:
            return logits.argmax(axis=1).astype(np.int64)
    return None


def attach(proj: xr.Dataset, name: str, keys: np.ndarray, values: np.ndarray) -> xr.Dataset:
    """``proj`` with a variable ``name`` holding ``values`` (given for ``keys``) at each of its rows, matched by key.

    Rows whose key is not among ``keys`` get ``-1`` (integer values) or NaN (floating-point values).
    """
    keys = np.asarray(keys, dtype=np.int64)
    values = np.asarray(values)
    if keys.shape != values.shape[:1]:
        raise InvalidShapeError(f"attach {name!r}: {keys.shape[0]} keys but {values.shape[0]} values; expected one value per key")
    floating = values.dtype.kind == "f"
    out = np.full(proj.sizes["key"], np.nan if floating else -1, dtype=np.float64 if floating else np.int64)
    pk = np.asarray(proj["key"].values, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    pos = np.clip(np.searchsorted(sk, pk), 0, max(sk.size - 1, 0))
    if sk.size:
        hit = sk[pos] == pk
        out[hit] = values[order[pos[hit]]]
    return proj.assign({name: ("key", out)})


def colour_categories(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The colour category of every row of a map, and the categories' names in order.

    Integer values (classes) keep one category per class that occurs, in increasing order, with
    ``-1`` (no class) as category ``-1`` named ``"none"``; floating-point values (difficulty) fall
    into up to :data:`DIFFICULTY_BINS` quantile bins named by their range, NaN as ``-1``.

    Returns
    -------
    codes, names
        ``int64`` category of every row (``-1``: none) and the name of categories ``0, 1, ...``.
    """
    v = np.asarray(values)
    if v.dtype.kind in "iub":
        v = v.astype(np.int64)
        classes = np.unique(v[v >= 0])
        codes = np.where(v >= 0, np.searchsorted(classes, v), -1)
        return codes.astype(np.int64), [str(int(c)) for c in classes]
    v = v.astype(np.float64)
    ok = np.isfinite(v)
    if not ok.any():
        return np.full(v.size, -1, np.int64), []
    edges = np.unique(np.quantile(v[ok], np.linspace(0.0, 1.0, DIFFICULTY_BINS + 1)))
    if edges.size < 2:
        edges = np.array([edges[0], edges[0]])
    inner = edges[1:-1]
    codes = np.where(ok, np.searchsorted(inner, np.where(ok, v, 0.0), side="right"), -1)
    names = [f"{lo:.3g} to {hi:.3g}" for lo, hi in itertools.pairwise(edges)]
    return codes.astype(np.int64), names
