"""Approximate top-k (per-shard FAISS IVF) against exact, and the per-call cost of negative sampling by table size.

:func:`ann_vs_exact` fills one :class:`~carls_dask.bank.core.ShardCore` with clustered embeddings (a Gaussian
mixture: ANN recall on uniform random vectors means nothing) and reports recall@10 of ``top_k(method="ivf")``
against ``method="exact"``, both query rates and the IVF build time; then it changes 1 % of the rows and
reports the refresh time and the recall again. :func:`sampling_cost` times ``sample_negatives`` per call
at several table sizes, next to the O(table) sampler it replaced (copy keys and frequencies, sort by
frequency, draw), so a flat column shows O(sample). Called by ``benchmarks/bank_scale.py`` at 10 M rows.

Run: ``python benchmarks/bank_ann.py [--rows 1000000] [--dim 64] [--queries 256]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from carls_dask.bank.core import ShardCore
from carls_dask.bank.sampling import order_by_frequency, sample_candidates
from carls_dask.bank.schema import Column, TableSpec

__all__ = ["ann_vs_exact", "clustered", "sampling_cost"]

_FILL = 262_144


def clustered(n: int, d: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    """``n`` rows of a Gaussian mixture around ``centres`` (spread 0.35 per dimension)."""
    return (centres[rng.integers(0, centres.shape[0], n)] + 0.35 * rng.normal(size=(n, d))).astype(np.float32)


def _core(d: int, rows: int) -> ShardCore:
    spec = TableSpec("items", columns=(Column("embedding", shape=(d,)),), optimizer=None, learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)
    return ShardCore([spec], initial_capacity=max(rows, 1024))


def _recall(a: np.ndarray, e: np.ndarray) -> float:
    return float(np.mean([np.intersect1d(x, y).size / y.size for x, y in zip(a, e, strict=True)]))


def ann_vs_exact(rows: int, d: int = 64, queries: int = 256, seed: int = 0) -> dict[str, Any]:
    """Recall@10 and query rates of the IVF index against exact top-k on ``rows`` clustered rows.

    Returns
    -------
    dict
        ``rows``, ``recall_at_10``, ``exact_qps``, ``ann_qps``, ``speedup``, ``build_s`` (train + fill),
        ``refresh_s`` (re-adding 1 % changed rows), ``recall_after_update``, ``nlist``, ``nprobe``.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(64, int(np.sqrt(rows))), d)).astype(np.float32)
    core = _core(d, rows)
    for lo in range(0, rows, _FILL):
        hi = min(rows, lo + _FILL)
        core.update("items", np.arange(lo, hi), {"embedding": clustered(hi - lo, d, rng, centres)})
    q = clustered(queries, d, rng, centres)
    t0 = time.perf_counter()
    core.top_k("items", q[:1], 10, method="ivf")  # trains and fills the index
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    ak, _ = core.top_k("items", q, 10, method="ivf")
    ann_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ek, _ = core.top_k("items", q, 10, method="exact")
    exact_s = time.perf_counter() - t0
    recall = _recall(ak, ek)
    changed = rng.choice(rows, max(rows // 100, 1), replace=False)
    core.update("items", changed, {"embedding": clustered(changed.size, d, rng, centres)})
    t0 = time.perf_counter()
    core.top_k("items", q[:1], 10, method="ivf")
    refresh = time.perf_counter() - t0
    ak2, _ = core.top_k("items", q, 10, method="ivf")
    ek2, _ = core.top_k("items", q, 10, method="exact")
    ix = next(iter(core._ann.values()))
    return {"rows": rows, "dim": d, "queries": queries, "recall_at_10": recall,
            "exact_qps": queries / exact_s, "ann_qps": queries / ann_s, "speedup": exact_s / ann_s,
            "build_s": build, "refresh_s": refresh, "recall_after_update": _recall(ak2, ek2),
            "nlist": int(ix.index.nlist), "nprobe": int(ix.index.nprobe)}


def sampling_cost(rows_list: Sequence[int], n: int = 4096, calls: int = 50, seed: int = 0) -> dict[str, Any]:
    """Seconds per ``sample_negatives`` call by table size: the O(sample) sampler and the O(table) one it replaced.

    Between calls 0.1 % of the rows are re-counted (``lookup(insert=True)``), so the log-uniform rank order
    goes stale and is rebuilt now and then; its share is included in the mean.

    Returns
    -------
    dict
        Per rows: ``uniform_s``, ``log_uniform_s`` (mean per call, rebuilds included), ``rebuilds``,
        ``rebuild_s`` (one rebuild), ``old_s`` (the O(table) sampler, one call).
    """
    out: dict[str, Any] = {"n": n, "calls": calls, "by_rows": {}}
    rng = np.random.default_rng(seed)
    for rows in rows_list:
        core = _core(2, rows)
        for lo in range(0, rows, _FILL):
            hi = min(rows, lo + _FILL)
            core.lookup("items", np.arange(lo, hi), insert=True)
        core.lookup("items", rng.zipf(1.3, size=min(rows, 1 << 20)) % rows, insert=True)
        t0 = time.perf_counter()
        core.sample_negatives("items", n, sampler="log_uniform", seed=0)  # first call: builds the order
        rebuild = time.perf_counter() - t0
        per: dict[str, float] = {}
        for sampler in ("uniform", "log_uniform"):
            total = 0.0
            for c in range(calls):
                core.lookup("items", rng.integers(0, rows, max(rows // 1000, 1)), insert=True)
                t0 = time.perf_counter()
                core.sample_negatives("items", n, sampler=sampler, seed=c)
                total += time.perf_counter() - t0
            per[f"{sampler}_s"] = total / calls
        t0 = time.perf_counter()
        keys, freq = core.keys_and_frequency("items")
        sample_candidates("items", order_by_frequency(keys, freq), n, sampler="log_uniform",
                          rng=np.random.default_rng(0))
        old = time.perf_counter() - t0
        out["by_rows"][rows] = {**per, "rebuilds": core.sampling_state("items")["rebuilds"],
                                "rebuild_s": rebuild, "old_s": old}
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run both measurements and print them as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--calls", type=int, default=50)
    a = ap.parse_args(argv)
    sizes = sorted({max(a.rows // 100, 1000), max(a.rows // 10, 1000), a.rows})
    res = {"ann": ann_vs_exact(a.rows, a.dim, a.queries), "sampling": sampling_cost(sizes, calls=a.calls)}
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
