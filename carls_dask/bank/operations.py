"""Every operation a bank shard answers, described once: what it is called, whether it mutates, how it routes.

An :class:`Operation` is what the client, the transports and the shard actor agree on. The client builds
its calls from these constants (``ShardCall(s, UPDATE, args)``), never from a method name typed again;
the shard actor derives from them which calls a retired shard still answers and which may travel inside
one message (:data:`~carls_dask.bank.actor.BankShard.batch`); and :func:`bind` checks, when the actor's
module is imported, that every operation names a method of the actor, so renaming one without the other
fails at once rather than at the first call.

The fields say what a generic piece of code needs to know:

- ``mutating``: the call changes the shard's state, so it carries its operation's id (a call retried after
  its shard was re-homed is applied once) and its rows go to the delta log of a logged table;
- ``routing``: ``"keys"`` (one call to each shard holding some of the batch's keys) or ``"every"`` (one call
  to every shard);
- ``merge``: how the shards' answers make the operation's result: ``"rows"`` (rows gathered back into key
  order), ``"mask"`` (one boolean per key, scattered back into key order), ``"sum"``, ``"concat"``, or
  ``"each"`` (the list of answers, in shard order);
- ``batchable``: it may run inside a :data:`BATCH` call (a step's reads and pushes in one message);
- ``after_retire``: a shard whose worker is closing still answers it (anything else re-routes).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from carls_dask.errors import HookNotImplementedError, InvalidArgumentError

__all__ = [
    "ANN_STATE", "APPLY_GRADIENTS", "BATCH", "CHANGES", "CLOSE", "CONTAINS", "DELETE", "EXPIRE", "EXPORT_STATE",
    "INSERTING_LOOKUP", "KEYS", "KEYS_AND_FREQUENCY", "LOOKUP", "OPERATIONS", "PING", "REHOME_RESTORE", "RESTORE",
    "RETIRE", "ROLLBACK", "SAMPLE_DRAW", "SAMPLE_NEGATIVES", "SAMPLING_STATE", "SETTLE_SNAPSHOT", "SET_STEP", "SIZE",
    "SNAPSHOT", "SNAPSHOT_BYTES", "STATS", "SYNC", "TOP_K", "UPDATE", "Operation", "bind", "operation",
]

Routing = Literal["keys", "every"]
Merge = Literal["rows", "mask", "sum", "concat", "each"]


@dataclasses.dataclass(frozen=True)
class Operation:
    """One operation of a bank shard (see the module notes for the fields)."""

    name: str
    mutating: bool = False
    routing: Routing = "every"
    merge: Merge = "each"
    batchable: bool = False
    after_retire: bool = False

    def __repr__(self) -> str:
        return f"Operation({self.name!r})"


LOOKUP = Operation("lookup", routing="keys", merge="rows", batchable=True)
#: A lookup that allocates missing keys and counts frequency: the same shard method, a mutating call.
INSERTING_LOOKUP = Operation("lookup", mutating=True, routing="keys", merge="rows", batchable=True)
UPDATE = Operation("update", mutating=True, routing="keys", merge="sum", batchable=True)
APPLY_GRADIENTS = Operation("apply_gradients", mutating=True, routing="keys", merge="mask", batchable=True)
DELETE = Operation("delete", mutating=True, routing="keys", merge="mask", batchable=True)
CONTAINS = Operation("contains", routing="keys", merge="mask", batchable=True)
EXPIRE = Operation("expire", merge="sum")
SIZE = Operation("size", merge="sum")
KEYS = Operation("keys", merge="concat")
CHANGES = Operation("changes")
KEYS_AND_FREQUENCY = Operation("keys_and_frequency")
SAMPLE_NEGATIVES = Operation("sample_negatives")
SAMPLE_DRAW = Operation("sample_draw")
SAMPLING_STATE = Operation("sampling_state")
TOP_K = Operation("top_k")
ANN_STATE = Operation("ann_state")
STATS = Operation("stats")
SYNC = Operation("sync")
SET_STEP = Operation("set_step")
PING = Operation("ping", after_retire=True)
EXPORT_STATE = Operation("export_state", after_retire=True)
SNAPSHOT = Operation("snapshot")
SNAPSHOT_BYTES = Operation("snapshot_bytes")
SETTLE_SNAPSHOT = Operation("settle_snapshot")
RESTORE = Operation("restore")
REHOME_RESTORE = Operation("rehome_restore")
ROLLBACK = Operation("rollback")
RETIRE = Operation("retire", after_retire=True)
CLOSE = Operation("close", after_retire=True)
#: Several batchable calls to one shard in one message, run in order (:func:`carls_dask.bank.calls.fuse`).
BATCH = Operation("batch")

#: Every operation by its shard method's name (the inserting lookup shares ``"lookup"`` with the read).
OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    LOOKUP, UPDATE, APPLY_GRADIENTS, DELETE, CONTAINS, EXPIRE, SIZE, KEYS, CHANGES, KEYS_AND_FREQUENCY,
    SAMPLE_NEGATIVES, SAMPLE_DRAW, SAMPLING_STATE, TOP_K, ANN_STATE, STATS, SYNC, SET_STEP, PING, EXPORT_STATE,
    SNAPSHOT, SNAPSHOT_BYTES, SETTLE_SNAPSHOT, RESTORE, REHOME_RESTORE, ROLLBACK, RETIRE, CLOSE, BATCH)}


def operation(name: str) -> Operation:
    """The operation a shard method name stands for (a batch's inner calls travel by name).

    Raises
    ------
    InvalidArgumentError
        For a name that is no operation.
    """
    op = OPERATIONS.get(name)
    if op is None:
        raise InvalidArgumentError(f"bank shard: no operation {name!r}; expected one of {sorted(OPERATIONS)}")
    return op


def bind(cls: type) -> type:
    """Check that ``cls`` (the shard actor) has a method for every operation; returns ``cls``.

    Raises
    ------
    HookNotImplementedError
        Naming the operations ``cls`` has no method for.
    """
    missing = sorted(name for name in OPERATIONS if not callable(getattr(cls, name, None)))
    if missing:
        raise HookNotImplementedError(f"{cls.__name__} has no method for the bank operations {missing}; expected one "
                                      "method per carls_dask.bank.operations.Operation")
    return cls
