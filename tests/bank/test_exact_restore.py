"""A bank restored from a snapshot plus its delta log holds exactly the live bank's state, on any shard count.

One live bank per source shard count holds a table per optimizer and float dtype. It goes through
inserts, value updates by named makers, gradients with duplicate keys and deletes; a snapshot is taken
in the middle and more mutations follow (they live only in the delta log). Each restore (onto 1, 2 and 3
shards) must match the live bank's full exported state bit for bit, and the next gradient batch must
then give bit-identical rows in both. The same runs on Dask actor shards and on in-process shards
(``KnowledgeBank.local`` / ``restore_local``).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from tests.bank.optimizer_tables import (
    BUCKETS,
    DIM,
    TABLES,
    apply_all,
    assert_bit_identical,
    full_state,
    start,
)


def mutate_before_snapshot(bank: KnowledgeBank, rng: np.random.Generator) -> np.ndarray:
    keys = rng.choice(10**6, size=60, replace=False).astype(np.int64)
    for t in TABLES:
        dt = np.dtype(t.split("_")[1])
        bank.lookup(t, np.r_[keys, keys[:10]], insert=True)  # duplicates count twice
        bank.update(t, keys[:15], {"embedding": rng.normal(size=(15, DIM)).astype(dt),
                                   "label": np.arange(15)}, model_step=3, maker="teacher")
        bank.update(t, np.r_[keys[50:], [7_000_001, 7_000_002]], {"bias": rng.normal(size=12).astype(dt)},
                    model_step=4, maker="labeler")
    apply_all(bank, rng, np.r_[keys[:40], keys[:10], keys[5:8]])  # duplicate keys: summed
    apply_all(bank, rng, keys[20:30])  # sparse rows: their own step counts run ahead
    for t in TABLES:
        bank.delete(t, keys[55:58])
    return keys


def mutate_after_snapshot(bank: KnowledgeBank, rng: np.random.Generator, keys: np.ndarray) -> None:
    apply_all(bank, rng, np.r_[keys[10:50], keys[10:20], [7_000_001, 123]])  # 123 is absent: skipped
    for t in TABLES:
        dt = np.dtype(t.split("_")[1])
        bank.update(t, keys[30:35], {"bias": rng.normal(size=5).astype(dt)}, model_step=11, maker="scorer")
        bank.delete(t, np.r_[keys[:3], keys[20:22]])
        bank.lookup(t, np.r_[keys[20:21], [9_000_000, 9_000_001]], insert=True)  # a deleted key comes back fresh
    apply_all(bank, rng, np.r_[keys[20:21], [9_000_000], keys[40:45]])



def restore(transport: str, request: pytest.FixtureRequest, n_shards: int, root: str) -> KnowledgeBank:
    if transport == "local":
        return KnowledgeBank.restore_local(root, n_shards=n_shards)
    return KnowledgeBank.restore(request.getfixturevalue("client"), root, n_shards=n_shards)


@pytest.mark.parametrize("transport", ["dask", "local"])
@pytest.mark.parametrize("source_shards", [1, 2, 3])
def test_restore_is_exact_for_every_optimizer_dtype_and_shard_count(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, source_shards: int, transport: str
) -> None:
    root = str(tmp_path / "bank")
    rng = np.random.default_rng(100 + source_shards)
    live = start(transport, request, source_shards, root)
    try:
        keys = mutate_before_snapshot(live, rng)
        live.snapshot(root, step=10)
        mutate_after_snapshot(live, rng, keys)
        final = full_state(live)
        for t in TABLES:  # the state is what the test says it is
            opt, dt = t.split("_")
            assert final[t]["col/embedding"].dtype == np.dtype(dt)
            if opt == "adam":
                step = final[t]["slot/embedding/step"]
                assert step.dtype == np.int64 and step.ndim == 1 and len(set(step.tolist())) > 2
                assert final[t]["slot/embedding/m"].dtype == np.dtype(dt)
            if opt == "adagrad":
                assert final[t]["slot/bias/accumulator"].dtype == np.dtype(dt)
            assert {"teacher", "labeler", "scorer", ""} <= set(final[t]["prov/maker"].tolist())
        next_keys = np.r_[keys[25:48], keys[25:30], [9_000_001, 555]]
        seed = int(rng.integers(1 << 30))
        continued = []
        for n in (1, 2, 3):
            restored = restore(transport, request, n, root)
            try:
                assert restored.n_shards == n
                assert_bit_identical(final, full_state(restored))
                found = apply_all(restored, np.random.default_rng(seed), next_keys)
                continued.append((n, found, full_state(restored)))
            finally:
                restored.close()
        found_live = apply_all(live, np.random.default_rng(seed), next_keys)
        after = full_state(live)
        for n, found, state in continued:
            for t in TABLES:
                np.testing.assert_array_equal(found[t], found_live[t], err_msg=f"{n} shards, {t}")
            # every array bit for bit; wall time is each bank's own clock at the write
            assert_bit_identical(after, state, skip=("prov/wall_time",))
        for t in TABLES:  # the next batch did move the rows
            assert after[t]["col/embedding"].tobytes() != final[t]["col/embedding"].tobytes()
    finally:
        live.close()


@pytest.mark.parametrize("transport", ["dask", "local"])
def test_restore_of_a_bounded_table_is_exact(request: pytest.FixtureRequest, tmp_path: pathlib.Path,
                                             transport: str) -> None:
    """Cap evictions and admissions after the snapshot live only in the delta log (as deletes and rows).

    The admission sketch is not persisted: a restored shard counts sightings afresh, so the test
    compares the rows (every array, bit for bit), which are the defined state.
    """
    root = str(tmp_path / "bank")
    bounded = TableSpec("bounded", columns=(Column("embedding", "float32", (DIM,)),), optimizer="adagrad",
                        learning_rate=0.05, initializer="normal", init_scale=0.1, seed=3, max_rows=8,
                        eviction="lfu", min_frequency=2, sketch_width=1024)
    if transport == "local":
        live = KnowledgeBank.local([bounded], n_shards=2, buckets=BUCKETS, log_root=root, log_sync=False)
    else:
        live = KnowledgeBank.create(request.getfixturevalue("client"), [bounded], n_shards=2, buckets=BUCKETS,
                                    log_root=root, log_sync=False)
    rng = np.random.default_rng(5)
    try:
        def stream(batches: int) -> None:
            for _ in range(batches):
                keys = (rng.zipf(1.3, 40) % 60).astype(np.int64)
                found = live.lookup("bounded", keys, insert=True).found
                live.apply_gradients("bounded", keys[found], rng.normal(size=(int(found.sum()), DIM)))

        stream(5)
        live.update("bounded", np.array([500, 501]), {"embedding": np.ones((2, DIM), np.float32)}, maker="m")
        live.snapshot(root, step=1)
        before = sum(s["tables"]["bounded"]["bounds"]["evictions"]["cap"] for s in live.stats()["shards"])
        stream(10)
        live.delete("bounded", np.array([500]))
        stats = live.stats()["shards"]
        assert sum(s["tables"]["bounded"]["bounds"]["evictions"]["cap"] for s in stats) > before  # logged only
        assert all(s["tables"]["bounded"]["rows"] <= 8 for s in stats)
        final = full_state(live)
        for n in (1, 2, 3):
            restored = restore(transport, request, n, root)
            try:
                assert_bit_identical(final, full_state(restored))
            finally:
                restored.close()
    finally:
        live.close()
