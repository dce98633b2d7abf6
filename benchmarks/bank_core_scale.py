"""Speed and memory of one bare :class:`~carls_dask.bank.core.ShardCore` as it grows (no Dask, no transport).

One process builds a shard with one table ``embedding float32[64]`` (Adagrad, normal initializer),
inserts ``rows`` fresh keys by ``lookup(insert=True)`` in batches of 262,144 (each batch timed), and
measures on the same core, at 400,000 rows and again at ``rows``:

- ``lookup``: 65,536 keys drawn Zipf(``zipf_a``) over the rows held;
- ``insert``: ``lookup(insert=True)`` of 262,144 fresh keys (the growth batches around that size);
- ``apply_gradients``: 65,536 Zipf keys (duplicates summed), Adagrad.

It samples this process's RSS (psutil) after every growth batch and reports its growth over the
payload (values plus optimizer slot). :func:`core_scale` returns the figures as a dict for
``benchmarks/bank_scale.py``; run ``python benchmarks/bank_core_scale.py [--rows N]`` to print them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

D = 64
INSERT_BATCH = 262_144
QUERY_BATCH = 65_536
PROBE_ROWS = 400_000


def _zipf_rows(rng: np.random.Generator, held: int, n: int, a: float) -> np.ndarray:
    """``n`` row numbers in ``[0, held)`` drawn Zipf(``a``) by rank (rank 1 most frequent), rank -> row scrambled."""
    ranks = rng.zipf(a, size=n * 2)
    ranks = ranks[ranks <= held][:n]
    while ranks.shape[0] < n:
        more = rng.zipf(a, size=n)
        ranks = np.concatenate([ranks, more[more <= held]])[:n]
    # a fixed odd multiplier scatters the hot ranks over the key range
    return ((ranks.astype(np.int64) - 1) * 2_654_435_761) % held


def _median_rate(fn: Callable[[], int], reps: int) -> float:
    """Median rows/s of ``fn`` (which returns the rows it handled) over ``reps`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        n = fn()
        times.append(n / (time.perf_counter() - t0))
    return float(statistics.median(times))


def core_scale(rows: int, *, zipf_a: float = 1.1, reps: int = 5, seed: int = 0,
               probe_rows: int = PROBE_ROWS) -> dict[str, Any]:
    """Grow one shard core to ``rows`` rows and measure its rates at ``probe_rows`` and at ``rows``.

    Parameters
    ----------
    rows
        Rows to insert (at least ``probe_rows``).
    zipf_a
        Exponent of the Zipf distribution of lookup and gradient keys.
    reps
        Timed calls per rate (median taken).
    seed
        Seed of the keys and gradients.
    probe_rows
        Rows at which the small-table rates are measured.

    Returns
    -------
    dict
        ``insert_total_s`` and ``insert_rows_per_s`` (whole growth), ``batch_s`` (each growth batch),
        ``rates`` (``{"small": {...}, "large": {...}}`` rows/s of lookup, insert, apply_gradients),
        ``ratios`` (large / small), ``rss`` (``(rows, bytes)`` samples), ``payload_bytes``,
        ``rss_growth_over_payload`` and ``bytes_allocated`` (the table's own count).
    """
    import psutil

    from carls_dask.bank import Column, TableSpec
    from carls_dask.bank.core import ShardCore

    rows = int(rows)
    if rows < probe_rows:
        raise ValueError(f"core_scale: rows must be at least {probe_rows}, got {rows}")
    spec = TableSpec("t", columns=(Column("embedding", shape=(D,)),), optimizer="adagrad",
                     learning_rate=0.05, initializer="normal", init_scale=0.1).resolve(
        optimizer="adagrad", learning_rate=0.05, initializer="normal", init_scale=0.1)
    warm = ShardCore([spec], check_ownership=False)  # compiled kernels loaded before any timing
    warm.lookup_rows("t", np.arange(1000, dtype=np.int64), insert=True)
    warm.apply_gradients("t", np.arange(1000, dtype=np.int64) % 7, np.zeros((1000, D), np.float32))
    core = ShardCore([spec], check_ownership=False, answer_buffers=256 << 20)
    rng = np.random.default_rng(seed)
    # distinct keys: a random odd multiplier of 0..n-1 (a bijection of int64), no set needed
    mult = np.int64(rng.integers(1 << 40, 1 << 41) | 1)
    next_key = [0]

    def fresh(n: int) -> np.ndarray:
        k = (np.arange(next_key[0], next_key[0] + n, dtype=np.int64) * mult)
        next_key[0] += n
        return k

    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    rss: list[tuple[int, int]] = [(0, rss0)]
    batch_s: list[float] = []
    rates: dict[str, dict[str, float]] = {}
    grads = rng.standard_normal((QUERY_BATCH, D)).astype(np.float32) * 0.01

    def measure() -> dict[str, float]:
        held = core.size("t")
        keys_of = core.tables["t"].keys  # contiguous, live rows first

        def lookup() -> int:
            core.lookup_rows("t", keys_of[_zipf_rows(rng, held, QUERY_BATCH, zipf_a)])
            return QUERY_BATCH

        def grad() -> int:
            core.apply_gradients("t", keys_of[_zipf_rows(rng, held, QUERY_BATCH, zipf_a)], grads)
            return QUERY_BATCH

        out = {"lookup": _median_rate(lookup, reps), "apply_gradients": _median_rate(grad, reps)}
        return out

    t_total = 0.0
    probed = False
    while core.size("t") < rows:
        n = min(INSERT_BATCH, rows - core.size("t"))
        if not probed and core.size("t") + n > probe_rows:
            n = probe_rows - core.size("t")
        k = fresh(n)
        t0 = time.perf_counter()
        core.lookup_rows("t", k, insert=True)
        dt = time.perf_counter() - t0
        t_total += dt
        batch_s.append(dt)
        rss.append((core.size("t"), proc.memory_info().rss))
        if not probed and core.size("t") >= probe_rows:
            probed = True
            rates["small"] = measure()
    rates["large"] = measure()
    held = core.size("t")
    # insert rates at size: the growth batches timed near each point (fresh keys, same batch size)
    n_batches = len(batch_s)
    small_ins = [INSERT_BATCH / s for s in batch_s[:max(1, probe_rows // INSERT_BATCH)]]
    large_ins = [INSERT_BATCH / s for s in batch_s[max(0, n_batches - 3):]]
    # the last batch may be short; measure fresh full batches at size instead
    ins = []
    for _ in range(2):
        k = fresh(INSERT_BATCH)
        t0 = time.perf_counter()
        core.lookup_rows("t", k, insert=True)
        ins.append(INSERT_BATCH / (time.perf_counter() - t0))
    rates["small"]["insert"] = float(statistics.median(small_ins))
    rates["large"]["insert"] = float(statistics.median(large_ins[:-1] + ins if len(large_ins) > 1 else ins))
    t = core.tables["t"]
    payload = t.n * t.spec.payload_bytes() + t.n * D * 4  # values + Adagrad accumulator
    rss_peak = max(r for _, r in rss)
    return {
        "rows": int(held),
        "insert_total_s": t_total,
        "insert_rows_per_s": rows / t_total,
        "batch_s": batch_s,
        "rates": rates,
        "ratios": {name: rates["large"][name] / rates["small"][name] for name in rates["large"]},
        "rss": rss,
        "payload_bytes": int(payload),
        "rss_growth_over_payload": (rss_peak - rss0) / payload,
        "bytes_allocated": int(t.nbytes()),
        "index_bytes": int(t.index.nbytes),
    }


def main() -> None:
    """Print :func:`core_scale`'s figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    r = core_scale(args.rows, zipf_a=args.zipf, reps=args.reps)
    print(f"inserted {r['rows']:,} rows in {r['insert_total_s']:.2f} s "
          f"({r['insert_rows_per_s'] / 1e6:.3f} M rows/s); slowest batch {max(r['batch_s']):.3f} s")
    print(f"{'figure':<18}{'at 400 k':>12}{'at ' + format(r['rows'], ','):>16}{'ratio':>8}  target >= 0.7")
    for name in ("lookup", "insert", "apply_gradients"):
        s, lg = r["rates"]["small"][name], r["rates"]["large"][name]
        print(f"{name:<18}{s / 1e6:>10.3f} M{lg / 1e6:>14.3f} M{lg / s:>8.2f}")
    print(f"payload {r['payload_bytes'] / 1e6:.1f} MB; table allocates {r['bytes_allocated'] / 1e6:.1f} MB "
          f"(index {r['index_bytes'] / 1e6:.1f} MB); RSS growth / payload {r['rss_growth_over_payload']:.2f}")
    print("RSS samples (rows, MB): " + ", ".join(f"({n:,}, {b / 1e6:.0f})" for n, b in r["rss"][:: max(1, len(r['rss']) // 10)]))


if __name__ == "__main__":
    main()
