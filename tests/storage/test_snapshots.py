"""Bank snapshots: exact round trips, restore onto other shard counts, versions, bad input, crash safety."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from carls_dask.errors import (
    CorruptStoreError,
    IncompatibleStoreError,
    InvalidBatchError,
    InvalidShapeError,
    LifecycleError,
    StoreLockedError,
    StoreNotFoundError,
)
from carls_dask.storage.bankstore import prune_snapshots
from carls_dask.storage.bankview import open_bank
from carls_dask.storage.fsutil import WriterLock
from carls_dask.storage.manifest import list_snapshots, read_manifest
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, read_snapshot, write_shard
from tests.processes import wait_for
from tests.storage.states import assert_same, make_states, merged, snapshot, sort_by_key

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_roundtrip_is_bit_for_bit(tmp_path: pathlib.Path) -> None:
    states = make_states(3000, n_shards=2, buckets=64, seed=1)
    entry = snapshot(tmp_path, states, step=5, chunk_rows=256)
    assert entry["version"] == 1 and entry["step"] == 5 and entry["rows"] == {"nodes": 3000}
    got = read_snapshot(tmp_path)
    assert_same(sort_by_key(got["nodes"]), merged(states))
    man = read_manifest(tmp_path)
    assert man["makers"] == ["maker-0-a", "common", "maker-1-a"]
    assert man["meta"] == {"name": "bank", "n_shards": 2}
    assert man["shards"]["1"]["meta"]["optimizer"] == {"nodes": {"embedding": {"step": 12}}}
    assert man["tables"]["nodes"]["arrays"]["col/neighbours"] == {"dtype": "<i8", "shape": [4]}
    # rows inside each shard's arrays are sorted by bucket
    one = read_snapshot(tmp_path, buckets=range(64))
    b = one["nodes"]["bucket"]
    n0 = man["shards"]["0"]["tables"]["nodes"]["rows"]
    assert np.all(np.diff(b[:n0]) >= 0) and np.all(np.diff(b[n0:]) >= 0)


@pytest.mark.parametrize("compressor", ["none", "zstd"])
def test_compressors_roundtrip(tmp_path: pathlib.Path, compressor: str) -> None:
    states = make_states(500, n_shards=1, seed=2)
    snapshot(tmp_path, states, chunk_rows=100, compressor=compressor)
    assert_same(sort_by_key(read_snapshot(tmp_path)["nodes"]), merged(states))


def test_restore_onto_three_shards_reads_each_bucket_once(tmp_path: pathlib.Path) -> None:
    states = make_states(4000, n_shards=2, buckets=64, seed=3)
    snapshot(tmp_path, states, chunk_rows=128)
    parts = []
    for s in range(3):
        owned = [b for b in range(64) if b % 3 == s]
        got = read_snapshot(tmp_path, buckets=owned)["nodes"]
        assert set(np.unique(got["bucket"]).tolist()) <= set(owned)
        parts.append(got)
    union = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    assert_same(sort_by_key(union), merged(states))
    # subset reads: names filter and an empty bucket set
    only = read_snapshot(tmp_path, buckets=[], names=["col/embedding"])["nodes"]
    assert sorted(only) == ["bucket", "col/embedding", "keys"] and only["keys"].shape == (0,)
    assert only["col/embedding"].shape == (0, 8)


def test_versions_list_and_prune(tmp_path: pathlib.Path) -> None:
    for v in range(1, 4):
        snapshot(tmp_path, make_states(200, n_shards=2, seed=v), step=10 * v)
    abandoned = begin_snapshot(tmp_path, 99)  # never committed
    assert [e["version"] for e in list_snapshots(tmp_path)] == [1, 2, 3]
    assert [e["step"] for e in list_snapshots(tmp_path)] == [10, 20, 30]
    assert abandoned.version == 4
    snapshot(tmp_path, make_states(200, n_shards=2, seed=6), step=60)  # v5
    h6 = begin_snapshot(tmp_path, 70)  # in progress, newer than every committed one: kept
    removed = prune_snapshots(tmp_path, keep=2)
    assert removed == [1, 2, 4]
    assert [e["version"] for e in list_snapshots(tmp_path)] == [3, 5]
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == ["v000003", "v000005", "v000006"]
    assert h6.version == 6
    assert_same(sort_by_key(read_snapshot(tmp_path, version=3)["nodes"]), merged(make_states(200, n_shards=2, seed=3)))
    with pytest.raises(StoreNotFoundError, match=r"no snapshot version 1; committed versions are \[3, 5\]"):
        read_snapshot(tmp_path, version=1)
    with pytest.raises(InvalidBatchError, match="keep=0"):
        prune_snapshots(tmp_path, keep=0)


def test_commit_with_missing_shard_changes_nothing(tmp_path: pathlib.Path) -> None:
    states = make_states(100, n_shards=2)
    snapshot(tmp_path, states)
    before = (tmp_path / "manifest.json").read_bytes()
    h = begin_snapshot(tmp_path, 1)
    write_shard(h, states[0], delta_seq=0)
    with pytest.raises(LifecycleError, match=r"shards \[1\] are not written"):
        commit_snapshot(h)
    assert (tmp_path / "manifest.json").read_bytes() == before
    write_shard(h, states[1], delta_seq=0)
    commit_snapshot(h)
    with pytest.raises(LifecycleError, match="already committed"):
        commit_snapshot(h)
    with pytest.raises(LifecycleError, match="already committed"):
        write_shard(h, states[0], delta_seq=0)


def test_second_writer_of_a_shard_is_refused(tmp_path: pathlib.Path) -> None:
    states = make_states(100, n_shards=2)
    h = begin_snapshot(tmp_path, 0)
    write_shard(h, states[0], delta_seq=0)
    files = sorted(p.name for p in h.path.iterdir())
    with pytest.raises(StoreLockedError, match="shard 0"):
        write_shard(h, states[0], delta_seq=0)
    assert sorted(p.name for p in h.path.iterdir()) == files


def test_bad_states_are_refused_before_writing(tmp_path: pathlib.Path) -> None:
    good = make_states(50, n_shards=1)[0]
    h = begin_snapshot(tmp_path, 0)
    bad_rows = {**good, "tables": {"nodes": {**good["tables"]["nodes"], "frequency": np.zeros(3, np.int64)}}}
    with pytest.raises(InvalidShapeError, match=r"'frequency': shape \(3,\); expected 50 rows"):
        write_shard(h, bad_rows, delta_seq=0)
    bad_fmt = {**good, "meta": {**good["meta"], "format": 9}}
    with pytest.raises(IncompatibleStoreError, match="meta format is 9"):
        write_shard(h, bad_fmt, delta_seq=0)
    bad_bucket = {**good, "tables": {"nodes": {**good["tables"]["nodes"], "bucket": np.full(50, 64, np.int32)}}}
    with pytest.raises(InvalidBatchError, match=r"bucket values in \[64, 64\]; expected \[0, 64\)"):
        write_shard(h, bad_bucket, delta_seq=0)
    obj = {**good, "tables": {"nodes": {**good["tables"]["nodes"], "col/x": np.array(["a"] * 50, dtype=object)}}}
    with pytest.raises(InvalidBatchError, match="expected a numeric dtype"):
        write_shard(h, obj, delta_seq=0)
    assert list(h.path.iterdir()) == []
    with pytest.raises(InvalidBatchError, match="compressor"):
        begin_snapshot(tmp_path, 0, compressor="lz5")


def test_missing_incompatible_and_corrupt_stores(tmp_path: pathlib.Path) -> None:
    with pytest.raises(StoreNotFoundError, match="no such folder"):
        read_snapshot(tmp_path / "nope")
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(StoreNotFoundError, match="no committed snapshot"):
        read_snapshot(tmp_path / "empty")
    root = tmp_path / "bank"
    snapshot(root, make_states(600, n_shards=1), chunk_rows=100)
    man = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**man, "format": 2}))
    with pytest.raises(IncompatibleStoreError, match="format version is 2; this carls-dask reads format 1"):
        list_snapshots(root)
    with pytest.raises(IncompatibleStoreError):
        begin_snapshot(root, 1)
    assert [p.name for p in (root / "snapshots").iterdir()] == ["v000001"]
    (root / "manifest.json").write_text(json.dumps(man))
    chunk = root / "snapshots/v000001/shard-0000.zarr/nodes/col/embedding/c/2/0"
    data = bytearray(chunk.read_bytes())
    data[10] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match=r"chunk c/2/0 .* checksum mismatch"):
        read_snapshot(root)
    with pytest.raises(CorruptStoreError, match=r"cannot read rows 0:600: .*checksum"):  # the lazy view checks too
        open_bank(root)["embedding"].load()
    chunk.write_bytes(bytes(data[:-100]))
    with pytest.raises(CorruptStoreError, match=r"chunk c/2/0 .* has 3104 bytes; expected 3204"):
        read_snapshot(root)
    chunk.unlink()
    with pytest.raises(CorruptStoreError, match=r"chunk c/2/0 .* is missing"):
        read_snapshot(root)
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(CorruptStoreError, match="not valid JSON"):
        list_snapshots(root)


_SNAPSHOT_LOOP = textwrap.dedent(
    """
    import sys
    from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard
    from tests.storage.states import make_states
    root, first = sys.argv[1], int(sys.argv[2])
    v = first
    while True:
        h = begin_snapshot(root, v, chunk_rows=8192)
        for st in make_states(60000, n_shards=2, seed=v, dim=32):
            write_shard(h, st, delta_seq=0)
        commit_snapshot(h, {"seed": v})
        print(v, flush=True)
        v += 1
    """
)


def test_killed_mid_snapshot_leaves_previous_complete(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "bank"
    snapshot(root, make_states(60000, n_shards=2, seed=1, dim=32), step=1, chunk_rows=8192)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SNAPSHOT_LOOP, str(root), "2"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        # wait until the writer is inside a shard write of a not-yet-committed version, then kill it
        wait_for(lambda: list(root.glob("snapshots/*/shard-0001.writing")), "the writer starting a shard", 60,
                 interval=0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    entries = list_snapshots(root)
    last = entries[-1]
    assert not (root / "snapshots" / f"v{last['version'] + 1:06d}" / "snapshot.json").exists()
    seed = read_manifest(root)["meta"].get("seed", 1)
    assert last["step"] == seed
    assert_same(sort_by_key(read_snapshot(root)["nodes"]), merged(make_states(60000, n_shards=2, seed=seed, dim=32)))
    # the store stays writable: the next snapshot takes a fresh version and prune clears the debris
    nxt = snapshot(root, make_states(10, n_shards=2, seed=9), step=100)
    assert nxt["version"] > last["version"] + 1
    prune_snapshots(root, keep=1)
    assert [p.name for p in (root / "snapshots").iterdir()] == [f"v{nxt['version']:06d}"]
    assert os.listdir(root / "snapshots" / f"v{nxt['version']:06d}").count("snapshot.json") == 1


def test_a_shard_write_left_by_a_dead_writer_is_taken_over_and_a_live_one_is_refused(tmp_path: pathlib.Path) -> None:
    """A killed shard writer leaves its ``.writing`` marker and part of its arrays; the shard's re-homed
    actor, retrying the same snapshot, writes the shard again. A writer still alive holds the marker's lock."""
    states = make_states(3000, n_shards=2, seed=3, dim=8)
    h = begin_snapshot(tmp_path, 7, chunk_rows=500)
    write_shard(h, states[0], delta_seq=0)
    left = h.path / "shard-0001.writing"
    left.write_text("pid 0")  # what a writer killed mid-write leaves: its marker, unlocked, and some of its parts
    (h.path / "shard-0001.zarr" / "nodes").mkdir(parents=True)
    (h.path / "shard-0001.zarr" / "nodes" / "junk").write_bytes(b"half a chunk")
    with WriterLock(left, "a live writer of shard 1"):
        with pytest.raises(StoreLockedError, match="shard 1: another writer already writes this shard"):
            write_shard(h, states[1], delta_seq=0)
    assert (h.path / "shard-0001.zarr" / "nodes" / "junk").exists()  # the refused write changed nothing
    write_shard(h, states[1], delta_seq=0)
    assert not left.exists() and not (h.path / "shard-0001.zarr" / "nodes" / "junk").exists()
    with pytest.raises(StoreLockedError, match="already written in this snapshot"):
        write_shard(h, states[1], delta_seq=0)
    commit_snapshot(h, {"name": "bank", "n_shards": 2})
    assert_same(sort_by_key(read_snapshot(tmp_path)["nodes"]), merged(states))


def test_all_zero_arrays_are_stored_and_read(tmp_path: pathlib.Path) -> None:
    st = make_states(300, n_shards=1, seed=8)[0]
    for name in ("frequency", "col/logits", "slot/embedding/accum"):
        st["tables"]["nodes"][name] = np.zeros_like(st["tables"]["nodes"][name])
    snapshot(tmp_path, [st], chunk_rows=100)
    assert_same(sort_by_key(read_snapshot(tmp_path)["nodes"]), merged([st]))


def test_restore_into_other_dims_is_refused(tmp_path: pathlib.Path) -> None:
    snapshot(tmp_path, make_states(100, n_shards=1, dim=8))
    ok = read_snapshot(tmp_path, expect={"nodes": {"col/embedding": ("float32", (8,))}})
    assert ok["nodes"]["col/embedding"].shape == (100, 8)
    with pytest.raises(IncompatibleStoreError, match=r"'col/embedding' is float32\[8\] per row; expected float32\[16\]"):
        read_snapshot(tmp_path, expect={"nodes": {"col/embedding": ("float32", (16,))}})
    with pytest.raises(IncompatibleStoreError, match=r"'col/logits' is float32\[3\] per row; expected float64\[3\]"):
        read_snapshot(tmp_path, expect={"nodes": {"col/logits": (np.float64, (3,))}})
    with pytest.raises(IncompatibleStoreError, match="has no array 'col/text'"):
        read_snapshot(tmp_path, expect={"nodes": {"col/text": ("int64", ())}})
