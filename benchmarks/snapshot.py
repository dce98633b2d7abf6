"""Snapshot and restore of a 1M x 64 bank with Adagrad state, against raw numpy I/O of the same bytes.

Both sides run in the same process on the same disk, one after the other, ``--repeat`` times:

- **snapshot**: ``begin_snapshot`` + ``write_shard`` per shard (rows sorted by bucket, whole Zarr chunks,
  CRC32C per chunk, fsync) + ``commit_snapshot``; **raw write**: ``ndarray.tofile`` of every array of
  every shard into one file each, then fsync.
- **restore**: ``read_snapshot`` of the whole bank; **raw read**: ``np.fromfile`` of those files.
- **reshard**: ``read_snapshot(buckets=...)`` once per shard of a different shard count.

Reads come from the page cache on both sides (nothing is dropped between write and read); every write of a
repetition comes first, then one throw-away allocation of the bank's size (see ``settle``), then the reads.
The targets are a snapshot at >= 0.5x the raw write speed and a restore at >= 0.8x the raw read speed, judged
on the median of the runs (a restore onto another shard count, and both without checksums, are shown without a
target). Median and best of the runs are printed, with the load average, since other work on the machine skews
both sides.
Run: ``python benchmarks/snapshot.py [--rows N] [--dim D] [--repeat N]`` (about a minute at the defaults on
an idle 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import tempfile
import time

import numpy as np

from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, read_snapshot, write_shard

#: Speed against raw I/O of the same bytes: a snapshot against a raw write, a restore against a raw read.
SNAPSHOT_TARGET = 0.5
RESTORE_TARGET = 0.8


def _bucket(keys: np.ndarray, buckets: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(buckets)).astype(np.int32)


def make_states(rows: int, dim: int, n_shards: int, buckets: int) -> list[dict]:
    """Shard states of a bank with one table: embedding[dim] + Adagrad accumulator + provenance."""
    rng = np.random.default_rng(0)
    keys = rng.permutation(np.int64(rows) * 4)[:rows].astype(np.int64)
    bucket = _bucket(keys, buckets)
    states = []
    for s in range(n_shards):
        mine = bucket % n_shards == s
        n = int(mine.sum())
        states.append({
            "meta": {"format": 1, "shard": s, "n_shards": n_shards, "buckets": buckets,
                     "owned_buckets": [b for b in range(buckets) if b % n_shards == s],
                     "tables": {}, "makers": ["", "maker"], "version": 1,
                     "optimizer": {"nodes": {"embedding": {"step": 100}}}},
            "tables": {"nodes": {
                "keys": keys[mine],
                "bucket": bucket[mine],
                "frequency": rng.integers(0, 1000, n).astype(np.int64),
                "prov/version": rng.integers(0, 50, n).astype(np.int64),
                "prov/model_step": rng.integers(0, 10000, n).astype(np.int64),
                "prov/maker": rng.integers(0, 2, n).astype(np.int32),
                "prov/wall_time": 1.7e9 + rng.random(n),
                "col/embedding": rng.standard_normal((n, dim), dtype=np.float32),
                "slot/embedding/accum": rng.random((n, dim), dtype=np.float32),
            }},
        })
    return states


def _fsync_file(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_write(states: list[dict], folder: pathlib.Path) -> list[tuple[pathlib.Path, np.dtype, tuple]]:
    folder.mkdir(parents=True)
    files = []
    for st in states:
        for name, a in st["tables"]["nodes"].items():
            p = folder / f"{st['meta']['shard']}-{name.replace('/', '.')}.bin"
            a.tofile(p)
            _fsync_file(p)
            files.append((p, a.dtype, a.shape))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    return files


def raw_read(files: list[tuple[pathlib.Path, np.dtype, tuple]]) -> int:
    total = 0
    for p, dtype, shape in files:
        total += np.fromfile(p, dtype=dtype).reshape(shape).nbytes
    return total


def settle(nbytes: int) -> None:
    """Touch and free a throw-away buffer of ``nbytes`` before the timed reads.

    Right after writing a copy of the bank, the first fresh allocation of that size pays the kernel's
    reclaim of memory (several seconds here for 560 MB, against 0.4 s for a second one); whichever read
    came first would pay it. Paying it here gives both sides the same start.
    """
    buf = np.empty(nbytes, dtype=np.uint8)
    buf.fill(0)
    del buf


def snapshot(states: list[dict], root: pathlib.Path, checksum: bool) -> None:
    h = begin_snapshot(root, 1, chunk_rows=65536, checksum=checksum)
    for st in states:
        write_shard(h, st, delta_seq=0)
    commit_snapshot(h, {"n_shards": len(states)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--reshard", type=int, default=3, help="shard count of the restore-onto-other-shards run")
    ap.add_argument("--buckets", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temp folder)")
    args = ap.parse_args()

    states = make_states(args.rows, args.dim, args.shards, args.buckets)
    nbytes = sum(a.nbytes for st in states for a in st["tables"]["nodes"].values())
    mb = nbytes / 1e6
    print(f"bank: {args.rows} rows x {args.dim} float32 + Adagrad slot + keys/provenance, "
          f"{args.shards} shards, {mb:.0f} MB per copy")
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="carls-bench-", dir=args.dir))
    times: dict[str, list[float]] = {k: [] for k in
                                     ("raw_w", "raw_r", "snap", "rest", "snap_nocrc", "rest_nocrc", "reshard")}
    try:
        for i in range(args.repeat):
            t = time.perf_counter()
            files = raw_write(states, scratch / f"raw{i}")
            times["raw_w"].append(time.perf_counter() - t)
            roots = {}
            for crc, wk in ((True, "snap"), (False, "snap_nocrc")):
                roots[crc] = scratch / f"bank{i}{crc}"
                t = time.perf_counter()
                snapshot(states, roots[crc], checksum=crc)
                times[wk].append(time.perf_counter() - t)
            settle(nbytes)
            t = time.perf_counter()
            raw_read(files)
            times["raw_r"].append(time.perf_counter() - t)
            for crc, rk in ((True, "rest"), (False, "rest_nocrc")):
                t = time.perf_counter()
                got = read_snapshot(roots[crc])
                times[rk].append(time.perf_counter() - t)
                assert got["nodes"]["keys"].shape[0] == args.rows
                del got
            t = time.perf_counter()
            rows = 0
            for s in range(args.reshard):
                part = read_snapshot(roots[True], buckets=range(s, args.buckets, args.reshard))
                rows += part["nodes"]["keys"].shape[0]
                del part
            times["reshard"].append(time.perf_counter() - t)
            assert rows == args.rows
            shutil.rmtree(scratch / f"raw{i}")
            for root in roots.values():
                shutil.rmtree(root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    for title, pick in (("median", statistics.median), ("best", min)):
        med = {k: pick(v) for k, v in times.items()}
        print(f"{title} of {args.repeat} runs:")
        print(f"  {'raw write (tofile + fsync)':<38} {med['raw_w']:6.2f} s  {mb / med['raw_w']:7.0f} MB/s")
        print(f"  {'raw read (fromfile)':<38} {med['raw_r']:6.2f} s  {mb / med['raw_r']:7.0f} MB/s")
        for label, key, base, target in (
            ("snapshot (Zarr, CRC32C, fsync, commit)", "snap", "raw_w", SNAPSHOT_TARGET),
            ("restore (read_snapshot)", "rest", "raw_r", RESTORE_TARGET),
            (f"restore onto {args.reshard} shards (by bucket)", "reshard", "raw_r", None),
            ("snapshot without checksums", "snap_nocrc", "raw_w", None),
            ("restore without checksums", "rest_nocrc", "raw_r", None),
        ):
            ratio = med[base] / med[key]
            verdict = "    " if target is None else ("PASS" if ratio >= target else "FAIL")
            print(f"  {verdict}  {label:<38} {med[key]:6.2f} s  {mb / med[key]:7.0f} MB/s  {ratio:5.2f}x raw  "
                  + ("(no target)" if target is None else f"(target >= {target}x)"))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

if __name__ == "__main__":
    main()
