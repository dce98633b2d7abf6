"""What a bank layer records in ``state_dict()``: its bank, table and column, and the bank snapshot of the step.

The layers (:class:`~carls_dask.nn.BankLayer`) write and check this record as torch's extra state;
:mod:`carls_dask.nn.checkpoint` takes the snapshot it names and restores the bank from it.
"""

from __future__ import annotations

import contextvars
import pathlib
from collections.abc import Mapping
from typing import Any

from carls_dask.errors import ConfigError, LifecycleError

__all__ = ["RECORD_FORMAT", "RESTORED", "TAKING", "check_record", "layer_record", "load_hook"]

#: Format of a bank layer's record in a state dict.
RECORD_FORMAT = 1

#: The snapshot :func:`~carls_dask.nn.checkpoint.checkpoint_state` took, by ``id`` of the bank, while it builds the
#: state dict.
TAKING: contextvars.ContextVar[dict[int, dict[str, Any]] | None] = contextvars.ContextVar("carls_checkpoint",
                                                                                          default=None)
#: Attribute :func:`~carls_dask.nn.checkpoint.restore_bank` sets on a bank it restored: the store and snapshot
#: version it came from.
RESTORED = "_carls_restored_from"


def layer_record(layer: Any) -> dict[str, Any]:
    """What a bank layer's ``state_dict()`` records: its bank, table and column, and the snapshot of this step.

    The snapshot is the one :func:`~carls_dask.nn.checkpoint.checkpoint_state` is taking now, else ``None``.
    """
    bank = layer.bank
    taking = TAKING.get()
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
    restored = getattr(layer.bank, RESTORED, None)
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
