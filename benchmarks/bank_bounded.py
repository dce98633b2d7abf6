"""A bounded table fed a Zipf stream over 20 M distinct keys: the cap holds and the most frequent keys stay.

One :class:`~carls_dask.bank.core.ShardCore` holds one table ``embedding float32[64]`` with
``max_rows``, LFU eviction and an admission filter (``min_frequency``); batches of Zipf-distributed keys
(ranks scrambled into int64 keys) go through ``lookup(insert=True)``. Reported: the most rows the table
ever held (the cap), the overlap of the kept keys with the true most frequent keys of the stream,
admissions, rejections and evictions, and the stream's rows/s (lookups with insert, bounds included).

Run ``python -m benchmarks.bank_bounded`` (``--quick`` for a short stream).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from carls_dask.bank.core import ShardCore
from carls_dask.bank.hashing import splitmix64
from carls_dask.bank.schema import Column, TableSpec

__all__ = ["bounded_stream", "zipf_batches"]


def zipf_batches(batches: int, size: int, distinct: int, *, a: float = 1.1, seed: int = 0) -> Iterator[np.ndarray]:
    """``batches`` arrays of ``size`` keys drawn from Zipf(``a``) over ``distinct`` ids (scrambled to int64)."""
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        ranks = rng.zipf(a, size) % distinct
        yield splitmix64(ranks.astype(np.uint64)).view(np.int64)


def bounded_stream(
    *,
    max_rows: int = 100_000,
    distinct: int = 20_000_000,
    batches: int = 40,
    batch: int = 65_536,
    min_frequency: int = 2,
    eviction: str = "lfu",
    zipf_a: float = 1.1,
    dim: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Run the Zipf stream against one bounded shard and return its figures.

    Returns
    -------
    dict
        ``max_rows``, ``max_rows_seen`` (the cap held if ``<= max_rows``), ``cap_held``, ``rows``,
        ``top_key_overlap`` (kept keys among the stream's most frequent, as a fraction of the kept),
        ``admissions``, ``rejections``, ``evictions``, ``sketch_bytes``, ``keys_streamed``,
        ``seconds`` and ``rows_per_s`` (stream time only; the exact top-key count is not timed).
    """
    spec = TableSpec("emb", columns=(Column("embedding", "float32", (dim,)),), optimizer="adagrad",
                     learning_rate=0.1, initializer="normal", init_scale=0.01, max_rows=max_rows,
                     eviction=eviction, min_frequency=min_frequency)
    core = ShardCore([spec], initial_capacity=max_rows + batch)
    seen: list[np.ndarray] = []
    most = 0
    elapsed = 0.0
    for keys in zipf_batches(batches, batch, distinct, a=zipf_a, seed=seed):
        t0 = time.perf_counter()
        core.lookup_rows("emb", keys, insert=True)
        elapsed += time.perf_counter() - t0
        most = max(most, core.size("emb"))
        seen.append(keys)
    uniq, counts = np.unique(np.concatenate(seen), return_counts=True)
    kept = core.keys("emb")
    top = uniq[np.argsort(-counts, kind="stable")[: kept.size]]
    # the keys the distribution makes most frequent (Zipf ranks 1..kept), not those this short stream happened to
    # draw most: the stream's counts of keys ranked ~50 k and beyond are mostly ties of 2 or 3
    true_top = splitmix64(np.arange(1, kept.size + 1, dtype=np.uint64)).view(np.int64)
    bounds = core.stats()["tables"]["emb"]["bounds"]
    n = batches * batch
    return {
        "max_rows": max_rows,
        "max_rows_seen": most,
        "cap_held": most <= max_rows,
        "rows": int(kept.size),
        "distinct_keys_streamed": int(uniq.size),
        "top_key_overlap": float(np.intersect1d(top, kept).size / max(kept.size, 1)),
        "true_top_overlap": float(np.intersect1d(true_top, kept).size / max(kept.size, 1)),
        "admissions": bounds["admissions"],
        "rejections": bounds["rejections"],
        "evictions": bounds["evictions"],
        "sketch_bytes": bounds["sketch_bytes"],
        "keys_streamed": n,
        "seconds": elapsed,
        "rows_per_s": n / elapsed if elapsed > 0 else float("nan"),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: print the figures of :func:`bounded_stream` as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-rows", type=int, default=100_000)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--eviction", default="lfu")
    p.add_argument("--quick", action="store_true", help="10 batches, cap 10,000")
    args = p.parse_args(argv)
    if args.quick:
        out = bounded_stream(max_rows=10_000, batches=10, min_frequency=args.min_frequency, eviction=args.eviction)
    else:
        out = bounded_stream(max_rows=args.max_rows, batches=args.batches, min_frequency=args.min_frequency,
                             eviction=args.eviction)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
