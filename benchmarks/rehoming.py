"""Pause of a bank client after the worker holding a shard is killed (SIGKILL), against a full restore.

A two-shard bank on a two-worker LocalCluster gets ``--rows`` rows (d=``--dim``), a committed
snapshot, then ``--records`` logged update batches. The worker holding shard 0 is killed and the
next ``lookup`` waits while the shard is re-homed on the live worker. Printed, side by side in one
process:

- ``pause``: from the kill to the first answered call (detection + re-home + retried call);
- ``restore_s``, ``rows`` and ``records``: what the re-homed shard read from the snapshot and replayed;
- baseline ``full restore``: ``KnowledgeBank.restore`` of the whole bank from the same store;
- ``call``: one ordinary ``lookup`` of the same batch.

Run: ``python benchmarks/rehoming.py [--rows N] [--records N] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--records", type=int, default=200, help="update batches logged after the snapshot")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="20,000 rows and 50 records")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.records = 20_000, 50

    import dask
    from distributed import Client, LocalCluster

    from carls_dask.bank import Column, KnowledgeBank, TableSpec

    spec = TableSpec("nodes", columns=(Column("embedding", shape=(args.dim,)),), optimizer="sgd",
                     learning_rate=0.1, initializer="zeros", init_scale=0.0)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp, dask.config.set({"carls.bank.rehome-timeout": "300s"}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        root = f"{tmp}/bank"
        bank = KnowledgeBank.create(client, [spec], n_shards=2, buckets=1024, workers=[a, b], name="bench",
                                    log_root=root)
        keys = np.arange(1, args.rows + 1, dtype=np.int64)
        for lo in range(0, keys.size, 50_000):
            k = keys[lo:lo + 50_000]
            bank.update("nodes", k, {"embedding": rng.standard_normal((k.size, args.dim), dtype=np.float32)})
        bank.snapshot(root, step=1)
        for _ in range(args.records):
            k = rng.choice(keys, args.batch, replace=False)
            bank.update("nodes", k, {"embedding": rng.standard_normal((k.size, args.dim), dtype=np.float32)})
        probe = rng.choice(keys, args.batch, replace=False)
        t = time.perf_counter()
        before = bank.lookup("nodes", probe).values["embedding"]
        call = time.perf_counter() - t

        pid = client.run(os.getpid, workers=[a])[a]
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        after = bank.lookup("nodes", probe).values["embedding"]
        pause = time.perf_counter() - t0
        assert np.array_equal(before, after), "re-homed shard answers differ"
        event = bank.stats()["rehoming"]["events"][0]

        t = time.perf_counter()
        whole = KnowledgeBank.restore(client, root, workers=[b])
        full = time.perf_counter() - t
        whole.close()
        bank.close()
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average)")
    print(f"bank: {args.rows:,} rows x d={args.dim}, 2 shards, {args.records} update batches of {args.batch} "
          "logged after the snapshot")
    print(f"pause after SIGKILL (detect + re-home + retried lookup): {pause:8.2f} s")
    print(f"  re-homed shard: {event['rows']:,} rows from snapshot v{event['version']}, "
          f"{event['records']} delta records replayed, restore {event['restore_s']:.2f} s, "
          f"re-home {event['rehome_s']:.2f} s")
    print(f"baseline full restore of the bank (both shards):     {full:8.2f} s  -> pause / full restore = "
          f"{pause / full:.2f}")
    print(f"one lookup of {args.batch} keys:                       {call * 1e3:8.1f} ms -> pause / call = "
          f"{pause / call:.0f}")


if __name__ == "__main__":
    main()
