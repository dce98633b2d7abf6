"""The KnowledgeBank client and BankShard actors on a real two-worker LocalCluster."""

from __future__ import annotations

import asyncio
import pathlib
import pickle
from typing import Any

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, ShardCore, TableSpec, nodes_table
from carls_dask.bank.hashing import to_int64_keys
from carls_dask.errors import InvalidBatchError, InvalidShapeError, StoreLockedError, UnknownTableError


def nodes() -> TableSpec:
    return nodes_table(dim=8, classes=3, neighbours=4, optimizer="adagrad", learning_rate=0.1,
                       initializer="normal", init_scale=0.1)


def items() -> TableSpec:
    return TableSpec("items", columns=(Column("embedding", shape=(4,)),), optimizer="adam", learning_rate=0.01,
                     initializer="uniform", init_scale=0.5)


def bank_state(bank: KnowledgeBank) -> dict[str, dict[str, np.ndarray]]:
    """Every shard's rows merged per table and sorted by key; maker codes turned into names."""
    states = bank._every_shard("export_state")
    out: dict[str, dict[str, Any]] = {}
    for st in states:
        makers = np.array(st["meta"]["makers"], dtype=object)
        for t, arrays in st["tables"].items():
            cur = out.setdefault(t, {})
            for name, a in arrays.items():
                if name == "prov/maker":
                    a = makers[a]
                cur.setdefault(name, []).append(a)
    merged = {}
    for t, arrays in out.items():
        cat = {n: np.concatenate(v) for n, v in arrays.items()}
        order = np.argsort(cat["keys"])
        merged[t] = {n: a[order] for n, a in cat.items() if n != "bucket"}
    return merged


def assert_same_state(a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]]) -> None:
    assert a.keys() == b.keys()
    for t in a:
        assert a[t].keys() == b[t].keys(), t
        for name in a[t]:
            np.testing.assert_array_equal(a[t][name], b[t][name], err_msg=f"{t}/{name}")


@pytest.fixture
def bank(client: Any) -> Any:
    b = KnowledgeBank.create(client, [nodes(), items()], n_shards=3, buckets=64)
    yield b
    b.close()


def test_sharded_bank_matches_a_single_core(bank: KnowledgeBank) -> None:
    ref = ShardCore([nodes(), items()], buckets=64)
    rng = np.random.default_rng(0)
    keys = rng.integers(-(10**9), 10**9, size=500)
    batch = np.r_[keys, keys[:50]]  # duplicates, spread over all shards
    r = bank.lookup("nodes", batch, insert=True)
    e = ref.lookup("nodes", batch, insert=True)
    assert bank.shard_of(batch).tolist().count(2) > 0
    for c in e.values:
        np.testing.assert_array_equal(r.values[c], e.values[c])
    np.testing.assert_array_equal(r.frequency, e.frequency)
    g = rng.normal(size=(550, 8)).astype(np.float32)
    np.testing.assert_array_equal(bank.apply_gradients("nodes", batch, g), ref.apply_gradients("nodes", batch, g))
    vals = {"confidence": rng.random(550).astype(np.float32), "pseudo_label": rng.integers(0, 3, 550)}
    assert bank.update("nodes", batch, vals, model_step=4, maker="labeler") == 500
    ref.update("nodes", batch, vals, model_step=4, maker="labeler")
    r, e = bank.lookup("nodes", batch), ref.lookup("nodes", batch)
    for c in e.values:
        np.testing.assert_array_equal(r.values[c], e.values[c])
    np.testing.assert_array_equal(r.version, e.version)
    assert (r.model_step == 4).all()
    assert bank.size("nodes") == 500 and bank.size() == 500
    assert sorted(bank.keys("nodes").tolist()) == sorted(set(keys.tolist()))
    assert bank.delete("nodes", keys[:10]).all() and bank.size("nodes") == 490
    assert bank.contains("nodes", keys[:12]).tolist() == [False] * 10 + [True] * 2
    st = bank.stats()
    assert st["tables"]["nodes"]["rows"] == 490 and len(st["shards"]) == 3


def test_string_keys_route_and_read_back(bank: KnowledgeBank) -> None:
    names = [f"paper-{i}" for i in range(40)]
    bank.update("items", names, {"embedding": np.arange(160, dtype=np.float32).reshape(40, 4)})
    r = bank.lookup("items", list(reversed(names)))
    assert r.found.all()
    np.testing.assert_array_equal(r.values["embedding"], np.arange(160, dtype=np.float32).reshape(40, 4)[::-1])
    assert bank.contains("items", to_int64_keys(names[:3])).all()


def test_bad_batches_reach_no_shard(bank: KnowledgeBank) -> None:
    keys = np.arange(300)
    bank.lookup("nodes", keys, insert=True)
    before = bank_state(bank)
    emb = np.zeros((300, 8), np.float32)
    emb[-1, 3] = np.nan
    with pytest.raises(InvalidBatchError, match=r"'nodes'.*NaN"):
        bank.update("nodes", keys, {"embedding": emb})
    with pytest.raises(InvalidShapeError, match=r"'nodes'.*\(300, 9\)"):
        bank.apply_gradients("nodes", keys, np.ones((300, 9)))
    with pytest.raises(UnknownTableError, match="'edges'"):
        bank.lookup("edges", keys)
    with pytest.raises(InvalidBatchError, match="empty"):
        bank.lookup("nodes", [], insert=True)
    assert_same_state(before, bank_state(bank))


def test_errors_raised_on_a_shard_surface_with_their_type(bank: KnowledgeBank) -> None:
    # the shard itself refuses keys of buckets it does not own (the client never sends them)
    foreign = np.array([k for k in range(100) if bank.shard_of(np.array([k]))[0] != 0][:3])
    with pytest.raises(InvalidBatchError, match="out of range for shard 0"):
        bank.transport.table.handles[0].lookup("nodes", foreign, None, True, None).result(timeout=30)


def test_bank_pickles_into_tasks_and_has_awaitable_forms(client: Any, bank: KnowledgeBank) -> None:
    assert pickle.loads(pickle.dumps(bank)).n_shards == 3

    def writer(b: KnowledgeBank, lo: int) -> int:
        keys = np.arange(lo, lo + 100)
        b.lookup("items", keys, insert=True)
        b.apply_gradients("items", keys, np.ones((100, 4), np.float32))
        return int(b.size("items"))

    futs = client.map(writer, [bank, bank], [0, 1000], pure=False)
    assert sorted(client.gather(futs))[-1] == 200
    assert bank.size("items") == 200

    async def both() -> tuple[Any, Any]:
        return await asyncio.gather(bank.lookup_async("items", np.arange(5)), bank.size_async("items"))

    r, n = asyncio.run(both())
    assert r.found.all() and n == 200
    assert r.version.tolist() == [2] * 5  # allocation, then one gradient step


def test_top_k_and_sampling_merge_across_shards(bank: KnowledgeBank) -> None:
    rng = np.random.default_rng(5)
    keys = np.arange(1000, 1200)
    emb = rng.normal(size=(200, 4)).astype(np.float32)
    bank.update("items", keys, {"embedding": emb})
    ref = ShardCore([items()], buckets=64)
    ref.update("items", keys, {"embedding": emb})
    q = rng.normal(size=(3, 4)).astype(np.float32)
    for metric in ("dot", "cosine"):
        k_bank, s_bank = bank.top_k("items", q, 7, metric=metric)
        k_ref, s_ref = ref.top_k("items", q, 7, metric=metric)
        np.testing.assert_array_equal(k_bank, k_ref)
        np.testing.assert_allclose(s_bank, s_ref, rtol=1e-6)
    with pytest.raises(InvalidBatchError, match="k=500"):
        bank.top_k("items", q, 500)
    bank.lookup("items", np.repeat(keys[:3], [30, 20, 10]), insert=True)
    s = bank.sample_negatives("items", 20, sampler="log_uniform", unique=True, true_keys=keys[:2], seed=3)
    assert np.unique(s.keys).size == 20 and np.isin(s.keys, keys).all()
    assert s.true_expected_count[0] > s.true_expected_count[1] > 0


def test_snapshot_and_delta_log_restore_onto_another_shard_count(client: Any, tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "bank")
    bank = KnowledgeBank.create(client, [nodes(), items()], n_shards=2, buckets=64, log_root=root, log_sync=False)
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 10**6, size=400)
    bank.lookup("nodes", keys, insert=True)
    bank.apply_gradients("nodes", keys[:200], rng.normal(size=(200, 8)))
    bank.update("nodes", keys[:50], {"logits": rng.normal(size=(50, 3))}, model_step=3, maker="teacher")
    bank.lookup("items", np.arange(30), insert=True)
    bank.apply_gradients("items", np.arange(30), rng.normal(size=(30, 4)))
    v1 = bank.snapshot(root, step=10)
    at_v1 = bank_state(bank)
    # after the snapshot: only the delta log has these
    bank.apply_gradients("nodes", keys[100:300], rng.normal(size=(200, 8)))
    bank.update("nodes", keys[300:320], {"difficulty": rng.random(20)}, model_step=11, maker="scorer")
    bank.delete("nodes", keys[:5])
    bank.lookup("nodes", np.arange(5), insert=True)
    bank.apply_gradients("items", np.arange(10), rng.normal(size=(10, 4)))
    final = bank_state(bank)
    with pytest.raises(StoreLockedError):  # one writer per shard's log
        KnowledgeBank.restore(client, root, n_shards=2, log_root=root)
    bank.close()

    three = KnowledgeBank.restore(client, root, n_shards=3)
    try:
        assert three.n_shards == 3
        assert_same_state(final, bank_state(three))
        r = three.lookup("nodes", keys[300:302])
        assert r.model_step.tolist() == [11, 11]
    finally:
        three.close()
    one = KnowledgeBank.restore(client, root, n_shards=1, version=v1, replay_log=False)
    try:
        assert_same_state(at_v1, bank_state(one))
    finally:
        one.close()


def test_a_task_on_the_shards_worker_calls_it_directly(client: Any) -> None:
    worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
    bank = KnowledgeBank.create(client, [items()], n_shards=1, workers=[worker])
    try:
        bank.lookup("items", np.arange(50), insert=True)

        def colocated(b: KnowledgeBank) -> tuple[bool, np.ndarray]:
            direct = b.transport.local_shard(0) is not None
            b.apply_gradients("items", np.arange(10), np.ones((10, 4), np.float32))
            return direct, b.lookup("items", np.arange(50)).version

        direct, version = client.submit(colocated, bank, workers=[worker], pure=False).result(timeout=60)
        assert direct
        assert version.tolist() == [2] * 10 + [1] * 40
        assert bank.transport.local_shard(0) is None  # this process holds no shard
        assert bank.lookup("items", np.arange(10)).version.tolist() == [2] * 10
    finally:
        bank.close()


def test_answers_kept_by_the_caller_are_never_reused(client: Any) -> None:
    """Shards recycle large answer buffers; an answer someone still holds must keep its rows."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    spec = TableSpec("wide", columns=(Column("embedding", shape=(64,)),), optimizer=None,
                     initializer="uniform", init_scale=1.0)
    keys = np.arange(20_000)  # 1.7 MB of values per third: pooled buffers
    for n_shards in (1, 2):
        bank = KnowledgeBank.create(client, [spec], n_shards=n_shards, workers=workers, buckets=64)
        try:
            bank.lookup("wide", keys, insert=True)

            def reads(b: KnowledgeBank) -> tuple[list[np.ndarray], dict[str, int]]:
                """Co-located with shard 0: three answers held at once (with one shard, views of its buffers)."""
                held = [b.lookup("wide", keys[i::3]).values["embedding"] for i in range(3)]
                for i in range(3):  # more reads while they are held
                    b.lookup("wide", keys[i::3])
                return [h.copy() for h in held], b.transport.local_shard(0).core.stats()["answer_buffers"]

            held, pool = client.submit(reads, bank, workers=[workers[0]], pure=False).result(timeout=60)
            assert pool["allocated"] >= 3 and pool["reused"] >= 1, pool
            remote = [bank.lookup("wide", keys[i::3]).values["embedding"] for i in range(3)]
            for i in range(3):
                np.testing.assert_array_equal(held[i], remote[i], err_msg=f"{n_shards} shards, answer {i}")
            assert all(s["answer_buffers"]["reused"] >= 1 for s in bank.stats()["shards"])
        finally:
            bank.close()
