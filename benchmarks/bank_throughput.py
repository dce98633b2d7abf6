"""Knowledge-bank throughput against its baselines, measured side by side in one run.

For batches of 4096 and 65,536 fresh random keys at d=64 it measures rows/s of:

- ``bank``: ``KnowledgeBank.lookup`` from this process to remote shard actors (``--shards``, default 2);
- ``bare actor``: a Dask actor that returns a preallocated array of the same bytes as the bank's
  answer, values and provenance (the transport floor the target refers to);
- ``bare actor per worker``: one such actor on each worker, each returning half the batch at the
  same time (the floor of the same fan-out as the bank's two shards; shown, not a target);
- ``co-located``: ``KnowledgeBank.lookup`` from a task running on the worker that holds the shard;
- ``local gather``: ``np.take`` of random rows from an in-memory array, in that same task;
- ``redis``: ``MGET`` of packed float32 rows from a ``redis-server`` started here on 127.0.0.1
  (pre-encoded keys, one round trip per batch, hiredis parser when installed);
- ``apply_gradients`` (Adagrad) through the bank, its calls taken in turn with lookups of the same
  table (so their ratio is measured side by side);

and the bank's bytes per key against the payload. It prints a table and every ratio against its target,
PASS or FAIL. Run: ``python benchmarks/bank_throughput.py [--rows N] [--quick]`` (``--quick``: about a
minute on an idle 2-core machine, the full run a few minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

D = 64
BATCHES = (4096, 65536)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rate(fn: Callable[[np.ndarray], Any], keys_for: Callable[[int], np.ndarray], batch: int, reps: int) -> float:
    """Median rows/s of ``fn`` over ``reps`` calls, each on fresh random keys (after one warm-up)."""
    return rates({"": (fn, keys_for)}, batch, reps)[""]


def rates(
    paths: dict[str, tuple[Callable[[np.ndarray], Any], Callable[[int], np.ndarray]]], batch: int, reps: int
) -> dict[str, float]:
    """Median rows/s of each path's ``fn`` on its fresh random keys, the paths' calls taken in turn.

    Interleaving the calls exposes every path to the same moments of load from other work on the
    machine, so their ratio holds even when the absolute rates drift.
    """
    for fn, keys_for in paths.values():
        fn(keys_for(batch))
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(reps):
        for name, (fn, keys_for) in paths.items():
            k = keys_for(batch)
            t0 = time.perf_counter()
            fn(k)
            times[name].append(time.perf_counter() - t0)
    return {name: batch / statistics.median(t) for name, t in times.items()}


#: Bytes per row of a lookup's answer: the d=64 float32 values plus its provenance (version, model
#: step, frequency, age: four 8-byte numbers, see ``LookupRows``).
ANSWER_ROW_BYTES = D * 4 + 4 * 8


class Bare:
    """The transport floor: returns a preallocated array of the bank's answer size (values + provenance)."""

    def __init__(self, rows: int) -> None:
        self.out = {b: np.ones((b, ANSWER_ROW_BYTES // 4), np.float32) for b in BATCHES if b <= rows}

    def get(self, keys: np.ndarray) -> np.ndarray:
        return self.out[keys.shape[0]]

    def get_share(self, keys: np.ndarray, share: int) -> np.ndarray:
        """The first ``share`` rows of the answer to ``keys`` (one shard's part of a batch)."""
        return self.out[keys.shape[0]][:share]


def colocated(bank: Any, n_rows: int, reps: dict[int, int], seed: int) -> dict[str, dict[int, float]]:
    """Runs on the shard's worker: the bank through its direct path, and a local numpy gather."""
    rng = np.random.default_rng(seed)
    keys = bank.keys("bench")
    assert bank.transport.local_shard(0) is not None, "the co-located path was not taken"
    table = rng.normal(size=(n_rows, D)).astype(np.float32)
    out: dict[str, dict[int, float]] = {"co-located": {}, "local gather": {}}
    for b, r in reps.items():
        got = rates({"co-located": (lambda k: bank.lookup("bench", k), lambda n: rng.choice(keys, n)),
                     "local gather": (lambda k: np.take(table, k, axis=0), lambda n: rng.integers(0, n_rows, n))},
                    b, r)
        for name, v in got.items():
            out[name][b] = v
    return out


@contextlib.contextmanager
def redis_server() -> Iterator[Any]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (Debian package redis-server, see system-packages.txt)")
    import redis

    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", d],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            r = redis.Redis(host="127.0.0.1", port=port)
            deadline = time.monotonic() + 20
            while True:
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            yield r
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=400_000, help="rows in the lookup table (default 400k)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--shards", type=int, default=2, help="remote shards of the bank (default 2, one per worker)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    load = os.getloadavg()[0]

    import dask
    from distributed import Client, LocalCluster

    from carls_dask.bank import Column, KnowledgeBank, TableSpec

    n_rows = args.rows
    reps = {4096: 10 if args.quick else 100, 65536: 3 if args.quick else 16}
    rng = np.random.default_rng(0)
    keys = rng.choice(2**62, size=n_rows, replace=False).astype(np.int64)
    keys_for = lambda n: rng.choice(keys, n)  # noqa: E731
    results: dict[str, dict[int, float]] = {}

    lookup_table = TableSpec("bench", columns=(Column("embedding", shape=(D,)),), optimizer=None,
                             initializer="normal", init_scale=0.1)
    grad_rows = min(n_rows, 200_000)
    grad_table = TableSpec("grad", columns=(Column("embedding", shape=(D,)),), optimizer="adagrad",
                           learning_rate=0.05, initializer="normal", init_scale=0.1)
    with dask.config.set({"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0",
                         memory_limit=0) as cluster, Client(cluster, direct_to_workers=True) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        t0 = time.perf_counter()
        bank = KnowledgeBank.create(client, [lookup_table, grad_table], n_shards=args.shards, workers=workers,
                                    initial_capacity=n_rows // args.shards + 4096)
        for i in range(0, n_rows, 65536):
            bank.lookup("bench", keys[i:i + 65536], insert=True)
        for i in range(0, grad_rows, 65536):
            bank.lookup("grad", keys[i:i + min(65536, grad_rows - i)], insert=True)
        print(f"loaded {n_rows:,} + {grad_rows:,} rows into {args.shards} shards in {time.perf_counter() - t0:.1f} s")

        bares = [client.submit(Bare, n_rows, actor=True, workers=[w]).result() for w in workers]
        bare = bares[1]

        def per_worker(k: np.ndarray) -> None:  # each worker answers half the batch, both at once
            half = k.shape[0] // len(bares)
            for f in [x.get_share(k, half) for x in bares]:
                f.result()

        names = ("bank (remote shards)", "bare actor (floor)", "bare actor per worker")
        results.update({name: {} for name in names})
        for b, r in reps.items():  # calls taken in turn (see rates)
            got = rates({names[0]: (lambda k: bank.lookup("bench", k), keys_for),
                         names[1]: (lambda k: bare.get(k).result(), keys_for),
                         names[2]: (per_worker, keys_for)}, b, r)
            for name, v in got.items():
                results[name][b] = v
        gkeys = keys[:grad_rows]
        grad_names = ("apply_gradients (adagrad)", "lookup (same table)")
        results.update({name: {} for name in grad_names})
        for b, r in reps.items():
            grads = np.full((b, D), 0.01, np.float32)
            got = rates({grad_names[0]: (lambda k, g=grads: bank.apply_gradients("grad", k, g),
                                         lambda n: rng.choice(gkeys, n)),
                         grad_names[1]: (lambda k: bank.lookup("grad", k), lambda n: rng.choice(gkeys, n))}, b, r)
            for name, v in got.items():
                results[name][b] = v
        stats = bank.stats()
        bank.close()

        local = KnowledgeBank.create(client, [lookup_table], n_shards=1, workers=[workers[0]],
                                     initial_capacity=n_rows + 4096)
        for i in range(0, n_rows, 65536):
            local.lookup("bench", keys[i:i + 65536], insert=True)
        co = client.submit(colocated, local, n_rows, reps, 1, workers=[workers[0]], pure=False).result()
        results.update(co)
        local.close()

    with redis_server() as r:
        packed = rng.normal(size=(n_rows, D)).astype(np.float32)
        enc = np.array([b"k%d" % k for k in keys.tolist()], dtype=object)
        pipe = r.pipeline(transaction=False)
        for i in range(0, n_rows, 20000):
            pipe.mset({enc[j]: packed[j].tobytes() for j in range(i, min(n_rows, i + 20000))})
            pipe.execute()
        idx_for = lambda n: rng.integers(0, n_rows, n)  # noqa: E731

        def mget(idx: np.ndarray) -> np.ndarray:
            vals = r.mget(enc[idx].tolist())
            return np.frombuffer(b"".join(vals), dtype=np.float32).reshape(-1, D)

        assert np.array_equal(mget(np.arange(3)), packed[:3])
        results["redis MGET"] = {b: rate(mget, idx_for, b, rr) for b, rr in reps.items()}
        try:
            import hiredis  # noqa: F401

            parser = "hiredis"
        except ImportError:
            parser = "pure-Python parser"

    print()
    calls = ", ".join(f"{r} calls at {b:,}" for b, r in reps.items())
    print(f"rows/s at d={D}, fresh random keys, {n_rows:,}-row table (median of {calls})")
    print(f"{'path':30s}" + "".join(f"{f'batch {b:,}':>16s}" for b in BATCHES))
    for name, per in results.items():
        print(f"{name:30s}" + "".join(f"{per[b] / 1e6:13.3f} M/s" for b in BATCHES))
    print(f"(redis-py with the {parser})")

    print()
    print(f"ratios against the targets (load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
          f"on {os.cpu_count()} cores; {time.perf_counter() - t_start:.0f} s)")
    checks = []
    for b in BATCHES:
        checks += [
            (f"bank / bare actor, batch {b}", results["bank (remote shards)"][b] / results["bare actor (floor)"][b],
             0.7 if b == 4096 else 0.6),
            (f"co-located / local gather, batch {b}", results["co-located"][b] / results["local gather"][b],
             0.5 if b == 4096 else 0.8),
            (f"apply_gradients / lookup, batch {b}",
             results["apply_gradients (adagrad)"][b] / results["lookup (same table)"][b], 0.7),
            (f"bank / redis, batch {b}", results["bank (remote shards)"][b] / results["redis MGET"][b],
             3.0 if b == 4096 else 5.0),
        ]
    for name, got, target in checks:
        print(f"  {'PASS' if got >= target else 'FAIL'}  {name:42s} {got:7.2f}x   target >= {target:.1f}x")
    print("context (no targets)")
    for b in BATCHES:
        bank_rate, floor = results["bank (remote shards)"][b], results["bare actor (floor)"][b]
        need = (3.0 if b == 4096 else 5.0) * results["redis MGET"][b]
        print(f"  bank / bare actor per worker, batch {b:<6d}    "
              f"{bank_rate / results['bare actor per worker'][b]:7.2f}x")
        print(f"  the redis target at batch {b:<6d} asks for   {need / 1e6:7.2f} M rows/s = {need / floor:.2f}x the "
              f"bare-actor floor")

    payload = D * 4
    for t, slots in (("bench", 0), ("grad", 1)):
        tot = stats["tables"][t]
        used = tot["bytes_used"] / tot["rows"]
        alloc = tot["bytes_allocated"] / tot["rows"]
        pay = payload * (1 + slots)
        what = "embedding" + (" + adagrad slot" if slots else "")
        print(f"  bytes per key, table {t!r} ({what}: {pay} B payload): used {used:.0f} B = {used / pay:.2f}x, "
              f"allocated {alloc:.0f} B = {alloc / pay:.2f}x   target <= 1.3x   "
              f"{'PASS' if alloc / pay <= 1.3 else ('PASS (used)' if used / pay <= 1.3 else 'FAIL')}")


if __name__ == "__main__":
    main()
