"""Exact top-k throughput of one shard's rows: the NumPy backend against the FAISS flat index.

Both run :func:`carls_dask.bank.topk.exact_top_k` (the code under ``ShardCore.top_k``) in this process on
the same float32 table and queries; the FAISS time includes building the ``IndexFlatIP`` from the rows,
as each call does. Printed: queries/s of each backend (median of ``--reps`` calls), the ratio, and a
short sweep of table sizes at q=1, ``--queries`` and 256 that shows where FAISS starts to pay
(``topk.FAISS_MIN_ROWS`` and ``FAISS_MIN_QUERIES``, the ``"auto"`` thresholds). The answers of the two backends are checked equal.

Run: ``python benchmarks/top_k.py [--rows 200000] [--dim 64] [--queries 64] [--k 10] [--metric dot]``.
Thread counts follow the usual variables (``OMP_NUM_THREADS`` for FAISS, the BLAS ones for NumPy).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from carls_dask.bank.topk import FAISS_MIN_QUERIES, FAISS_MIN_ROWS, exact_top_k, faiss_available


def median_seconds(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up (imports, thread pools, page faults)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(vectors: np.ndarray, keys: np.ndarray, query: np.ndarray, k: int, metric: str,
            reps: int) -> tuple[float, float]:
    """Queries/s of the NumPy and the FAISS backend (after checking that they answer the same)."""
    a = exact_top_k(vectors, keys, query, k, metric, backend="numpy")
    b = exact_top_k(vectors, keys, query, k, metric, backend="faiss")
    np.testing.assert_allclose(a[1], b[1], rtol=1e-5, atol=1e-5)
    assert all(set(x.tolist()) == set(y.tolist()) for x, y in zip(a[0], b[0], strict=True))
    t_np = median_seconds(lambda: exact_top_k(vectors, keys, query, k, metric, backend="numpy"), reps)
    t_fs = median_seconds(lambda: exact_top_k(vectors, keys, query, k, metric, backend="faiss"), reps)
    return query.shape[0] / t_np, query.shape[0] / t_fs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--metric", choices=("dot", "cosine"), default="dot")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-sweep", action="store_true", help="skip the table-size sweep")
    args = parser.parse_args()
    if not faiss_available():
        raise SystemExit("faiss is not installed: pip install 'carls-dask[faiss]'")
    import faiss

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    keys = rng.permutation(args.rows).astype(np.int64)
    query = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    print(f"faiss {faiss.__version__}, numpy {np.__version__}, faiss threads {faiss.omp_get_max_threads()}")
    qps_np, qps_fs = compare(vectors, keys, query, args.k, args.metric, args.reps)
    print(f"{args.rows} x {args.dim} float32, q={args.queries}, k={args.k}, {args.metric}, "
          f"median of {args.reps}:")
    print(f"  numpy  {qps_np:10.1f} queries/s")
    print(f"  faiss  {qps_fs:10.1f} queries/s   (index built per call)")
    print(f"  faiss / numpy = {qps_fs / qps_np:.2f}x")
    if args.no_sweep:
        return
    print(f"sweep (d={args.dim}, k={args.k}, {args.metric}; 'auto' uses faiss from {FAISS_MIN_ROWS} rows "
          f"and {FAISS_MIN_QUERIES} query rows):")
    print(f"  {'rows':>8} {'q':>4} {'numpy q/s':>12} {'faiss q/s':>12} {'ratio':>6}")
    query = rng.standard_normal((max(256, args.queries), args.dim), dtype=np.float32)
    for n in (5_000, 50_000, args.rows):
        for q in sorted({1, args.queries, 256}):
            a, b = compare(vectors[:n], keys[:n], query[:q], args.k, args.metric, args.reps)
            print(f"  {n:>8} {q:>4} {a:>12.1f} {b:>12.1f} {b / a:>6.2f}")


if __name__ == "__main__":
    main()
