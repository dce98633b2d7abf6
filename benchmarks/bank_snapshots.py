"""Incremental against full bank snapshots of one shard, with the shard's RSS during the full snapshot.

One :class:`~carls_dask.bank.actor.BankShard` (in this process, no delta log) holds ``rows`` rows of a table
``embedding float32[64]`` with Adagrad, inserted by ``lookup(insert=True)``. Then:

- **full**: a full snapshot (``begin_snapshot`` + ``BankShard.snapshot`` + ``commit_snapshot``), the
  process's RSS sampled every few milliseconds while it runs;
- ``changed`` of the rows get a gradient step (distinct keys);
- **incremental**: the next snapshot, an increment on the full one (the changed rows only);
- **restore**: a new shard restored from the increment (base + increment folded, no delta log).

Targets (issue 19): incremental <= 0.05x the full snapshot's time at 1 % changed; RSS during the full
snapshot <= 1.3x the payload (the shard no longer copies its whole state to write it). The RSS figure is
the whole process (interpreter and libraries included), so at small ``rows`` it overstates the ratio.
Run: ``python benchmarks/bank_snapshots.py [--rows N] [--changed F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np

from carls_dask.bank.actor import BankShard
from carls_dask.bank.schema import Column, TableSpec
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot

TARGET_RATIO = 0.05
TARGET_RSS = 1.3
DIM = 64
BATCH = 262_144


class _RssSampler:
    """The process's RSS sampled in a thread until stopped (peak and samples)."""

    def __init__(self, every: float = 0.005) -> None:
        import psutil

        self._proc = psutil.Process(os.getpid())
        self.every = every
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(int(self._proc.memory_info().rss))
            time.sleep(self.every)

    def __enter__(self) -> _RssSampler:
        self.samples.append(int(self._proc.memory_info().rss))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(int(self._proc.memory_info().rss))


def _shard(spec: TableSpec) -> BankShard:
    return BankShard([spec.to_json()], 0, 1, 4096, initial_capacity=1024)


def _snapshot(shard: BankShard, root: str, step: int, parent: int | None) -> tuple[int, float]:
    t0 = time.perf_counter()
    h = begin_snapshot(root, step, parent=parent)
    shard.snapshot(h)
    commit_snapshot(h)
    shard.settle_snapshot()
    return h.version, time.perf_counter() - t0


def incremental_vs_full(rows: int, changed: float = 0.01, root: str | None = None) -> dict[str, Any]:
    """Time a full snapshot, an incremental one after ``changed`` of the rows changed, and a restore.

    Parameters
    ----------
    rows : int
        Rows of the shard's table (``embedding float32[64]``, Adagrad).
    changed : float
        Fraction of the rows given a gradient step between the two snapshots.
    root : str, optional
        Folder for the bank store (a temporary one under ``CARLS_DATA_DIR`` or the system's, removed after).

    Returns
    -------
    dict
        ``full_s``, ``incremental_s``, ``ratio`` (incremental / full) and its ``target``, ``restore_s``,
        ``payload_bytes``, ``rss_before``/``rss_peak`` bytes during the full snapshot, ``rss_peak_over_payload``,
        ``rss_growth_over_payload`` (peak minus before), ``rss_samples`` (MB), and the bytes each snapshot wrote.
    """
    if int(rows) < 1 or not 0.0 < float(changed) <= 1.0:
        raise ValueError(f"incremental_vs_full: rows={rows!r}, changed={changed!r}; expected rows >= 1 and 0 < changed <= 1")
    spec = TableSpec("emb", columns=(Column("embedding", "float32", (DIM,)),), optimizer="adagrad",
                     learning_rate=0.05, initializer="normal", init_scale=0.01).resolve(
        optimizer="adagrad", learning_rate=0.05, initializer="normal", init_scale=0.01)
    rng = np.random.default_rng(0)
    keys = rng.permutation(np.int64(rows) * 4)[:rows].astype(np.int64)
    base = root or tempfile.mkdtemp(prefix="bank-snapshots-", dir=os.environ.get("CARLS_DATA_DIR"))
    store = os.path.join(base, "bank")
    shard = _shard(spec)
    restored = None
    try:
        t0 = time.perf_counter()
        for lo in range(0, rows, BATCH):
            shard.lookup("emb", keys[lo : lo + BATCH], insert=True)
        insert_s = time.perf_counter() - t0
        stats = shard.stats()["tables"]["emb"]
        payload = 2 * int(stats["payload_bytes_per_row"]) * rows  # values + Adagrad accumulator (issue 19's payload)
        with _RssSampler() as rss:
            v1, full_s = _snapshot(shard, store, 1, None)
        n_changed = max(1, int(rows * float(changed)))
        ch = rng.choice(keys, size=n_changed, replace=False)
        for lo in range(0, n_changed, BATCH):
            part = ch[lo : lo + BATCH]
            shard.apply_gradients("emb", part, rng.normal(size=(part.size, DIM)).astype(np.float32))
        v2, inc_s = _snapshot(shard, store, 2, v1)
        from carls_dask.storage.manifest import read_manifest

        bytes_full = int(read_manifest(store, v1)["bytes"])
        man2 = read_manifest(store, v2)
        if man2["shards"]["0"]["parent"] != v1:
            raise RuntimeError(f"snapshot v{v2} was written in full; expected an increment on v{v1}")
        restored = _shard(spec)
        t0 = time.perf_counter()
        restored.restore(store, v2, replay_log=False)
        restore_s = time.perf_counter() - t0
        probe = ch[: min(1000, ch.size)]
        same = np.array_equal(restored.lookup("emb", probe).values["embedding"], shard.lookup("emb", probe).values["embedding"])
        if not same or restored.size("emb") != rows:
            raise RuntimeError("the restored shard differs from the live one")
        before = rss.samples[0]
        peak = max(rss.samples)
        return {
            "rows": int(rows),
            "changed": float(changed),
            "insert_s": insert_s,
            "full_s": full_s,
            "incremental_s": inc_s,
            "ratio": inc_s / full_s,
            "target": TARGET_RATIO,
            "restore_s": restore_s,
            "bytes_full": bytes_full,
            "bytes_incremental": int(man2["bytes"]),
            "payload_bytes": payload,
            "bytes_used": int(stats["bytes_used"]),
            "bytes_allocated": int(stats["bytes_allocated"]),
            "rss_before": before,
            "rss_peak": peak,
            "rss_peak_over_payload": peak / payload,
            "rss_growth_over_payload": (peak - before) / payload,
            "rss_target": TARGET_RSS,
            "rss_samples_mb": [round(s / 2**20, 1) for s in rss.samples[:: max(1, len(rss.samples) // 50)]],
            "load_avg": list(os.getloadavg()),
        }
    finally:
        shard.close()
        if restored is not None:
            restored.close()
        if root is None:
            shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    """Command line: ``--rows`` (default 1 M), ``--changed`` (default 0.01)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--changed", type=float, default=0.01)
    args = ap.parse_args()
    out = incremental_vs_full(args.rows, args.changed)
    print(json.dumps(out, indent=1))
    print(
        f"full {out['full_s']:.2f} s, incremental {out['incremental_s']:.3f} s: ratio {out['ratio']:.3f} "
        f"(target <= {TARGET_RATIO}); restore {out['restore_s']:.2f} s; RSS peak / payload "
        f"{out['rss_peak_over_payload']:.2f}, growth / payload {out['rss_growth_over_payload']:.2f} "
        f"(target <= {TARGET_RSS}); load {out['load_avg']}"
    )


if __name__ == "__main__":
    main()
