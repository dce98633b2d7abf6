"""What only a bank of Dask actors does, on a real two-worker LocalCluster: shard-side errors,
pickling into tasks, co-located direct calls, answer buffers. What every transport does is in
``test_conformance.py``."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from carls_dask.errors import InvalidBatchError
from tests.bank.banks import items, nodes


@pytest.fixture
def bank(client: Any) -> Any:
    b = KnowledgeBank.create(client, [nodes(), items()], n_shards=3, buckets=64)
    yield b
    b.close()


def test_errors_raised_on_a_shard_surface_with_their_type(bank: KnowledgeBank) -> None:
    # the shard itself refuses keys of buckets it does not own (the client never sends them)
    foreign = np.array([k for k in range(100) if bank.shard_of(np.array([k]))[0] != 0][:3])
    with pytest.raises(InvalidBatchError, match="out of range for shard 0"):
        bank.transport.table.handles[0].lookup("nodes", foreign, None, True, None).result(timeout=30)


def test_bank_pickles_into_tasks_and_is_awaited_in_a_thread(client: Any, bank: KnowledgeBank) -> None:
    assert pickle.loads(pickle.dumps(bank)).n_shards == 3

    def writer(b: KnowledgeBank, lo: int) -> int:
        keys = np.arange(lo, lo + 100)
        b.lookup("items", keys, insert=True)
        b.apply_gradients("items", keys, np.ones((100, 4), np.float32))
        return int(b.size("items"))

    futs = client.map(writer, [bank, bank], [0, 1000], pure=False)
    assert sorted(client.gather(futs))[-1] == 200
    assert bank.size("items") == 200

    async def both() -> tuple[Any, Any]:  # the documented pattern for code on an event loop
        return await asyncio.gather(asyncio.to_thread(bank.lookup, "items", np.arange(5)),
                                    asyncio.to_thread(bank.size, "items"))

    r, n = asyncio.run(both())
    assert r.found.all() and n == 200
    assert r.version.tolist() == [2] * 5  # allocation, then one gradient step


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
