"""Shard calls as values: operation ids, the read-only fast path, and the local transport (no cluster)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from carls_dask.bank.calls import ShardCall, stamp_op_ids
from carls_dask.bank.operations import APPLY_GRADIENTS, DELETE, LOOKUP, SIZE, UPDATE


def table() -> TableSpec:
    return TableSpec("t", columns=(Column("embedding", shape=(2,)),), optimizer="sgd", learning_rate=0.5,
                     initializer="zeros", init_scale=0.0)


def test_a_batch_shares_one_op_id_on_its_mutating_calls_and_reads_carry_none() -> None:
    calls = stamp_op_ids([
        ShardCall(0, UPDATE, ("t",)),
        ShardCall(1, UPDATE, ("t",)),
        ShardCall(0, LOOKUP, ("t",), on_loop=True),
        ShardCall(1, DELETE, ("t",), op_id=7),
    ])
    assert calls[0].op_id is not None and calls[0].op_id == calls[1].op_id > 0
    assert calls[2].op_id is None and "op_id" not in calls[2].send_kwargs
    assert calls[3].op_id == 7 and calls[3].send_kwargs == {"op_id": 7}
    again = stamp_op_ids([ShardCall(0, UPDATE, ("t",))])
    assert again[0].op_id != calls[0].op_id  # a new batch, a new id


def test_only_a_mutating_call_carries_an_op_id() -> None:
    with pytest.raises(ValueError, match="not mutating"):
        ShardCall(0, SIZE, op_id=3)


def test_a_retried_mutating_batch_is_applied_once_on_a_local_shard() -> None:
    bank = KnowledgeBank.local([table()], n_shards=1, buckets=8)
    keys = np.arange(4)
    bank.update("t", keys, {"embedding": np.zeros((4, 2), np.float32)})
    call = [ShardCall(0, APPLY_GRADIENTS, ("t", keys, {"embedding": np.ones((4, 2), np.float32)}, "embedding",
                                                 None), op_id=99)]
    assert bank._call(call)[0].all()
    assert bank._call(call)[0].all()  # same op id: answered, not applied again
    np.testing.assert_array_equal(bank.lookup("t", keys).values["embedding"], np.full((4, 2), -0.5, np.float32))
    bank.close()


def test_a_local_bank_says_it_cannot_be_pickled() -> None:
    with KnowledgeBank.local([table()], n_shards=2, buckets=8) as bank:
        with pytest.raises(TypeError, match=r"KnowledgeBank\.create"):
            pickle.dumps(bank)


def test_every_operation_is_a_method_of_the_shard_and_every_shard_method_an_operation() -> None:
    """The operations are described once (carls_dask.bank.operations): the shard actor has a method for each, and
    each public method of the actor is one (a renamed method fails here, and at the actor's import)."""
    import inspect

    from carls_dask.bank.actor import BankShard
    from carls_dask.bank.operations import OPERATIONS, Operation, bind
    from carls_dask.errors import HookNotImplementedError

    public = {n for n, f in inspect.getmembers(BankShard, callable) if not n.startswith("_")} - {"call_on_loop"}
    assert public == set(OPERATIONS)

    class Partial:
        def lookup(self) -> None: ...

    with pytest.raises(HookNotImplementedError, match="'update'"):
        bind(Partial)
    with pytest.raises(ValueError, match="expected an Operation"):
        ShardCall(0, "update")  # type: ignore[arg-type]
    assert all(isinstance(op, Operation) for op in OPERATIONS.values())


def test_a_shard_takes_its_settings_from_the_driver_and_reads_no_configuration() -> None:
    """The client resolves every setting a shard uses (shard_settings) and passes it; a worker's own
    configuration (which dask reads from its environment at import) does not decide them."""
    import dask

    from carls_dask.bank.actor import BankShard
    from carls_dask.bank.client import shard_settings

    with dask.config.set({"carls.bank.ann.nprobe": 5, "carls.bank.sampling.rebuild-draws": 3.0}):
        settings = shard_settings()
    with dask.config.set({"carls.bank.ann.nprobe": 99, "carls.bank.sampling.rebuild-draws": 42.0}):
        shard = BankShard([table().to_json()], 0, 1, 8, None, 16, None, True,
                          settings)
    assert shard.core.ann.nprobe == 5 and shard.core.sampling.rebuild_draws == 3.0
    shard.close()
