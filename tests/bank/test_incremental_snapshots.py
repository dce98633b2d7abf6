"""Incremental snapshots: a snapshot holds only what changed since the previous one, and restores exactly.

A bank takes a full snapshot, then increments (updates, gradients with duplicate keys, deletes, a key
deleted and inserted again); each version restored without the delta log (on 1, 2 and 3 shards) must hold
exactly the state the live bank had when it was taken, and the newest plus the log the live state.
Compaction makes every N-th snapshot full; pruning keeps the versions an increment is read from; a
snapshot whose write fails, or that is never committed, loses no change.
"""

from __future__ import annotations

import pathlib

import dask.config
import numpy as np
import pytest

from carls_dask.bank import KnowledgeBank
from carls_dask.bank.actor import BankShard
from carls_dask.errors import StoreLockedError
from carls_dask.storage.bankstore import prune_snapshots
from carls_dask.storage.bankview import read_bank
from carls_dask.storage.fsutil import WriterLock
from carls_dask.storage.manifest import list_snapshots, read_manifest
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot
from tests.bank.optimizer_tables import TABLES, apply_all, assert_bit_identical, full_state, specs, start

BUCKETS = 32


def restore(transport: str, request: pytest.FixtureRequest, root: str, n: int, version: int | None,
            replay_log: bool) -> KnowledgeBank:
    if transport == "local":
        return KnowledgeBank.restore_local(root, n_shards=n, version=version, replay_log=replay_log)
    return KnowledgeBank.restore(request.getfixturevalue("client"), root, n_shards=n, version=version,
                                 replay_log=replay_log)


def stored_rows(root: str, version: int) -> int:
    man = read_manifest(root, version)
    return sum(int(t.get("stored", t["rows"])) for i in man["shards"].values() for t in i["tables"].values())


@pytest.mark.parametrize("transport", ["local", "dask"])
def test_full_then_increments_restore_exactly_on_any_shard_count(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, transport: str
) -> None:
    root = str(tmp_path / "bank")
    rng = np.random.default_rng(7)
    live = start(transport, request, 2, root)
    try:
        keys = rng.choice(10**6, size=400, replace=False).astype(np.int64)
        for t in TABLES:
            live.lookup(t, keys, insert=True)
        v1 = live.snapshot(root, step=1)
        states = {v1: full_state(live)}
        # a few rows change, some keys go, one comes back
        apply_all(live, rng, np.r_[keys[:20], keys[:5]])
        for t in TABLES:
            dt = np.dtype(t.split("_")[1])
            live.update(t, keys[30:34], {"bias": rng.normal(size=4).astype(dt)}, model_step=5, maker="teacher")
            live.delete(t, keys[100:110])
            live.lookup(t, np.r_[keys[100:101], [5_000_000]], insert=True)  # re-inserted and new
        v2 = live.snapshot(root, step=2)
        states[v2] = full_state(live)
        for t in TABLES:
            live.delete(t, np.r_[keys[:3], [5_000_000]])  # a key the last increment added goes again
            live.lookup(t, keys[200:210], insert=True)  # frequency only
        apply_all(live, rng, keys[40:45])
        v3 = live.snapshot(root, step=3)
        states[v3] = full_state(live)
        apply_all(live, rng, keys[300:310])  # only in the delta log
        final = full_state(live)
        man2, man3 = read_manifest(root, v2), read_manifest(root, v3)
        assert all(i["parent"] == v1 for i in man2["shards"].values())
        assert all(i["parent"] == v2 for i in man3["shards"].values())
        entries = {e["version"]: e for e in list_snapshots(root)}
        assert entries[v3]["depends"] == [v1, v2] and entries[v3]["chain"] == 2
        assert entries[v3]["rows"] == {t: 400 - 10 + 1 + 1 - 4 for t in TABLES}
        # an increment stores the changed rows only
        assert stored_rows(root, v2) < stored_rows(root, v1) / 5
        assert sum(int(t["deleted"]) for i in man2["shards"].values() for t in i["tables"].values()) == 9 * len(TABLES)
        for n in (1, 2, 3):
            for v in (v1, v2, v3):
                restored = restore(transport, request, root, n, v, replay_log=False)
                try:
                    assert_bit_identical(states[v], full_state(restored))
                finally:
                    restored.close()
        restored = restore(transport, request, root, 3, None, replay_log=True)
        try:
            assert_bit_identical(final, full_state(restored))
        finally:
            restored.close()
    finally:
        live.close()


def test_offline_reader_folds_increments_and_reads_to_a_step(tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "bank")
    rng = np.random.default_rng(8)
    live = start("local", None, 2, root)  # type: ignore[arg-type]
    try:
        keys = rng.choice(10**6, size=200, replace=False).astype(np.int64)
        table = TABLES[1]
        live.lookup(table, keys, insert=True)
        live.snapshot(root, step=1)
        live.set_step(2)
        live.delete(table, keys[:7])
        apply_all(live, rng, keys[10:30])
        live.snapshot(root, step=3)
        at3 = full_state(live)[table]
        live.set_step(4)
        live.delete(table, keys[50:52])
        at4 = full_state(live)[table]
        for step, want in ((3, at3), (4, at4)):
            rows, makers, _ = read_bank(root, table, step)
            names = np.array(makers, dtype=object)
            assert rows["keys"].tolist() == want["keys"].tolist()
            for name in want:
                got = names[rows[name]] if name == "prov/maker" else rows[name]
                if name == "prov/maker":
                    assert got.tolist() == want[name].tolist()
                else:
                    assert got.tobytes() == want[name].tobytes(), name
    finally:
        live.close()


def test_compaction_makes_every_nth_snapshot_full_and_full_true_forces_one(tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "bank")
    rng = np.random.default_rng(9)
    keys = rng.choice(10**6, size=300, replace=False).astype(np.int64)
    with dask.config.set({"carls.bank.snapshot-compact-every": 2, "carls.bank.snapshot-compact-fraction": 0.5}):
        live = start("local", None, 1, root)  # type: ignore[arg-type]
        try:
            for t in TABLES:
                live.lookup(t, keys, insert=True)
            parents = []
            for step in range(1, 6):
                apply_all(live, rng, keys[step * 3 : step * 3 + 3])
                v = live.snapshot(root, step=step)
                parents.append(read_manifest(root, v)["parent"])
            assert parents == [None, 1, 2, None, 4]
            v = live.snapshot(root, step=6, full=True)
            assert read_manifest(root, v)["parent"] is None
            apply_all(live, rng, keys)  # every row changed: more than half of the rows
            v = live.snapshot(root, step=7)
            assert read_manifest(root, v)["shards"]["0"]["parent"] is None  # the shard wrote in full
            apply_all(live, rng, keys[:3])
            v8 = live.snapshot(root, step=8)  # an increment on the new base
            assert read_manifest(root, v8)["parent"] == v
            v9 = live.snapshot(root, step=9)
            assert read_manifest(root, v9)["parent"] == v8
            state = full_state(live)
        finally:
            live.close()
    restored = KnowledgeBank.restore_local(root, n_shards=2, replay_log=False)
    try:
        assert_bit_identical(state, full_state(restored))
    finally:
        restored.close()


def test_pruning_keeps_the_versions_an_increment_is_read_from(tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "bank")
    rng = np.random.default_rng(10)
    keys = rng.choice(10**6, size=100, replace=False).astype(np.int64)
    live = start("local", None, 2, root)  # type: ignore[arg-type]
    try:
        for t in TABLES:
            live.lookup(t, keys, insert=True)
        live.snapshot(root, step=1)
        for step in (2, 3):
            apply_all(live, rng, keys[step : step + 4])
            live.snapshot(root, step=step)
        state = full_state(live)
        assert prune_snapshots(root, keep=1) == []  # v3 is read from v2 and v1
        assert [e["version"] for e in list_snapshots(root)] == [1, 2, 3]
        restored = KnowledgeBank.restore_local(root, replay_log=False)
        try:
            assert_bit_identical(state, full_state(restored))
        finally:
            restored.close()
        live.snapshot(root, step=4, full=True)
        assert prune_snapshots(root, keep=1) == [1, 2, 3]
        assert [e["version"] for e in list_snapshots(root)] == [4]
    finally:
        live.close()


def test_a_failed_or_uncommitted_snapshot_loses_no_change(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "bank"
    shard = BankShard([s.to_json() for s in specs()], 0, 1, BUCKETS)
    table = TABLES[2]
    rng = np.random.default_rng(11)
    keys = rng.choice(10**6, size=50, replace=False).astype(np.int64)
    shard.lookup(table, keys, insert=True)
    h1 = begin_snapshot(root, 1)
    shard.snapshot(h1)
    commit_snapshot(h1)
    assert shard.settle_snapshot() is True
    at1 = shard.export_state()
    shard.apply_gradients(table, keys[:5], rng.normal(size=(5, 4)).astype(np.float32))
    shard.delete(table, keys[10:12])
    # a write that fails: another writer holds the shard's marker
    h2 = begin_snapshot(root, 2, parent=1)
    with WriterLock(h2.path / "shard-0000.writing", "another writer of shard 0"), pytest.raises(StoreLockedError):
        shard.snapshot(h2)
    # a write that succeeds but is never committed (the committer died)
    h3 = begin_snapshot(root, 3, parent=1)
    shard.snapshot(h3)
    shard.update(table, keys[20:21], {"label": np.array([9])})
    assert_same_shard(at1, restored_state(root, 1))  # the failures left v1 whole
    h4 = begin_snapshot(root, 4, parent=1)
    shard.snapshot(h4)  # settles v3 first: not committed, so its changes count again
    commit_snapshot(h4)
    man = read_manifest(root, 4)
    assert man["shards"]["0"]["parent"] == 1
    assert man["shards"]["0"]["tables"][table]["stored"] == 6 and man["shards"]["0"]["tables"][table]["deleted"] == 2
    assert_same_shard(shard.export_state(), restored_state(root, 4))


def restored_state(root: pathlib.Path, version: int) -> dict:
    restored = BankShard([s.to_json() for s in specs()], 0, 1, BUCKETS)
    restored.restore(str(root), version, replay_log=False)
    return restored.export_state()


def assert_same_shard(want: dict, got: dict) -> None:
    """Two one-shard states hold the same rows (maker codes aside: each shard numbers its own)."""
    for t in TABLES:
        a, b = want["tables"][t], got["tables"][t]
        oa, ob = np.argsort(a["keys"]), np.argsort(b["keys"])
        for name in a:
            if name == "prov/maker":
                continue
            assert a[name][oa].tobytes() == b[name][ob].tobytes(), (t, name)
