"""The delta log: durable appends, ordered replay, one writer per shard, torn tails, crash safety."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from carls_dask.errors import (
    CorruptStoreError,
    InvalidBatchError,
    InvalidShapeError,
    LifecycleError,
    StoreLockedError,
)
from carls_dask.storage.bankstore import prune_snapshots
from carls_dask.storage.deltalog import DeltaLog, replay
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard
from tests.processes import read_count
from tests.storage.states import make_states, table_rows

REPO = pathlib.Path(__file__).resolve().parents[2]


def rows(seq: int, n: int = 5) -> dict[str, np.ndarray]:
    keys = np.arange(seq * 10, seq * 10 + n, dtype=np.int64)
    return table_rows(keys, 64, seed=seq)


def test_append_and_replay_round_trip(tmp_path: pathlib.Path) -> None:
    with DeltaLog(tmp_path, 0) as log0, DeltaLog(tmp_path, 1) as log1:
        assert log0.append(3, "nodes", "upsert", rows(1)) == 1
        assert log1.append(3, "nodes", "upsert", rows(2)) == 1
        assert log0.append(4, "nodes", "delete", {"keys": np.array([10, 11], np.int64)}) == 2
        assert log0.append(5, "other", "upsert", rows(3)) == 3
        assert log0.seq == 3 and log1.seq == 1  # what a snapshot of each shard records as delta_seq
    recs = list(replay(tmp_path))
    assert [(r.shard, r.seq, r.step, r.op) for r in recs] == [
        (0, 1, 3, "upsert"), (1, 1, 3, "upsert"), (0, 2, 4, "delete"), (0, 3, 5, "upsert")
    ]
    for name, arr in rows(1).items():
        assert recs[0].arrays[name].dtype == arr.dtype and recs[0].arrays[name].tobytes() == arr.tobytes()
    assert [r.seq for r in replay(tmp_path, since_seq={0: 2})] == [1, 3]
    assert [r.step for r in replay(tmp_path, until_step=3)] == [3, 3]
    assert [r.table for r in replay(tmp_path, tables=["other"])] == ["other"]
    # a new writer continues the sequence
    with DeltaLog(tmp_path, 0) as log0:
        assert log0.append(6, "nodes", "upsert", rows(4)) == 4


def test_one_writer_per_shard(tmp_path: pathlib.Path) -> None:
    log = DeltaLog(tmp_path, 2)
    with pytest.raises(StoreLockedError, match="delta log of shard 2"):
        DeltaLog(tmp_path, 2)
    other = subprocess.run(
        [sys.executable, "-c", f"from carls_dask.storage.deltalog import DeltaLog; DeltaLog({str(tmp_path)!r}, 2)"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert other.returncode != 0 and "StoreLockedError" in other.stderr
    log.close()
    with pytest.raises(LifecycleError, match="closed"):
        log.append(0, "nodes", "upsert", rows(1))
    DeltaLog(tmp_path, 2).close()  # free again once closed


def test_bad_records_are_refused_and_not_written(tmp_path: pathlib.Path) -> None:
    with DeltaLog(tmp_path, 0) as log:
        with pytest.raises(InvalidBatchError, match="op 'merge'"):
            log.append(0, "nodes", "merge", rows(1))
        with pytest.raises(InvalidBatchError, match="lack 'keys'"):
            log.append(0, "nodes", "upsert", {"col/embedding": np.zeros((2, 3), np.float32)})
        with pytest.raises(InvalidShapeError, match=r"'frequency' has shape \(2,\); expected 5 rows"):
            log.append(0, "nodes", "upsert", {**rows(1), "frequency": np.zeros(2, np.int64)})
        with pytest.raises(InvalidBatchError, match="keys float64"):
            log.append(0, "nodes", "delete", {"keys": np.zeros(2)})
        assert log.seq == 0
    assert list(replay(tmp_path)) == []


def test_torn_tail_is_ignored_then_truncated(tmp_path: pathlib.Path) -> None:
    with DeltaLog(tmp_path, 0) as log:
        for i in range(1, 4):
            log.append(i, "nodes", "upsert", rows(i))
    seg = next((tmp_path / "delta/shard-0000").glob("seg-*.log"))
    size = seg.stat().st_size
    with open(seg, "r+b") as fh:  # cut the last record in half
        fh.truncate(size - 40)
    assert [r.seq for r in replay(tmp_path)] == [1, 2]
    with DeltaLog(tmp_path, 0) as log:
        assert log.append(9, "nodes", "upsert", rows(9)) == 3
    assert [(r.seq, r.step) for r in replay(tmp_path)] == [(1, 1), (2, 2), (3, 9)]


def test_segments_roll_replay_since_snapshot_and_prune(tmp_path: pathlib.Path) -> None:
    states = make_states(100, n_shards=1, buckets=64)
    with DeltaLog(tmp_path, 0, segment_bytes=2000) as log:
        for i in range(1, 6):
            log.append(i, "nodes", "upsert", rows(i))
        h = begin_snapshot(tmp_path, 5)
        write_shard(h, states[0], delta_seq=log.seq)  # the state includes the log up to seq 5
        commit_snapshot(h)
        log.roll()
        for i in range(6, 9):
            log.append(i, "nodes", "upsert", rows(i))
        segs = sorted(p.name for p in (tmp_path / "delta/shard-0000").glob("seg-*.log"))
        assert len(segs) >= 4
        assert [r.seq for r in replay(tmp_path, since_version=1)] == [6, 7, 8]
        prune_snapshots(tmp_path, keep=1)
        assert [r.seq for r in replay(tmp_path)] == [6, 7, 8]
        assert log.append(9, "nodes", "upsert", rows(9)) == 9
    # damage in an older segment is an error, not a silent stop
    first = sorted((tmp_path / "delta/shard-0000").glob("seg-*.log"))[0]
    data = bytearray(first.read_bytes())
    data[30] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="damaged record"):
        list(replay(tmp_path))


_APPEND_LOOP = textwrap.dedent(
    """
    import sys
    import numpy as np
    from carls_dask.storage.deltalog import DeltaLog
    from tests.storage.states import table_rows
    log = DeltaLog(sys.argv[1], 0, segment_bytes=1 << 20)
    seq = log.seq
    while True:
        seq += 1
        keys = np.arange(seq * 1000, seq * 1000 + 2000, dtype=np.int64)
        assert log.append(seq, "nodes", "upsert", table_rows(keys, 64, seed=seq, dim=64)) == seq
        print(seq, flush=True)
    """
)


def test_killed_mid_append_keeps_acknowledged_records_and_snapshot(tmp_path: pathlib.Path) -> None:
    from carls_dask.storage.snapshots import read_snapshot
    from tests.storage.states import assert_same, merged, sort_by_key

    states = make_states(500, n_shards=1, buckets=64)
    h = begin_snapshot(tmp_path, 0)
    write_shard(h, states[0], delta_seq=0)
    commit_snapshot(h)
    proc = subprocess.Popen(
        [sys.executable, "-c", _APPEND_LOOP, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    acked = 0
    try:
        assert proc.stdout is not None
        acked = read_count(proc.stdout, 15, "the writer's 15th append", 60)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    recs = list(replay(tmp_path))
    assert len(recs) >= acked  # every acknowledged append survived
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
    for r in recs:
        keys = np.arange(r.seq * 1000, r.seq * 1000 + 2000, dtype=np.int64)
        want = table_rows(keys, 64, seed=r.seq, dim=64)
        assert all(r.arrays[k].tobytes() == want[k].tobytes() for k in want)
    assert_same(sort_by_key(read_snapshot(tmp_path)["nodes"]), merged(states))
    with DeltaLog(tmp_path, 0) as log:  # the next writer resumes after the last complete record
        assert log.seq == len(recs)
