"""What a bank layer's ``state_dict()`` records: its bank, table and column, and the bank snapshot of the step.

The record is torch's *extra state* of every :class:`~carls_dask.nn.BankLayer` (see
:mod:`carls_dask.nn.checkpoint`, which takes the snapshot and restores the bank); this module holds only
what the layer itself calls, so the layers do not import the checkpoint helpers that import them.
"""

from __future__ import annotations

import contextlib
import contextvars
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

from carls_dask.errors import ConfigError, LifecycleError

__all__ = ["RECORD_FORMAT", "RESTORED_FROM", "check_record", "layer_record", "load_hook", "recording"]

#: Format of a bank layer's record in a state dict.
RECORD_FORMAT = 1

#: The snapshot :func:`checkpoint_state` took, by ``id`` of the bank, while it builds the state dict.
_TAKING: contextvars.ContextVar[dict[int, dict[str, Any]] | None] = contextvars.ContextVar("carls_checkpoint",
                                                                                          default=None)
#: Attribute :func:`restore_bank` sets on a bank it restored: the store and snapshot version it came from.
RESTORED_FROM = "_carls_restored_from"


def layer_record(layer: Any) -> dict[str, Any]:
    """What a bank layer's ``state_dict()`` records: its bank, table and column, and the snapshot of this step.

    The snapshot is the one :func:`checkpoint_state` is taking now, else ``None``.
    """
    bank = layer.bank
    taking = _TAKING.get()
    snapshot = taking.get(id(bank)) if taking is not None else None
    return {"format": RECORD_FORMAT, "bank": str(bank.name), "lineage": str(getattr(bank, "lineage", bank.name)),
            "table": layer.table, "column": layer.column, "snapshot": dict(snapshot) if snapshot else None}


def check_record(layer: Any, record: Any) -> None:
    """Check that ``layer``'s bank holds the rows a loaded state dict's record names (see the module notes).

    Raises
    ------
    LifecycleError
        If the record names a snapshot and the layer's bank was not restored from it.
    ConfigError
        If the record is for another table or column than the layer's.
    """
    if not isinstance(record, Mapping):
        return  # a state dict saved before bank layers had a record
    owner = layer._owner
    if (record.get("table"), record.get("column")) != (layer.table, layer.column):
        raise ConfigError(f"{owner}: the state dict's record is of table {record.get('table')!r}, column "
                          f"{record.get('column')!r}; expected table {layer.table!r}, column {layer.column!r}")
    snap = record.get("snapshot")
    if not snap:
        return
    restored = getattr(layer.bank, RESTORED_FROM, None)
    wanted = (str(pathlib.Path(snap["root"]).resolve()), int(snap["version"]))
    if restored != wanted:
        raise LifecycleError(
            f"{owner}: this checkpoint's rows are bank snapshot v{snap['version']} (step {snap['step']}) of "
            f"{snap['root']}, but the layer's bank {layer.bank.name!r} was not restored from it, so the dense "
            "weights would meet rows of another step; restore the bank first "
            "(carls_dask.nn.checkpoint.restore_bank(state, client)) and build the model over it")


def load_hook(layer: Any, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    """A load pre-hook of every bank layer: a state dict without the layer's record (saved before bank
    layers had one) loads as a plain one."""
    state_dict.setdefault(f"{prefix}_extra_state", None)


@contextlib.contextmanager
def recording(bank: Any, snapshot: dict[str, Any]) -> Iterator[None]:
    token = _TAKING.set({id(bank): snapshot})
    try:
        yield
    finally:
        _TAKING.reset(token)


