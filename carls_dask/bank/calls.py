"""A call to a shard as a value, and several calls to one shard carried as one message.

:class:`ShardCall` is what a client method sends to one shard: the method, its arguments, whether it
mutates (then it carries an operation id, so that a call retried after its shard was re-homed is
applied once) and whether a remote shard may serve it on its worker's event loop.

:func:`fuse` turns the calls of one send into one call per shard: where several calls go to the same
shard, they travel as one :data:`~carls_dask.bank.operations.BATCH` call that the shard runs in order under one lock
(:meth:`BankShard.batch <carls_dask.bank.actor.BankShard.batch>`), each keeping its own operation id and
answering on its own (:class:`Failed` for one that raised). So a step that reads three tables and pushes
the gradients of three costs one message per shard, not six. :func:`unfuse` puts the answers back in
the order of the calls.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from carls_dask.bank.operations import BATCH as BATCH_OP
from carls_dask.bank.operations import Operation
from carls_dask.errors import InvalidArgumentError

__all__ = ["Failed", "ShardCall", "fuse", "new_op_id", "payload_bytes", "stamp_op_ids", "unfuse"]



def new_op_id() -> int:
    """A random positive 63-bit operation id."""
    return int.from_bytes(os.urandom(8), "little") >> 1


@dataclasses.dataclass(frozen=True, eq=False)
class ShardCall:
    """One call to one shard: operation ``op`` of ``shards[shard]`` with ``args`` and ``kwargs``.

    Parameters
    ----------
    shard
        Shard id.
    op
        The :class:`~carls_dask.bank.operations.Operation` (its ``mutating`` says whether the call carries its
        operation's id: the shard method then takes ``op_id``, so that a call retried after a re-home is
        applied once).
    args, kwargs
        Its arguments.
    on_loop
        Whether a remote shard serves the call on its worker's event loop when the shard is free
        (:meth:`BankShard.call_on_loop <carls_dask.bank.actor.BankShard.call_on_loop>`) rather than
        in its actor thread: for calls short enough to hold the loop for milliseconds only.
    op_id
        The operation id of a mutating call (set by :func:`stamp_op_ids` when None).
    """

    shard: int
    op: Operation
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    on_loop: bool = False
    op_id: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.op, Operation):
            raise InvalidArgumentError(f"ShardCall to shard {self.shard}: op={self.op!r}; expected an Operation of "
                                       "carls_dask.bank.operations")
        if self.op_id is not None and not self.op.mutating:
            raise InvalidArgumentError(f"ShardCall {self.method!r} to shard {self.shard}: op_id={self.op_id} on a call "
                                       "that is not mutating; expected op_id=None")

    @property
    def method(self) -> str:
        """The shard method that runs the call."""
        return self.op.name

    @property
    def mutating(self) -> bool:
        """Whether the call changes the shard's state (and carries an operation id)."""
        return self.op.mutating

    @property
    def send_kwargs(self) -> dict[str, Any]:
        """The keyword arguments sent, the operation id included."""
        if self.op_id is None:
            return dict(self.kwargs)
        return {**self.kwargs, "op_id": self.op_id}


def stamp_op_ids(calls: Sequence[ShardCall]) -> list[ShardCall]:
    """The calls of one operation with an operation id on every mutating one (one new id, shared by its shards)."""
    op: int | None = None
    out = []
    for c in calls:
        if c.mutating and c.op_id is None:
            if op is None:
                op = new_op_id()
            c = dataclasses.replace(c, op_id=op)
        out.append(c)
    return out


class Failed:
    """The error of a shard call, kept apart so that the other calls' answers are not lost."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> Any:
        return (Failed, (self.exc,))

    def __await__(self) -> Any:  # awaiting a call that could not even be issued raises its error
        raise self.exc


def fuse(calls: Sequence[ShardCall]) -> tuple[list[ShardCall], list[tuple[int, int | None]]]:
    """One call per shard: calls to the same shard become one ``batch`` call that runs them in order.

    Returns the calls to send and, for each given call, where its answer is: ``(i, None)`` for the
    answer of sent call ``i``, ``(i, j)`` for item ``j`` of the list that batch call ``i`` answers.
    A shard's calls keep their order; shards are sent in the order of their first call.
    """
    by_shard: dict[int, list[int]] = {}
    for i, c in enumerate(calls):
        by_shard.setdefault(c.shard, []).append(i)
    if all(len(v) == 1 for v in by_shard.values()):
        return list(calls), [(i, None) for i in range(len(calls))]
    sent: list[ShardCall] = []
    where: list[tuple[int, int | None]] = [(0, None)] * len(calls)
    for shard, members in by_shard.items():
        if len(members) == 1:
            where[members[0]] = (len(sent), None)
            sent.append(calls[members[0]])
            continue
        ops = tuple((calls[i].method, calls[i].args, calls[i].send_kwargs) for i in members)
        for j, i in enumerate(members):
            where[i] = (len(sent), j)
        sent.append(ShardCall(shard, BATCH_OP, (ops,), on_loop=all(calls[i].on_loop for i in members)))
    return sent, where


def unfuse(answers: Sequence[Any], where: Sequence[tuple[int, int | None]]) -> list[Any]:
    """The answer of each call given to :func:`fuse`, from the answers of the calls it sent.

    A batch call that failed as a whole (its shard could not be reached) gives its :class:`Failed` to
    each of its calls.
    """
    out = []
    for i, j in where:
        a = answers[i]
        out.append(a if j is None or isinstance(a, Failed) else a[j])
    return out


def payload_bytes(value: Any) -> int:
    """Bytes of the arrays a call's arguments or answer carry (containers and dataclasses walked)."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, Mapping):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(payload_bytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(payload_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0
