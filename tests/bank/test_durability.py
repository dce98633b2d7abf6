"""Per-table durability on in-process banks: what each policy logs and syncs, the disk reserve, the fence of a
snapshot-kept table after its shard was rebuilt, and the log a committed snapshot truncates. No cluster."""

from __future__ import annotations

import os
import pathlib
import shutil
import threading

import dask
import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from carls_dask.bank.actor import BankShard
from carls_dask.errors import ConfigError, DiskReserveError, RolledBackError, StoreNotFoundError
from carls_dask.storage import open_bank
from carls_dask.storage.bankstore import store_bytes
from carls_dask.storage.deltalog import DeltaLog, replay
from carls_dask.storage.manifest import list_snapshots

BUCKETS = 16


def made(durability: str | None = "every-write", name: str = "made") -> TableSpec:
    return TableSpec(name, columns=(Column("value", shape=(4,)),), optimizer=None, durability=durability)


def trained(durability: str | None = "snapshot") -> TableSpec:
    return TableSpec("trained", columns=(Column("embedding", shape=(4,)),), optimizer="sgd", learning_rate=0.5,
                     initializer="zeros", init_scale=0.0, durability=durability)


def values(keys: np.ndarray, i: float) -> np.ndarray:
    return np.full((keys.size, 4), i, np.float32) + keys[:, None].astype(np.float32)


def test_a_policy_is_checked_kept_in_json_and_resolved_from_the_configuration() -> None:
    with pytest.raises(ConfigError, match=r"table 'x': durability 'always' is not one of \('every-write', 'group', "
                                          r"'snapshot'\)"):
        TableSpec("x", durability="always")
    spec = made("group")
    assert TableSpec.from_json(spec.to_json()) == spec and TableSpec.from_json(made(None).to_json()).durability is None
    with dask.config.set({"carls.bank.durability": "group"}), KnowledgeBank.local([made(None), trained()]) as bank:
        assert bank.durability == {"made": "group", "trained": "snapshot"}
    with dask.config.set({"carls.bank.durability": "sometimes"}), pytest.raises(
            ConfigError, match=r"carls.bank.durability: durability 'sometimes'; expected one of"):
        KnowledgeBank.local([made(None)])


def test_a_run_gives_trained_and_written_tables_their_defaults() -> None:
    from carls_dask.runtime.durability import run_tables

    got = run_tables([made(None), trained(None), made("group", "other")])
    assert [t.durability for t in got] == ["every-write", "snapshot", "group"]
    with dask.config.set({"carls.run.durability.trained": "group", "carls.run.durability.written": "snapshot"}):
        assert [t.durability for t in run_tables([made(None), trained(None)])] == ["snapshot", "group"]
    with dask.config.set({"carls.run.durability.trained": "never"}), pytest.raises(
            ConfigError, match=r"carls.run.durability.trained: durability 'never'"):
        run_tables([trained(None)])


def test_every_write_syncs_each_call_and_snapshot_tables_log_nothing(tmp_path: pathlib.Path) -> None:
    keys = np.arange(40, dtype=np.int64)
    with KnowledgeBank.local([made(), trained()], n_shards=1, buckets=BUCKETS, log_root=str(tmp_path)) as bank:
        for i in range(5):
            bank.update("made", keys, {"value": values(keys, i)}, maker="m")
            bank.lookup("trained", keys, insert=True)
            bank.apply_gradients("trained", keys, np.ones((keys.size, 4), np.float32))
        log = bank.stats()["shards"][0]["log"]
    assert log["frames"] == 6 and log["syncs"] == 5  # the maker's name rides with the first write's sync
    assert log["durable_seq"] == log["seq"] == 6
    assert {r.table for r in replay(tmp_path)} == {"made", "__makers__"}
    with KnowledgeBank.local([trained()], n_shards=1, buckets=BUCKETS, log_root=str(tmp_path / "only")) as bank:
        bank.lookup("trained", keys, insert=True)
        assert bank.stats()["shards"][0]["log"] is None
    assert not (tmp_path / "only" / "delta").exists()


def test_group_commit_syncs_once_per_group_and_bounds_the_window(tmp_path: pathlib.Path) -> None:
    keys = np.arange(32, dtype=np.int64)
    conf = {"carls.bank.log.group-interval": "1h"}  # no timer sync in this test: only the byte bound syncs
    with dask.config.set(conf), KnowledgeBank.local([made("group")], n_shards=1, buckets=BUCKETS,
                                                    log_root=str(tmp_path / "probe")) as bank:
        bank.update("made", keys, {"value": values(keys, 0)})
        frame = bank.stats()["shards"][0]["log"]["bytes"]  # one frame of 32 rows
    # frames differ by a few bytes of header (the sequence number's digits, the time's): 9.5 frames close a group
    # at its 10th frame whatever those bytes
    with dask.config.set({**conf, "carls.bank.log.group-bytes": int(9.5 * frame)}), KnowledgeBank.local(
            [made("group")], n_shards=1, buckets=BUCKETS, log_root=str(tmp_path / "run")) as bank:
        for i in range(95):
            bank.update("made", keys, {"value": values(keys, i)})
        log = bank.stats()["shards"][0]["log"]
        assert log["frames"] == 95 and log["syncs"] == 9  # every 10th frame closes a group
        assert log["durable_seq"] == 90 and 4.9 * frame < log["unsynced_bytes"] < 5.1 * frame
        assert 9.9 * frame < log["max_unsynced_bytes"] < 10.1 * frame  # the window: group-bytes and one frame at most
        bank.sync()  # a writer that must know: one more sync covers the rest
        log = bank.stats()["shards"][0]["log"]
        assert log["syncs"] == 10 and log["durable_seq"] == log["seq"] == 95


def test_one_sync_serves_every_writer_waiting_on_it(tmp_path: pathlib.Path) -> None:
    log = DeltaLog(tmp_path, 0, sync=False, group_interval=3600.0)
    try:
        keys = np.arange(8, dtype=np.int64)
        for i in range(3):
            log.append(i, "t", "upsert", {"keys": keys, "v": np.full((8, 2), i, np.float32)})
        start = threading.Barrier(8)

        def wait() -> None:
            start.wait()
            log.flush()

        threads = [threading.Thread(target=wait) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert log.syncs == 1 and log.durable_seq == 3
    finally:
        log.close()


def _shard_args(bank: KnowledgeBank, root: pathlib.Path) -> tuple[object, ...]:
    shard = bank.transport.local_shard(0)
    return ([t.to_json() for t in bank.tables.values()], 0, 1, BUCKETS, shard.core.owned_buckets.tolist(), 64,
            str(root), True, {"reserve": 0})


def test_a_rebuilt_shard_brings_snapshot_tables_back_at_the_snapshot_and_fences_them(tmp_path: pathlib.Path) -> None:
    keys = np.arange(30, dtype=np.int64)
    grads = np.ones((keys.size, 4), np.float32)
    bank = KnowledgeBank.local([made(), trained()], n_shards=1, buckets=BUCKETS, log_root=str(tmp_path))
    try:
        bank.lookup("trained", keys, insert=True)
        bank.apply_gradients("trained", keys, grads)  # -0.5
        bank.set_step(10)
        bank.snapshot(str(tmp_path), 10)
        bank.apply_gradients("trained", keys, grads)  # -1.0: after the snapshot, in memory only
        bank.update("made", keys, {"value": values(keys, 7)})  # after the snapshot, in the log
        args = _shard_args(bank, tmp_path)
    finally:
        bank.close()
    shard = BankShard(*args)  # what re-homing starts on a live worker
    try:
        out = shard.rehome_restore(str(tmp_path))
        assert out["rolled_back"] == {"trained": 10} and out["version"] == 1
        np.testing.assert_array_equal(shard.lookup("trained", keys).result().values["embedding"],
                                      np.full((keys.size, 4), -0.5, np.float32))
        np.testing.assert_array_equal(shard.lookup("made", keys).result().values["value"], values(keys, 7))
        with pytest.raises(RolledBackError, match=r"table 'trained' was rolled back to snapshot v1 \(step 10\)"):
            shard.apply_gradients("trained", keys, grads)
        shard.update("made", keys, {"value": values(keys, 8)})  # a logged table takes writes at once
        before = shard.export_state()
        with pytest.raises(RolledBackError):
            shard.lookup("trained", np.array([999], np.int64), insert=True)
        after = shard.export_state()
        assert all(np.array_equal(before["tables"]["trained"][k], after["tables"]["trained"][k])
                   for k in before["tables"]["trained"])
        assert shard.rollback(str(tmp_path), 1, ["trained"]) == {"trained": keys.size}
        shard.apply_gradients("trained", keys, grads)
        np.testing.assert_array_equal(shard.lookup("trained", keys).result().values["embedding"],
                                      np.full((keys.size, 4), -1.0, np.float32))
    finally:
        shard.close()


def test_the_disk_reserve_refuses_a_logged_write_or_a_snapshot_before_anything_changes(tmp_path: pathlib.Path) -> None:
    keys = np.arange(20, dtype=np.int64)
    reserve = shutil.disk_usage(tmp_path).free + (1 << 30)  # more than the disk has: every logged write refused
    with dask.config.set({"carls.storage.disk-reserve": reserve}), KnowledgeBank.local(
            [made(), trained()], n_shards=2, buckets=BUCKETS, log_root=str(tmp_path)) as bank:
        with pytest.raises(DiskReserveError, match=r"bank shard \d, table 'made': writing .* below the reserve of "
                                                   r".* \(carls.storage.disk-reserve\); nothing was written"):
            bank.update("made", keys, {"value": values(keys, 2)})
        assert bank.size("made") == 0 and [s["log"]["seq"] for s in bank.stats()["shards"]] == [0, 0]
        bank.lookup("trained", keys, insert=True)  # a table kept by snapshots writes nothing to disk now
        assert bank.size("trained") == keys.size
        with pytest.raises(DiskReserveError, match=r"snapshot into"):
            bank.snapshot(str(tmp_path), 1)
    assert list_snapshots(tmp_path) == [] and not (tmp_path / "snapshots").exists()
    assert store_bytes(tmp_path)["log"] == 0


def test_a_committed_snapshot_truncates_the_log_it_covers(tmp_path: pathlib.Path) -> None:
    keys = np.arange(50, dtype=np.int64)
    root = str(tmp_path)
    with KnowledgeBank.local([made()], n_shards=2, buckets=BUCKETS, log_root=root) as bank:
        for step in (10, 20):
            bank.set_step(step)
            bank.update("made", keys, {"value": values(keys, step)})
            bank.snapshot(root, step)
        bank.set_step(25)
        bank.update("made", keys[:5], {"value": values(keys[:5], 25)})
    parts = store_bytes(root)
    segs = sorted((tmp_path / "delta").glob("shard-*/seg-*.log"))
    assert parts["log"] == sum(p.stat().st_size for p in segs) > 0
    assert all(r.step == 25 for r in replay(root))  # only what follows the newest snapshot is left
    snaps = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / "snapshots") for f in fs)
    assert parts["snapshots"] == snaps
    np.testing.assert_array_equal(open_bank(root, step=10)["value"].sel(key=keys).values, values(keys, 10))  # kept step
    np.testing.assert_array_equal(open_bank(root, step=25)["value"].sel(key=keys[:5]).values, values(keys[:5], 25))
    with pytest.raises(StoreNotFoundError, match=r"step 15 falls between kept snapshots.*expected a kept snapshot's "
                                                 r"step \[10, 20\] or a step from the newest on"):
        open_bank(root, step=15)
    with pytest.raises(StoreNotFoundError, match=r"removed when a newer snapshot truncated the log"):
        list(replay(root, since_version=1))


def test_a_row_written_several_times_in_a_batch_is_logged_once_with_its_last_value(tmp_path: pathlib.Path) -> None:
    with KnowledgeBank.local([made()], n_shards=1, buckets=BUCKETS, log_root=str(tmp_path)) as bank:
        keys = np.array([3, 1, 3, 2, 3], np.int64)
        bank.update("made", keys, {"value": np.arange(5, dtype=np.float32)[:, None].repeat(4, axis=1)})
    (rec,) = [r for r in replay(tmp_path) if r.table == "made"]
    order = np.argsort(rec.arrays["keys"])
    assert rec.arrays["keys"][order].tolist() == [1, 2, 3]
    assert rec.arrays["col/value"][order, 0].tolist() == [1.0, 3.0, 4.0]  # key 3's last write: 4


def test_rollback_brings_every_shards_snapshot_tables_back_and_leaves_logged_ones(tmp_path: pathlib.Path) -> None:
    keys = np.arange(40, dtype=np.int64)
    grads = np.ones((keys.size, 4), np.float32)
    with KnowledgeBank.local([made(), trained()], n_shards=2, buckets=BUCKETS, log_root=str(tmp_path)) as bank:
        bank.lookup("trained", keys, insert=True)
        bank.apply_gradients("trained", keys, grads)  # -0.5
        bank.snapshot(str(tmp_path), 5)
        bank.apply_gradients("trained", keys, grads)  # -1.0
        bank.update("made", keys, {"value": values(keys, 9)})
        assert bank.rollback(str(tmp_path)) == 5
        np.testing.assert_array_equal(bank.lookup("trained", keys).values["embedding"],
                                      np.full((keys.size, 4), -0.5, np.float32))
        np.testing.assert_array_equal(bank.lookup("made", keys).values["value"], values(keys, 9))
        assert bank.rollback(str(tmp_path), -1) == 0  # as before any snapshot
        assert bank.size("trained") == 0 and bank.size("made") == keys.size
