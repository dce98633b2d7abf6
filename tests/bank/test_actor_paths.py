"""Shard calls on the worker's event loop: the same answers as the actor thread's, and no blocking when busy."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from carls_dask.bank.actor import BankShard
from carls_dask.bank.schema import Column, TableSpec


def shard() -> BankShard:
    spec = TableSpec("emb", columns=(Column("embedding", shape=(4,)),), optimizer="sgd", learning_rate=0.1,
                     initializer="normal", init_scale=0.1)
    s = BankShard([spec.to_json()], shard=0, n_shards=1, buckets=16)
    s.lookup("emb", np.arange(20), insert=True)
    return s


def test_read_on_the_loop_matches_lookup_and_flags_missing_keys() -> None:
    s = shard()
    keys = np.array([3, 99, 7])
    got = asyncio.run(s.call_on_loop("lookup", "emb", keys, None)).result()
    want = s.core.lookup("emb", keys)
    assert got.found.tolist() == [True, False, True]
    assert np.array_equal(got.values["embedding"], want.values["embedding"])
    assert np.array_equal(got.frequency, want.frequency) and np.array_equal(got.version, want.version)
    assert s.core.lookup("emb", np.array([3])).frequency.tolist() == [1]  # a read counts nothing


def test_read_waits_in_a_thread_while_another_call_holds_the_shard() -> None:
    s = shard()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with s._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)

    async def read_while_busy() -> tuple[bool, np.ndarray]:
        task = asyncio.ensure_future(s.call_on_loop("lookup", "emb", np.array([1, 2]), ["embedding"]))
        await asyncio.sleep(0.05)
        loop_free = not task.done()  # the loop keeps running while the read waits for the shard
        release.set()
        res = await asyncio.wait_for(task, 10)
        return loop_free, res.values["embedding"]

    loop_free, values = asyncio.run(read_while_busy())
    t.join(10)
    assert loop_free
    assert np.array_equal(values, s.core.lookup("emb", np.array([1, 2])).values["embedding"])


def test_a_mutating_call_on_the_loop_is_applied_once_per_operation_id() -> None:
    s = shard()
    keys = np.array([1, 2, 3])
    before = s.core.lookup("emb", keys).values["embedding"]
    grads = np.ones((3, 4), np.float32)
    for _ in range(2):  # the second is a retry of the same batch: answered, not applied again
        found = asyncio.run(s.call_on_loop("apply_gradients", "emb", keys, grads, "embedding", None, op_id=42))
        assert found.tolist() == [True, True, True]
    np.testing.assert_allclose(s.core.lookup("emb", keys).values["embedding"], before - 0.1, rtol=1e-6)
