"""Shard calls as values: operation ids, the read-only fast path, and the local transport (no cluster)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from carls_dask.bank.transport import ShardCall, stamp_op_ids


def table() -> TableSpec:
    return TableSpec("t", columns=(Column("embedding", shape=(2,)),), optimizer="sgd", learning_rate=0.5,
                     initializer="zeros", init_scale=0.0)


def test_a_batch_shares_one_op_id_on_its_mutating_calls_and_reads_carry_none() -> None:
    calls = stamp_op_ids([
        ShardCall(0, "update", ("t",), mutating=True),
        ShardCall(1, "update", ("t",), mutating=True),
        ShardCall(0, "lookup", ("t",), on_loop=True),
        ShardCall(1, "delete", ("t",), mutating=True, op_id=7),
    ])
    assert calls[0].op_id is not None and calls[0].op_id == calls[1].op_id > 0
    assert calls[2].op_id is None and "op_id" not in calls[2].send_kwargs
    assert calls[3].op_id == 7 and calls[3].send_kwargs == {"op_id": 7}
    again = stamp_op_ids([ShardCall(0, "update", ("t",), mutating=True)])
    assert again[0].op_id != calls[0].op_id  # a new batch, a new id


def test_only_a_mutating_call_carries_an_op_id() -> None:
    with pytest.raises(ValueError, match="not mutating"):
        ShardCall(0, "size", op_id=3)


def test_a_retried_mutating_batch_is_applied_once_on_a_local_shard() -> None:
    bank = KnowledgeBank.local([table()], n_shards=1, buckets=8)
    keys = np.arange(4)
    bank.update("t", keys, {"embedding": np.zeros((4, 2), np.float32)})
    call = [ShardCall(0, "apply_gradients", ("t", keys, {"embedding": np.ones((4, 2), np.float32)}, "embedding",
                                                 None), mutating=True, op_id=99)]
    assert bank._call(call)[0].all()
    assert bank._call(call)[0].all()  # same op id: answered, not applied again
    np.testing.assert_array_equal(bank.lookup("t", keys).values["embedding"], np.full((4, 2), -0.5, np.float32))
    bank.close()


def test_a_local_bank_says_it_cannot_be_pickled() -> None:
    with KnowledgeBank.local([table()], n_shards=2, buckets=8) as bank:
        with pytest.raises(TypeError, match=r"KnowledgeBank\.create"):
            pickle.dumps(bank)
