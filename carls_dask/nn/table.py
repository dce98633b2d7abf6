"""The bank column a layer reads: checked once, and its rows read with or without insertion.

:class:`BankColumn` holds a bank, a table and a float column, checked when the layer is built (an
unknown table or column, a non-float column, a closed bank are refused there). :meth:`BankColumn.read`
is the one read path of every layer: with ``insert=True`` it is CARLS's lookup-with-update (missing keys
are allocated by the table's initializer and every occurrence counts in the key's frequency); with
``insert=False`` nothing in the bank changes and a key the bank does not hold reads the value the
initializer would give it (:func:`initial_rows`), so evaluation sees what training would start from.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from carls_dask.bank.core import LookupResult
from carls_dask.bank.hashing import mix_seed
from carls_dask.bank.initializers import initial_block
from carls_dask.bank.schema import Column, TableSpec
from carls_dask.errors import InvalidBatchError, InvalidDTypeError

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["BankColumn", "initial_rows"]


def initial_rows(spec: TableSpec, column: str, keys: np.ndarray) -> np.ndarray:
    """``[n, *shape]`` values the bank gives ``keys`` of ``spec.column`` when it allocates them.

    The same function of (table, column, key, seed) as the shard's initializer
    (:meth:`carls_dask.bank.core.TableState.initial_values`; ``tests/nn`` checks they agree for every
    initializer), computed here so a read-only lookup can answer unseen keys without inserting them.
    """
    col = spec.column(column)
    kind = col.initializer or (spec.initializer if col.is_float else "zeros")
    scale = float(col.init_scale if col.init_scale is not None else (spec.init_scale or 0.0))
    shape = (int(keys.shape[0]), *col.shape)
    if kind == "zeros":
        return np.zeros(shape, dtype=col.np_dtype)
    if kind == "constant":
        return np.full(shape, scale, dtype=col.np_dtype)
    return initial_block(str(kind), keys, mix_seed(spec.name, col.name, spec.seed), col.shape, scale, col.np_dtype)


class BankColumn:
    """A float column of a bank table, as a layer reads and trains it.

    Parameters
    ----------
    bank
        A :class:`~carls_dask.bank.KnowledgeBank` (Dask actors or in-process shards).
    table, column
        The table and its float column.
    owner
        The layer, named in error messages.
    trainable
        Whether gradients will be sent: the table must then have an optimizer.

    Raises
    ------
    UnknownTableError, UnknownColumnError
        For a table or column the bank does not hold.
    InvalidDTypeError
        For a column that is not float.
    InvalidBatchError
        For a trainable layer over a table without an optimizer.
    """

    def __init__(self, bank: KnowledgeBank, table: str, column: str, owner: str, *, trainable: bool = True) -> None:
        spec = bank.spec(table)
        col: Column = spec.column(column)
        if not col.is_float:
            raise InvalidDTypeError(f"{owner}: column {column!r} of table {table!r} is {col.dtype}; expected a float "
                                    "column (embeddings are float32, float64 or float16)")
        if trainable and spec.optimizer is None:
            raise InvalidBatchError(f"{owner}: table {table!r} has no optimizer, so gradients cannot be applied; "
                                    "expected a table created with optimizer='sgd', 'adagrad' or 'adam' (or build "
                                    "the layer with trainable=False)")
        self.bank = bank
        self.table = str(table)
        self.column = str(column)
        self.spec: TableSpec = spec
        self.col = col
        self.owner = owner

    @property
    def row_shape(self) -> tuple[int, ...]:
        """Shape of one row of the column."""
        return tuple(self.col.shape)

    @property
    def row_width(self) -> int:
        """Elements in one row."""
        return max(1, math.prod(self.col.shape))

    @property
    def dtype(self) -> np.dtype[Any]:
        """The column's dtype."""
        return self.col.np_dtype

    def read(self, keys: np.ndarray, insert: bool) -> np.ndarray:
        """``[n, *shape]`` rows of ``keys`` (see the module docstring for ``insert``), read now."""
        return self.rows_of(self.bank.lookup(self.table, keys, columns=[self.column], insert=insert), keys, insert)

    def rows_of(self, got: LookupResult, keys: np.ndarray, insert: bool) -> np.ndarray:
        """The ``[n, *shape]`` rows a lookup of ``keys`` answered; without ``insert`` a key the bank does not
        hold reads the initializer's value."""
        rows = np.asarray(got.values[self.column])
        if not insert:
            missing = ~np.asarray(got.found, dtype=bool)
            if missing.any():
                rows = rows.copy() if not rows.flags.writeable else rows
                rows[missing] = initial_rows(self.spec, self.column, keys[missing])
        return rows
