"""The bank store: snapshot rows then decoded delta records (BankReplay), the maker codec, restore points."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from carls_dask.errors import CorruptStoreError, StoreNotFoundError
from carls_dask.storage.bankstore import MAKERS_TABLE, BankReplay, decode_makers, encode_makers, restore_point
from carls_dask.storage.deltalog import DeltaLog
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard
from tests.storage.states import bucket_of, make_states, table_rows

BUCKETS = 64


def test_maker_codec_round_trips_and_cuts_long_names_whole() -> None:
    long = "é" * 200  # 400 UTF-8 bytes: cut to 256 bytes at a character boundary
    arrays = encode_makers([1, 2, 5], ["trainer", "maker/ü", long])
    assert arrays["keys"].dtype == np.int64 and arrays["name_utf8"].shape == (3, 256)
    assert decode_makers(arrays) == {1: "trainer", 2: "maker/ü", 5: "é" * 128}
    with pytest.raises(CorruptStoreError, match="expected 'keys' and 'name_utf8'"):
        decode_makers({"keys": arrays["keys"]})


def test_replay_yields_snapshot_rows_then_decoded_records_of_owned_buckets(tmp_path: pathlib.Path) -> None:
    states = make_states(400, n_shards=2, buckets=BUCKETS, seed=6)
    h = begin_snapshot(tmp_path, 10)
    logs = [DeltaLog(tmp_path, s) for s in range(2)]
    try:
        logs[0].append(9, "nodes", "upsert", table_rows(np.array([5], np.int64), BUCKETS, seed=1))  # in the snapshot
        for st, log in zip(states, logs, strict=True):
            write_shard(h, st, delta_seq=log.seq)
        commit_snapshot(h, {"n_shards": 2})
        logs[1].append(11, MAKERS_TABLE, "upsert", encode_makers([2], ["late"]))
        keys = np.arange(100, 140, dtype=np.int64)
        up = table_rows(keys, BUCKETS, seed=2)
        up["prov/maker"] = np.full(keys.size, 2, np.int32)  # shard 1's code 2: "late"
        up["slot/embedding/step"] = np.arange(keys.size, dtype=np.int64) + 7  # a per-row int64 slot
        logs[1].append(11, "nodes", "upsert", up)
        logs[0].append(12, "nodes", "delete", {"keys": keys[:3], "bucket": bucket_of(keys[:3], BUCKETS)})
    finally:
        for log in logs:
            log.close()
    owned = [b for b in range(BUCKETS) if b % 3 == 0]
    replay = BankReplay(tmp_path, buckets=owned)
    batches = list(replay)
    assert replay.version == 1
    assert [(b.seq == 0, b.shard) for b in batches[:2]] == [(True, 0), (True, 1)]
    assert all(not b.from_snapshot for b in batches[2:])
    assert (0, 1) not in [(b.shard, b.seq) for b in batches]  # that record is in the snapshot already
    for b in batches:
        assert set(np.unique(b.arrays["bucket"]).tolist()) <= set(owned)
    upsert = next(b for b in batches if b.op == "upsert" and not b.from_snapshot)
    mine = np.isin(bucket_of(keys, BUCKETS), owned)
    np.testing.assert_array_equal(upsert.arrays["keys"], keys[mine])
    assert upsert.arrays["slot/embedding/step"].tobytes() == (np.arange(keys.size, dtype=np.int64) + 7)[mine].tobytes()
    assert {upsert.makers[c] for c in upsert.arrays["prov/maker"].tolist()} == {"late"}
    assert replay.makers[: len(upsert.makers)] == upsert.makers  # codes handed out never change
    # a bank started from this snapshot logs into another store: its whole log comes after the snapshot
    other = tmp_path / "other"
    with DeltaLog(other, 0) as log:
        log.append(20, "nodes", "upsert", table_rows(np.array([7], np.int64), BUCKETS, seed=3))
    again = list(BankReplay(tmp_path, 1, log_root=other))
    assert [(b.shard, b.seq) for b in again if not b.from_snapshot] == [(0, 1)]
    assert [b.seq for b in BankReplay(None, log_root=other)] == [1]


def test_restore_point_prefers_the_store_then_the_base(tmp_path: pathlib.Path) -> None:
    assert restore_point(tmp_path / "none") == (None, None)
    assert restore_point(tmp_path / "none", ("elsewhere", 3)) == ("elsewhere", 3)
    h = begin_snapshot(tmp_path, 0)
    write_shard(h, make_states(20, n_shards=1)[0], delta_seq=0)
    commit_snapshot(h)
    assert restore_point(tmp_path, ("elsewhere", 3)) == (str(tmp_path), 1)
    with pytest.raises(StoreNotFoundError, match="expected root or log_root"):
        BankReplay(None)
