"""The store side of incremental snapshots: increments on a parent, folding, bad input, segmented row stores."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from carls_dask.bank.rowview import RowView
from carls_dask.errors import CorruptStoreError, InvalidBatchError
from carls_dask.storage.bankstore import BankReplay, next_parent
from carls_dask.storage.bankview import open_bank, read_bank
from carls_dask.storage.manifest import list_snapshots
from carls_dask.storage.snapshots import (
    begin_snapshot,
    commit_snapshot,
    read_deleted,
    read_snapshot,
    write_shard,
)
from tests.storage.states import assert_same, bucket_of, make_states, merged, sort_by_key, table_rows

BUCKETS = 64


class Segmented:
    """A row store in fixed-size segments: ``a[i:j]`` and ``a[rows]`` are copies, no numpy view exists."""

    def __init__(self, a: np.ndarray, size: int = 37) -> None:
        self.segments = [a[i : i + size].copy() for i in range(0, a.shape[0], size)]
        self.size = size
        self.shape = a.shape
        self.dtype = a.dtype

    def __getitem__(self, sel: Any) -> np.ndarray:
        if isinstance(sel, slice):
            rows = np.arange(*sel.indices(self.shape[0]))
        else:
            rows = np.asarray(sel)
        out = np.empty((rows.shape[0], *self.shape[1:]), dtype=self.dtype)
        for i, r in enumerate(rows.tolist()):
            out[i] = self.segments[r // self.size][r % self.size]
        return out


def test_a_segmented_row_store_is_written_chunk_by_chunk_bit_for_bit(tmp_path: pathlib.Path) -> None:
    states = make_states(300, n_shards=1, buckets=BUCKETS, seed=3)
    st = states[0]
    views = {"meta": st["meta"], "tables": {t: {n: RowView(Segmented(np.concatenate([a, a[:5]])), a.shape[0])
                                                for n, a in arrays.items()} for t, arrays in st["tables"].items()}}
    h = begin_snapshot(tmp_path, 0, chunk_rows=64)
    write_shard(h, views, delta_seq=0)
    commit_snapshot(h)
    assert_same(merged(states), sort_by_key(read_snapshot(tmp_path)["nodes"]))


def test_an_increment_folds_onto_its_parent_and_bad_increments_are_refused(tmp_path: pathlib.Path) -> None:
    st = make_states(200, n_shards=1, buckets=BUCKETS, seed=4)[0]
    h = begin_snapshot(tmp_path, 1)
    write_shard(h, st, delta_seq=0)
    commit_snapshot(h)
    rows = st["tables"]["nodes"]
    gone = rows["keys"][:5]
    new_keys = np.r_[rows["keys"][10:20], np.array([1 << 45], np.int64)]
    changed = table_rows(new_keys, BUCKETS, seed=9)
    changed["prov/maker"] %= 2
    inc = {"meta": st["meta"], "tables": {"nodes": changed}}
    deleted = {"nodes": {"keys": gone, "bucket": bucket_of(gone, BUCKETS)}}
    with pytest.raises(InvalidBatchError, match=r"expected begin_snapshot\(parent=\.\.\.\)"):
        write_shard(begin_snapshot(tmp_path, 2), inc, delta_seq=0, deleted=deleted)
    with pytest.raises(InvalidBatchError, match="expected a committed version"):
        begin_snapshot(tmp_path, 2, parent=7)
    h2 = begin_snapshot(tmp_path, 2, parent=1)
    with pytest.raises(InvalidBatchError, match="row-aligned 'keys' and 'bucket'"):
        write_shard(h2, inc, delta_seq=0, deleted={"nodes": {"keys": gone}})
    write_shard(h2, inc, delta_seq=0, deleted=deleted, live_rows={"nodes": 196})
    entry = commit_snapshot(h2)
    assert entry["parent"] == 1 and entry["depends"] == [1] and entry["rows"] == {"nodes": 196}
    assert entry["changed_rows"] == 11 and entry["chain"] == 1
    v = entry["version"]  # version 2 was begun and abandoned above
    assert next_parent(tmp_path, 1, 0.5) is None and next_parent(tmp_path, 2, 0.5) == v
    assert next_parent(tmp_path, 2, 0.01) is None  # 11 of 196 rows changed: more than 1 %
    np.testing.assert_array_equal(np.sort(read_deleted(tmp_path, v, 0)["nodes"]["keys"]), np.sort(gone))
    # the folded state: the base without the deleted keys, the changed rows over it
    want = {k: v.copy() for k, v in rows.items()}
    keep = ~np.isin(want["keys"], np.r_[gone, new_keys])
    want = {k: np.concatenate([v[keep], changed[k]]) for k, v in want.items()}
    got = open_bank(tmp_path, table="nodes")
    assert sorted(got["key"].values.tolist()) == sorted(want["keys"].tolist())
    rows, _, _ = read_bank(tmp_path, "nodes")
    want = sort_by_key(want)
    for name in ("keys", "frequency", "prov/version", "col/embedding", "col/neighbours", "slot/embedding/accum"):
        assert rows[name].tobytes() == want[name].tobytes(), name
    batches = list(BankReplay(tmp_path, replay_log=False))
    assert [(b.op, b.layered) for b in batches] == [("upsert", True), ("delete", True), ("upsert", True)]
    assert [e["version"] for e in list_snapshots(tmp_path)] == [1, v]


def test_a_tampered_parent_is_refused(tmp_path: pathlib.Path) -> None:
    import json

    st = make_states(20, n_shards=1, buckets=BUCKETS, seed=5)[0]
    h = begin_snapshot(tmp_path, 1)
    write_shard(h, st, delta_seq=0)
    commit_snapshot(h)
    path = h.path / "snapshot.json"
    man = json.loads(path.read_text())
    man["shards"]["0"]["parent"] = 5  # not older than the version itself
    path.write_text(json.dumps(man))
    with pytest.raises(CorruptStoreError, match="expected None or an older version"):
        list(BankReplay(tmp_path, replay_log=False))
