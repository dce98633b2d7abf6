"""The knowledge bank at tens of millions of keys: every figure with its ratio and target, in one run.

A bank of ``--shards`` shard actors (default 2) on a two-worker LocalCluster holds one table
``embedding float32[64]`` with Adagrad. This script:

1. inserts ``--rows`` keys (default 10 M; ``--quick`` 2 M) with ``lookup(insert=True)`` in batches of
   262,144, pausing at 400 k rows to measure the same operations there as at full size: lookup and
   ``apply_gradients`` of 65,536 Zipf-distributed keys (a = 1.1 over the keys held), and the insert rate
   (rows/s of the insert batches around 400 k and of the last ones);
2. samples every worker's RSS four times a second from this process (psutil) and prints, per phase, the
   peak growth over the workers' RSS before the bank existed (after a small bank went through every phase,
   so that the base holds the workers' imports and compiled code), against the payload (values + Adagrad
   accumulator, 512 B per row);
3. writes a full snapshot, changes 1 % of the rows and writes an incremental snapshot (the ratio to the full
   one, target <= 0.05x), closes the bank (what the workers still hold) and restores the full snapshot onto
   the same workers (time, RSS peak);
4. runs the bounded-table stream (20 M distinct Zipf keys into a capped table), negative sampling cost
   against rows, and approximate against exact top-k at ``--rows`` (recall@10, speed).

On a 2-core machine the client and the two shard workers share the cores, so the Dask-level rates are
bound by that (see ``docs/scaling.md``). Run: ``python benchmarks/bank_scale.py [--rows N] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

D = 64
INSERT_BATCH = 262_144
ZIPF_BATCH = 65_536
ZIPF_A = 1.1
AT_SMALL = 400_000
PAYLOAD_ROW = D * 4 * 2  # values + the Adagrad accumulator


def key_of(ranks: np.ndarray) -> np.ndarray:
    """Distinct int64 keys for ranks ``0..`` (an odd multiplier is a bijection modulo 2**62)."""
    return ((ranks.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) & np.uint64((1 << 62) - 1)).astype(np.int64)


def zipf_keys(rng: np.random.Generator, held: int, n: int) -> np.ndarray:
    """``n`` keys drawn Zipf(``ZIPF_A``) by rank over the first ``held`` keys (ranks past it wrap)."""
    return key_of((rng.zipf(ZIPF_A, n) - 1) % held)


class RssSampler:
    """Samples the RSS of some processes every ``interval`` s in a thread, tagged with the current phase."""

    def __init__(self, pids: list[int], interval: float = 0.25) -> None:
        import psutil

        self.procs = [psutil.Process(p) for p in pids]
        self.interval = interval
        self.phase = "idle"
        self.base = sum(p.memory_info().rss for p in self.procs)
        self.samples: list[tuple[float, str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                rss = sum(p.memory_info().rss for p in self.procs)
            except Exception:  # a worker went away: stop sampling it
                continue
            self.samples.append((time.perf_counter(), self.phase, rss))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def peak(self, phase: str) -> int:
        """Peak growth over the base in ``phase`` (bytes)."""
        got = [rss for _, p, rss in self.samples if p == phase]
        return (max(got) if got else sum(p.memory_info().rss for p in self.procs)) - self.base


def median_rate(fn: Callable[[np.ndarray], Any], keys_for: Callable[[], np.ndarray], reps: int) -> float:
    """Median rows/s of ``fn`` over ``reps`` calls on fresh keys (after one warm-up call)."""
    fn(keys_for())
    times = []
    for _ in range(reps):
        k = keys_for()
        t0 = time.perf_counter()
        fn(k)
        times.append(k.shape[0] / (time.perf_counter() - t0))
    return statistics.median(times)


@contextlib.contextmanager
def bank_cluster(n_workers: int) -> Iterator[tuple[Any, list[str]]]:
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False,
                          "distributed.worker.memory.pause": False, "distributed.worker.memory.terminate": False}), \
            LocalCluster(n_workers=n_workers, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0",
                         memory_limit=0) as cluster, Client(cluster, direct_to_workers=True) as client:
        yield client, sorted(client.scheduler_info(n_workers=-1)["workers"])


def dask_bank(rows: int, shards: int, reps: int, store: str) -> dict[str, Any]:
    """Section 1-3: the Dask bank's rates at 400 k and at ``rows``, RSS, snapshots."""
    from carls_dask.bank import Column, KnowledgeBank, TableSpec

    rng = np.random.default_rng(0)
    spec = TableSpec("embedding", columns=(Column("embedding", shape=(D,)),), optimizer="adagrad",
                     learning_rate=0.05, initializer="normal", init_scale=0.1)
    out: dict[str, Any] = {"rows": rows, "shards": shards, "insert_batches": []}
    grads = np.full((ZIPF_BATCH, D), 0.01, np.float32)
    with bank_cluster(2) as (client, workers):
        pids = list(client.run(os.getpid).values())
        warm_up(client, spec, shards, workers)
        with RssSampler(pids) as rss:
            bank = KnowledgeBank.create(client, [spec], n_shards=shards, workers=workers)

            def measure(held: int) -> dict[str, float]:
                rss.phase = f"measure {held}"
                return {
                    "lookup": median_rate(lambda k: bank.lookup("embedding", k),
                                          lambda: zipf_keys(rng, held, ZIPF_BATCH), reps),
                    "apply_gradients": median_rate(lambda k: bank.apply_gradients("embedding", k, grads),
                                                   lambda: zipf_keys(rng, held, ZIPF_BATCH), reps),
                }

            held = 0
            insert_s = 0.0
            rss.phase = "insert"
            while held < rows:
                n = min(INSERT_BATCH, rows - held)
                k = key_of(np.arange(held, held + n))
                t0 = time.perf_counter()
                bank.lookup("embedding", k, insert=True)
                dt = time.perf_counter() - t0
                insert_s += dt
                out["insert_batches"].append((held + n, n / dt))
                held += n
                if held >= AT_SMALL and "small" not in out:
                    out["small"] = measure(held)
                    out["small"]["held"] = held
                    rss.phase = "insert"
            out["insert_s"] = insert_s
            out["insert_peak"] = rss.peak("insert")
            out["large"] = measure(held)
            batches = out["insert_batches"]
            near = [r for h, r in batches if AT_SMALL - INSERT_BATCH <= h <= AT_SMALL + 2 * INSERT_BATCH]
            out["small"]["insert"] = statistics.median(near)
            out["large"]["insert"] = statistics.median([r for _, r in batches[-3:]])
            rss.phase = "settled"
            time.sleep(1.0)
            out["settled"] = rss.peak("settled")
            out["stats"] = bank.stats()

            rss.phase = "snapshot"
            t0 = time.perf_counter()
            version = bank.snapshot(store, step=1)
            out["snapshot_s"] = time.perf_counter() - t0
            out["snapshot_peak"] = rss.peak("snapshot")
            out["snapshot_bytes"] = sum(f.stat().st_size for f in _files(store))
            changed = max(1, rows // 100)
            k = key_of(rng.choice(rows, changed, replace=False))
            bank.apply_gradients("embedding", k, np.full((changed, D), 0.01, np.float32))
            rss.phase = "incremental"
            t0 = time.perf_counter()
            try:
                bank.snapshot(store, step=2)
                out["incremental_s"] = time.perf_counter() - t0
                out["incremental_kind"] = _kind_of(store)
            except TypeError as exc:  # pragma: no cover - a store without increments
                out["incremental_error"] = repr(exc)
            bank.close()
            _wait_released(client)  # closing gives the rows back: the restore starts from the workers' base
            rss.phase = "released"
            time.sleep(1.0)
            out["released"] = rss.peak("released")
            rss.phase = "restore"
            t0 = time.perf_counter()
            again = KnowledgeBank.restore(client, store, n_shards=shards, version=version, workers=workers)
            out["restore_s"] = time.perf_counter() - t0
            out["restore_peak"] = rss.peak("restore")
            assert again.size("embedding") == rows, (again.size("embedding"), rows)
            again.close()
    return out


def warm_up(client: Any, spec: Any, shards: int, workers: list[str]) -> None:
    """One small bank through every phase, so that the RSS base holds the workers' imports and compiled code."""
    from carls_dask.bank import KnowledgeBank

    store = tempfile.mkdtemp(prefix="bank-scale-warm-")
    try:
        bank = KnowledgeBank.create(client, [spec], n_shards=shards, workers=workers)
        keys = key_of(np.arange(5000))
        bank.lookup("embedding", keys, insert=True)
        bank.apply_gradients("embedding", keys, np.full((keys.size, D), 0.01, np.float32))
        bank.snapshot(store, step=1)
        bank.close()
        KnowledgeBank.restore(client, store, n_shards=shards, workers=workers).close()
        _wait_released(client)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _actors(dask_worker: Any) -> int:
    return len(dask_worker.state.actors)


def _wait_released(client: Any, timeout: float = 60.0) -> None:
    """Wait until no worker holds a shard actor any more."""
    deadline = time.monotonic() + timeout
    while sum(client.run(_actors).values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers still held shard actors {timeout:g} s after the bank was closed")
        time.sleep(0.1)


def _files(root: str) -> Iterator[Any]:
    import pathlib

    return (p for p in pathlib.Path(root).rglob("*") if p.is_file())


def _kind_of(store: str) -> str:
    """What the newest snapshot of ``store`` is ("incremental" or "full"), as its manifest says."""
    from carls_dask.storage.snapshots import list_snapshots

    entry = list_snapshots(store)[-1]
    return "full" if entry.get("parent") is None else f"incremental on version {entry['parent']}"


def report_bank(r: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    rows = r["rows"]
    print(f"\nDask bank: {r['shards']} shards on 2 workers, embedding float32[{D}] + Adagrad, {rows:,} rows")
    print(f"  inserted in {r['insert_s']:.1f} s ({rows / r['insert_s'] / 1e6:.2f} M rows/s) in batches of "
          f"{INSERT_BATCH:,}")
    print(f"  {'operation':20s}{'at ' + format(r['small']['held'], ','):>16s}{'at ' + format(rows, ','):>16s}"
          f"{'ratio':>8s}")
    checks: list[tuple[str, float, float, str]] = []
    for op in ("insert", "lookup", "apply_gradients"):
        a, b = r["small"][op], r["large"][op]
        print(f"  {op:20s}{a / 1e6:12.2f} M/s{b / 1e6:12.2f} M/s{b / a:8.2f}")
        checks.append((f"{op} at {rows:,} / at 400 k", b / a, 0.7, ">="))
    checks.append((f"insert of {rows:,} rows, seconds (scaled to 10 M: {r['insert_s'] * 1e7 / rows:.1f} s)",
                   r["insert_s"] * 1e7 / rows, 15.0, "<="))
    payload = rows * PAYLOAD_ROW
    print(f"  worker RSS growth / payload ({payload / 2**30:.2f} GiB): peak while inserting "
          f"{r['insert_peak'] / payload:.2f}x, settled {r['settled'] / payload:.2f}x, "
          f"during the full snapshot {r['snapshot_peak'] / payload:.2f}x, after closing the bank "
          f"{r['released'] / payload:.2f}x, restore {r['restore_peak'] / payload:.2f}x")
    checks += [("RSS peak while inserting / payload", r["insert_peak"] / payload, 1.3, "<="),
               ("RSS peak during a snapshot / payload", r["snapshot_peak"] / payload, 1.3, "<="),
               ("RSS after closing the bank / payload", r["released"] / payload, 0.1, "<="),
               ("RSS peak during a restore / payload", r["restore_peak"] / payload, 1.3, "<=")]
    for t, s in r["stats"]["tables"].items():
        print(f"  table {t!r}: allocated {s['bytes_allocated'] / 2**20:,.0f} MiB, used {s['bytes_used'] / 2**20:,.0f} "
              f"MiB for {s['rows']:,} rows (stats summed over shards)")
    mb = r["snapshot_bytes"] / 2**20
    print(f"  full snapshot {r['snapshot_s']:.1f} s ({mb / r['snapshot_s']:.0f} MB/s, {mb:,.0f} MiB); "
          f"restore {r['restore_s']:.1f} s")
    if "incremental_s" in r:
        ratio = r["incremental_s"] / r["snapshot_s"]
        print(f"  snapshot after 1 % of rows changed ({r['incremental_kind']}): {r['incremental_s']:.2f} s = "
              f"{ratio:.3f}x the full one")
        checks.append(("incremental / full snapshot, 1 % changed", ratio, 0.05, "<="))
    return checks


def report_bounded(r: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    print(f"\nbounded table (one shard core, LFU, min_frequency 2): {r['keys_streamed']:,} Zipf({ZIPF_A}) keys over "
          f"20 M ids ({r['distinct_keys_streamed']:,} distinct seen), cap {r['max_rows']:,}")
    print(f"  most rows held {r['max_rows_seen']:,}; kept keys among the distribution's top {r['rows']:,}: "
          f"{r['true_top_overlap']:.3f}, among the stream's most counted: {r['top_key_overlap']:.3f}")
    print(f"  admissions {r['admissions']:,}, rejections {r['rejections']:,}, evictions {r['evictions']}, "
          f"sketch {r['sketch_bytes'] / 2**20:.0f} MiB; {r['rows_per_s'] / 1e6:.2f} M keys/s")
    return [("bounded: most rows held / cap", r["max_rows_seen"] / r["max_rows"], 1.0, "<="),
            ("bounded: kept keys among the stream's most counted", r["top_key_overlap"], 0.9, ">=")]


def report_sampling(r: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    print(f"\nnegative sampling, {r['n']:,} candidates per call (mean of {r['calls']} calls, 0.1 % of rows "
          "re-counted between calls; rebuilds of the rank order included)")
    print(f"  {'rows':>12s}{'uniform':>12s}{'log-uniform':>14s}{'rebuilds':>10s}{'one rebuild':>13s}"
          f"{'O(table) sampler':>18s}")
    by = r["by_rows"]
    for rows, x in sorted(by.items()):
        print(f"  {rows:12,d}{x['uniform_s'] * 1e3:9.2f} ms{x['log_uniform_s'] * 1e3:11.2f} ms{x['rebuilds']:10d}"
              f"{x['rebuild_s'] * 1e3:10.0f} ms{x['old_s'] * 1e3:15.1f} ms")
    small, large = min(by), max(by)
    return [(f"log-uniform sampling cost at {large:,} / at {small:,} rows",
             by[large]["log_uniform_s"] / by[small]["log_uniform_s"], 2.0, "<="),
            (f"uniform sampling cost at {large:,} / at {small:,} rows",
             by[large]["uniform_s"] / by[small]["uniform_s"], 2.0, "<=")]


def report_ann(r: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    print(f"\napproximate top-k (FAISS IVF, nlist {r['nlist']}, nprobe {r['nprobe']}) against exact, one shard core, "
          f"{r['rows']:,} clustered rows at d={r['dim']}, {r['queries']} queries")
    print(f"  recall@10 {r['recall_at_10']:.3f} (after 1 % of rows changed: {r['recall_after_update']:.3f}); "
          f"{r['ann_qps']:,.0f} queries/s against {r['exact_qps']:,.1f} exact ({r['speedup']:.0f}x); "
          f"build {r['build_s']:.1f} s, refresh after 1 % changed {r['refresh_s']:.2f} s")
    return [("ANN recall@10", r["recall_at_10"], 0.95, ">="),
            ("ANN recall@10 after 1 % of rows changed", r["recall_after_update"], 0.95, ">="),
            ("ANN speed / exact", r["speedup"], 10.0, ">=")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000, help="keys in the bank (default 10 M)")
    ap.add_argument("--quick", action="store_true", help="2 M rows and fewer repetitions")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: bank,bounded,sampling,ann")
    args = ap.parse_args()
    rows = 2_000_000 if args.quick and args.rows == 10_000_000 else args.rows
    reps = 5 if args.quick else 9
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    checks: list[tuple[str, float, float, str]] = []
    t_start = time.perf_counter()
    load = os.getloadavg()[0]
    if "bank" not in skip:
        store = tempfile.mkdtemp(prefix="bank-scale-")
        try:
            checks += report_bank(dask_bank(rows, args.shards, reps, store))
        finally:
            shutil.rmtree(store, ignore_errors=True)
    if "bounded" not in skip:
        from bank_bounded import bounded_stream  # sibling scripts: a script's own folder is first on sys.path

        checks += report_bounded(bounded_stream(batches=40 if args.quick else 160))
    if "sampling" not in skip:
        from bank_ann import sampling_cost

        checks += report_sampling(sampling_cost(sorted({max(rows // 100, 10_000), rows // 10, rows}),
                                                calls=20 if args.quick else 50))
    if "ann" not in skip:
        from bank_ann import ann_vs_exact

        checks += report_ann(ann_vs_exact(rows))
    print(f"\nratios against the targets ({time.perf_counter() - t_start:.0f} s in all; load average "
          f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores)")
    for name, got, target, how in checks:
        ok = got >= target if how == ">=" else got <= target
        print(f"  {'PASS' if ok else 'FAIL'}  {name:62s} {got:9.3f}   target {how} {target:g}")


if __name__ == "__main__":
    main()
