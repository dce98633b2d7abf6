"""Table and column descriptions of the knowledge bank, and batch validation against them.

Everything here is pure: no Dask, no I/O. The same validation runs in the client (before a batch is
fanned out, so a bad batch reaches no shard) and in the shard core (so a shard never trusts its caller):
each check (``check_update``, ``check_gradients``, ``check_learning_rate``, ``check_sample_size``,
``check_top_k_query``, ``check_max_staleness``, ...) is written once here and called by both, so both
raise the same error type with the same message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from carls_dask.bank.batchpass import all_finite
from carls_dask.bank.changes import ChangeWatch
from carls_dask.bank.optimizers import compute_dtype
from carls_dask.bank.topk import METRICS
from carls_dask.errors import (
    ConfigError,
    InvalidBatchError,
    InvalidDTypeError,
    InvalidShapeError,
    UnknownColumnError,
    UnknownTableError,
)

__all__ = [
    "DURABILITY",
    "EVICTIONS",
    "INITIALIZERS",
    "OPTIMIZERS",
    "PROVENANCE",
    "Column",
    "TableSpec",
    "check_batch_size",
    "check_counts",
    "check_durability",
    "check_finite",
    "check_gradients",
    "check_keys",
    "check_learning_rate",
    "check_max_staleness",
    "check_provenance",
    "check_sample_size",
    "check_top_k_query",
    "check_update",
    "coerce_column_values",
    "gradient_dtype",
    "nodes_table",
]

INITIALIZERS = ("zeros", "uniform", "normal", "constant")
#: Eviction policies of a bounded table (see :mod:`carls_dask.bank.bounds`).
EVICTIONS = ("lfu", "lru", "oldest")
OPTIMIZERS = ("sgd", "adagrad", "adam")
#: Durability policies of a table (see :attr:`TableSpec.durability` and docs/durability.md).
DURABILITY = ("every-write", "group", "snapshot")
#: Per-row provenance arrays every table carries, with their dtypes.
PROVENANCE: dict[str, np.dtype[Any]] = {
    "version": np.dtype("int64"),
    "model_step": np.dtype("int64"),
    "maker": np.dtype("int32"),
    "wall_time": np.dtype("float64"),
}
_ALLOWED_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "bool")


@dataclasses.dataclass(frozen=True)
class Column:
    """One named, typed column of a bank table.

    Parameters
    ----------
    name
        Column name, e.g. ``"embedding"``.
    dtype
        NumPy dtype name of the stored values.
    shape
        Shape of one row's value; ``()`` for a scalar per row.
    dims
        Dimension names of ``shape`` (used by the xarray view of the bank).
    initializer
        Initializer of this column for newly allocated rows; ``None`` uses the table's initializer for
        float columns and zeros for integer and boolean columns.
    init_scale
        Scale of the column's own initializer; ``None`` uses the table's.
    """

    name: str
    dtype: str = "float32"
    shape: tuple[int, ...] = (64,)
    dims: tuple[str, ...] = ("dim",)
    initializer: str | None = None
    init_scale: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"Column name must be a non-empty string without '/', got {self.name!r}")
        dt = np.dtype(self.dtype)
        if dt.name not in _ALLOWED_DTYPES:
            raise InvalidDTypeError(
                f"column {self.name!r}: dtype {dt.name!r} is not supported; expected one of {_ALLOWED_DTYPES}"
            )
        object.__setattr__(self, "dtype", dt.name)
        shape = tuple(int(s) for s in self.shape)
        if any(s <= 0 for s in shape):
            raise InvalidShapeError(f"column {self.name!r}: every dimension must be positive, got shape {shape}")
        object.__setattr__(self, "shape", shape)
        dims = tuple(self.dims)
        if len(shape) == 0:
            dims = ()
        if len(dims) != len(shape):
            raise InvalidShapeError(
                f"column {self.name!r}: dims {dims} must name each dimension of shape {shape}"
            )
        object.__setattr__(self, "dims", dims)
        if self.initializer is not None and self.initializer not in INITIALIZERS:
            raise ValueError(
                f"column {self.name!r}: initializer {self.initializer!r} is not one of {INITIALIZERS}"
            )

    @property
    def np_dtype(self) -> np.dtype[Any]:
        """The column's dtype as a :class:`numpy.dtype`."""
        return np.dtype(self.dtype)

    @property
    def is_float(self) -> bool:
        """Whether the column holds floating-point values (gradients and NaN checks apply)."""
        return bool(np.issubdtype(self.np_dtype, np.floating))

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of this column."""
        return int(self.np_dtype.itemsize * math.prod(self.shape))

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able description (inverse of :meth:`from_json`)."""
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "dims": list(self.dims),
            "initializer": self.initializer,
            "init_scale": self.init_scale,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Column:
        """Build a column from :meth:`to_json` output."""
        return cls(
            name=data["name"],
            dtype=data["dtype"],
            shape=tuple(data["shape"]),
            dims=tuple(data["dims"]),
            initializer=data.get("initializer"),
            init_scale=data.get("init_scale"),
        )


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """A bank table: named typed columns plus the shard-side optimizer and initializer.

    Parameters
    ----------
    name
        Table name.
    columns
        The table's columns; defaults to one ``embedding float32[64]``.
    optimizer
        ``"sgd"``, ``"adagrad"``, ``"adam"`` or ``None`` (no ``apply_gradients``). The sentinel
        ``"default"`` takes ``carls.bank.optimizer`` when the bank is created.
    learning_rate
        Default learning rate of ``apply_gradients``; ``None`` takes ``carls.bank.learning-rate``.
    initializer
        Default initializer of float columns (``zeros``, ``uniform``, ``normal``, ``constant``);
        ``None`` takes ``carls.bank.initializer``.
    init_scale
        Standard deviation (normal), half-width (uniform) or value (constant); ``None`` takes
        ``carls.bank.init-scale``.
    seed
        Seed of the deterministic per-key initializer.
    adagrad_initial_accumulator
        Starting value of Adagrad accumulators (CARLS recommends 0.1).
    adam_betas, adam_epsilon
        Adam's moment decay rates and epsilon.
    max_rows
        Most rows each shard holds of this table (``None``: unbounded). A write that leaves more rows
        evicts down to a low-water mark (see :mod:`carls_dask.bank.bounds`).
    eviction
        Which rows go first when over ``max_rows``: ``"lfu"`` (lowest frequency), ``"lru"`` (least
        recently used: written or looked up with ``insert=True``) or ``"oldest"`` (least recently written).
    min_frequency
        Admission filter: a key gets a row from ``lookup(insert=True)`` only once it was seen this many
        times (counted in a count-min sketch); 1 admits at once. ``update`` always writes.
    ttl
        Seconds after a row's last write (``"lru"``: last use) at which it expires (``None``: never).
    sketch_width, sketch_depth
        Counters per row and rows of the admission sketch (used when ``min_frequency > 1``).
    watch
        Float columns whose moves each shard tracks for change feeds (:class:`~carls_dask.bank.changes.ChangeWatch`,
        or a column name for any change); read them with
        :meth:`KnowledgeBank.changes <carls_dask.bank.client.KnowledgeBank.changes>`.
    durability
        What an acknowledged write of the table survives (docs/durability.md): ``"every-write"`` (logged and
        ``fdatasync``-ed before the call returns), ``"group"`` (logged before the call returns, synced with
        the other waiting frames every ``carls.bank.log.group-interval``) or ``"snapshot"`` (not logged: a
        lost shard brings the table back at its newest snapshot, and a run rolls its trainer back to the
        same step). ``None`` takes ``carls.bank.durability`` when a bank is created, and a run's
        ``carls.run.durability.trained`` (a table with an optimizer) or ``.written`` (one without).
    """

    name: str
    columns: tuple[Column, ...] = (Column("embedding"),)
    optimizer: str | None = "default"
    learning_rate: float | None = None
    initializer: str | None = None
    init_scale: float | None = None
    seed: int = 0
    adagrad_initial_accumulator: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_epsilon: float = 1e-8
    max_rows: int | None = None
    eviction: str = "lfu"
    min_frequency: int = 1
    ttl: float | None = None
    sketch_width: int = 1 << 20
    sketch_depth: int = 4
    watch: tuple[ChangeWatch, ...] = ()
    durability: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"TableSpec name must be a non-empty string without '/', got {self.name!r}")
        cols = tuple(self.columns)
        if not cols:
            raise ValueError(f"table {self.name!r}: at least one column is required")
        names = [c.name for c in cols]
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name!r}: duplicate column names in {names}")
        object.__setattr__(self, "columns", cols)
        if self.optimizer not in (None, "default", *OPTIMIZERS):
            raise ValueError(f"table {self.name!r}: optimizer {self.optimizer!r} is not one of {OPTIMIZERS} or None")
        if self.initializer is not None and self.initializer not in INITIALIZERS:
            raise ValueError(f"table {self.name!r}: initializer {self.initializer!r} is not one of {INITIALIZERS}")
        if self.learning_rate is not None and not (self.learning_rate > 0):
            raise ValueError(f"table {self.name!r}: learning_rate must be > 0, got {self.learning_rate!r}")
        if self.init_scale is not None and not (self.init_scale >= 0):
            raise ValueError(f"table {self.name!r}: init_scale must be >= 0, got {self.init_scale!r}")
        if not (self.adagrad_initial_accumulator > 0):
            raise ValueError(
                f"table {self.name!r}: adagrad_initial_accumulator must be > 0, got {self.adagrad_initial_accumulator!r}"
            )
        object.__setattr__(self, "adam_betas", tuple(float(b) for b in self.adam_betas))
        if self.durability is not None and self.durability not in DURABILITY:
            raise ConfigError(f"table {self.name!r}: durability {self.durability!r} is not one of {DURABILITY} "
                              "or None (the configured default)")
        self._check_bounds()
        self._check_watch()

    def _check_watch(self) -> None:
        """Validate :attr:`watch`: float columns of this table, each watched once."""
        if isinstance(self.watch, str | ChangeWatch | dict):
            raise ValueError(f"table {self.name!r}: watch must be a sequence of ChangeWatch or column names, got {self.watch!r}")
        try:
            watches = tuple(ChangeWatch.from_json(w) for w in self.watch)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"table {self.name!r}: watch {self.watch!r}: {exc}") from None
        names = {c.name: c for c in self.columns}
        seen: set[str] = set()
        for w in watches:
            col = names.get(w.column)
            if col is None:
                raise ValueError(f"table {self.name!r}: watch names column {w.column!r}; the columns are {sorted(names)}")
            if np.dtype(col.dtype).kind != "f":
                raise ValueError(f"table {self.name!r}: watched column {w.column!r} is {col.dtype}; expected a float column")
            if w.column in seen:
                raise ValueError(f"table {self.name!r}: column {w.column!r} is watched twice")
            seen.add(w.column)
        object.__setattr__(self, "watch", watches)

    def watched(self, column: str) -> ChangeWatch:
        """The watch of ``column`` (raises ``KeyError`` naming the watched columns when it is not watched)."""
        for w in self.watch:
            if w.column == column:
                return w
        raise KeyError(f"table {self.name!r}: column {column!r} is not watched; watched: {[w.column for w in self.watch]}")

    def _check_bounds(self) -> None:
        """Validate the bounded-table options (``max_rows``, ``eviction``, ``min_frequency``, ``ttl``, sketch)."""

        def is_int(v: Any) -> bool:
            return not isinstance(v, bool) and isinstance(v, int | np.integer)

        if self.max_rows is not None and (not is_int(self.max_rows) or int(self.max_rows) < 1):
            raise ValueError(f"table {self.name!r}: max_rows must be None or an int >= 1, got {self.max_rows!r}")
        if self.eviction not in EVICTIONS:
            raise ValueError(f"table {self.name!r}: eviction {self.eviction!r} is not one of {EVICTIONS}")
        if not is_int(self.min_frequency) or int(self.min_frequency) < 1:
            raise ValueError(f"table {self.name!r}: min_frequency must be an int >= 1, got {self.min_frequency!r}")
        if self.ttl is not None:
            ok = not isinstance(self.ttl, bool) and isinstance(self.ttl, int | float | np.integer | np.floating)
            if not ok or not math.isfinite(float(self.ttl)) or float(self.ttl) <= 0:
                raise ValueError(f"table {self.name!r}: ttl must be None or a finite number of seconds > 0, "
                                 f"got {self.ttl!r}")
            object.__setattr__(self, "ttl", float(self.ttl))
        w = self.sketch_width
        if not is_int(w) or int(w) < 64 or int(w) & (int(w) - 1):
            raise ValueError(f"table {self.name!r}: sketch_width must be a power of two >= 64, got {w!r}")
        if not is_int(self.sketch_depth) or not 1 <= int(self.sketch_depth) <= 16:
            raise ValueError(f"table {self.name!r}: sketch_depth must be an int in [1, 16], got {self.sketch_depth!r}")
        for name in ("max_rows", "min_frequency", "sketch_width", "sketch_depth"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, int(v))

    @property
    def trained(self) -> bool:
        """Whether the table is trained by gradients (it has an optimizer), which picks its default durability."""
        return self.optimizer is not None

    @property
    def logged(self) -> bool:
        """Whether the table's writes go to the delta log (every policy but ``"snapshot"``)."""
        return self.durability != "snapshot"

    @property
    def is_bounded(self) -> bool:
        """Whether the table has a row cap, an admission filter or a time-to-live."""
        return self.max_rows is not None or self.min_frequency > 1 or self.ttl is not None

    # -- lookups -----------------------------------------------------------------------------------
    @property
    def column_names(self) -> tuple[str, ...]:
        """Names of the columns in declaration order."""
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        """Return the column called ``name``.

        Raises
        ------
        UnknownColumnError
            If the table has no such column.
        """
        for c in self.columns:
            if c.name == name:
                return c
        raise UnknownColumnError(
            f"table {self.name!r} has no column {name!r}; its columns are {list(self.column_names)}"
        )

    @property
    def is_resolved(self) -> bool:
        """Whether every default has been filled in (see :meth:`resolve`)."""
        return (
            self.optimizer != "default"
            and self.learning_rate is not None
            and self.initializer is not None
            and self.init_scale is not None
        )

    def resolve(
        self, *, optimizer: str | None, learning_rate: float, initializer: str, init_scale: float,
        durability: str | None = None,
    ) -> TableSpec:
        """Return a copy with unset fields taken from the given defaults (``durability`` only when given)."""
        return dataclasses.replace(
            self,
            optimizer=optimizer if self.optimizer == "default" else self.optimizer,
            learning_rate=learning_rate if self.learning_rate is None else self.learning_rate,
            initializer=initializer if self.initializer is None else self.initializer,
            init_scale=init_scale if self.init_scale is None else self.init_scale,
            durability=durability if self.durability is None else self.durability,
        )

    def slot_names(self) -> tuple[str, ...]:
        """Names of the optimizer slots each float column keeps."""
        return {"adagrad": ("accumulator",), "adam": ("m", "v", "step")}.get(str(self.optimizer), ())

    def payload_bytes(self) -> int:
        """Bytes of one row's column values."""
        return sum(c.row_bytes for c in self.columns)

    # -- JSON --------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able description (inverse of :meth:`from_json`)."""
        return {
            "name": self.name,
            "columns": [c.to_json() for c in self.columns],
            "optimizer": self.optimizer,
            "learning_rate": self.learning_rate,
            "initializer": self.initializer,
            "init_scale": self.init_scale,
            "seed": self.seed,
            "adagrad_initial_accumulator": self.adagrad_initial_accumulator,
            "adam_betas": list(self.adam_betas),
            "adam_epsilon": self.adam_epsilon,
            "max_rows": self.max_rows,
            "eviction": self.eviction,
            "min_frequency": self.min_frequency,
            "ttl": self.ttl,
            "sketch_width": self.sketch_width,
            "sketch_depth": self.sketch_depth,
            "watch": [w.to_json() for w in self.watch],
            "durability": self.durability,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableSpec:
        """Build a table spec from :meth:`to_json` output."""
        return cls(
            name=data["name"],
            columns=tuple(Column.from_json(c) for c in data["columns"]),
            optimizer=data.get("optimizer"),
            learning_rate=data.get("learning_rate"),
            initializer=data.get("initializer"),
            init_scale=data.get("init_scale"),
            seed=int(data.get("seed", 0)),
            adagrad_initial_accumulator=float(data.get("adagrad_initial_accumulator", 0.1)),
            adam_betas=tuple(data.get("adam_betas", (0.9, 0.999))),
            adam_epsilon=float(data.get("adam_epsilon", 1e-8)),
            max_rows=data.get("max_rows"),
            eviction=data.get("eviction", "lfu"),
            min_frequency=data.get("min_frequency", 1),
            ttl=data.get("ttl"),
            sketch_width=data.get("sketch_width", 1 << 20),
            sketch_depth=data.get("sketch_depth", 4),
            watch=tuple(ChangeWatch.from_json(w) for w in data.get("watch", ())),
            durability=data.get("durability"),
        )


def nodes_table(
    name: str = "nodes", *, dim: int = 64, classes: int = 7, neighbours: int = 8, **kwargs: Any
) -> TableSpec:
    """The typical knowledge table: embedding, logits, pseudo label, confidence, difficulty, neighbours."""
    return TableSpec(
        name,
        columns=(
            Column("embedding", "float32", (dim,), ("dim",)),
            Column("logits", "float32", (classes,), ("class",), initializer="zeros"),
            Column("pseudo_label", "int64", (), ()),
            Column("confidence", "float32", (), (), initializer="zeros"),
            Column("difficulty", "float32", (), (), initializer="zeros"),
            Column("neighbours", "int64", (neighbours,), ("neighbour",)),
        ),
        **kwargs,
    )


def check_durability(value: Any, where: str) -> str:
    """A durability policy named by a setting (``where``, e.g. ``"carls.bank.durability"``), checked.

    Raises
    ------
    ConfigError
        Naming the setting, the value and the policies.
    """
    if value not in DURABILITY:
        raise ConfigError(f"{where}: durability {value!r}; expected one of {DURABILITY}")
    return str(value)


# -- batch validation -------------------------------------------------------------------------------
def check_keys(table: str, keys: np.ndarray, *, allow_empty: bool = False) -> np.ndarray:
    """Validate a key batch and return it as a contiguous ``int64[n]``.

    Raises
    ------
    InvalidShapeError
        If the keys are not one-dimensional.
    InvalidDTypeError
        If the keys are not integers.
    InvalidBatchError
        If the batch is empty (unless allowed) or a key does not fit in int64.
    """
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise InvalidShapeError(f"table {table!r}: keys must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0 and not allow_empty:
        raise InvalidBatchError(f"table {table!r}: empty batch (0 keys); expected at least one key")
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidDTypeError(
            f"table {table!r}: keys must be integers (int64) or strings hashed by the client, got dtype {arr.dtype}"
        )
    if arr.dtype.kind == "u" and arr.dtype.itemsize >= 8 and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidBatchError(
            f"table {table!r}: key {int(arr.max())} is out of range; expected keys within int64 "
            f"[{np.iinfo(np.int64).min}, {np.iinfo(np.int64).max}]"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_batch_size(table: str, what: str, n: int) -> None:
    """Raise :class:`InvalidBatchError` when a batch exceeds ``carls.bank.max-batch-keys`` (nothing allocated yet)."""
    from carls_dask import config

    limit = int(config.get("bank.max-batch-keys"))
    if n > limit:
        raise InvalidBatchError(
            f"table {table!r}: batch of {n} {what}; expected at most {limit} (carls.bank.max-batch-keys)"
        )


def check_finite(table: str, column: str, what: str, arr: np.ndarray) -> None:
    """Raise :class:`InvalidBatchError` if a float array holds NaN or Inf."""
    if arr.dtype.kind == "f" and arr.size and not all_finite(arr):
        bad = np.argwhere(~np.isfinite(arr.reshape(arr.shape[0], -1)))[0]
        raise InvalidBatchError(
            f"table {table!r}, column {column!r}: {what} contain NaN or Inf (first at row {int(bad[0])}); "
            "expected finite values"
        )


def coerce_column_values(
    table: str, col: Column, values: Any, n: int, *, what: str = "values", dtype: np.dtype[Any] | None = None
) -> np.ndarray:
    """Validate one column's batch of values and return it cast to the column's dtype.

    Parameters
    ----------
    table
        Table name, for messages.
    col
        The target column.
    values
        Array-like of shape ``[n, *col.shape]``.
    n
        Number of keys in the batch.
    what
        ``"values"`` or ``"gradients"``, for messages.
    dtype
        Target dtype; defaults to the column's.

    Raises
    ------
    InvalidDTypeError
        If the values cannot be cast safely (same kind) to the target dtype.
    InvalidShapeError
        If the shape is not ``[n, *col.shape]``.
    InvalidBatchError
        If float values hold NaN or Inf.
    """
    target = np.dtype(dtype) if dtype is not None else col.np_dtype
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf" or not np.can_cast(arr.dtype, target, casting="same_kind"):
        raise InvalidDTypeError(
            f"table {table!r}, column {col.name!r}: {what} of dtype {arr.dtype} cannot be stored as {target}; "
            f"expected a numeric array castable to {target}"
        )
    expected = (n, *col.shape)
    if arr.shape != expected:
        raise InvalidShapeError(
            f"table {table!r}, column {col.name!r}: {what} have shape {arr.shape}; expected {expected} "
            f"({n} keys x {col.dtype}{list(col.shape)})"
        )
    if target.kind == "f" and arr.dtype.kind == "f":
        check_finite(table, col.name, what, arr)
        if arr.dtype.itemsize > target.itemsize:
            finfo = np.finfo(target)
            if arr.size and float(np.abs(arr).max()) > float(finfo.max):
                raise InvalidBatchError(
                    f"table {table!r}, column {col.name!r}: {what} overflow {target} (max |x| = "
                    f"{float(np.abs(arr).max()):.3g}); expected |x| <= {float(finfo.max):.3g}"
                )
    if target.kind in "iu" and arr.dtype.kind in "iu" and arr.size:
        info = np.iinfo(target)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            raise InvalidBatchError(
                f"table {table!r}, column {col.name!r}: {what} out of range for {target} "
                f"(got [{lo}, {hi}]); expected values within [{info.min}, {info.max}]"
            )
    return np.ascontiguousarray(arr, dtype=target)


def check_columns_given(table: TableSpec, names: Sequence[str]) -> None:
    """Raise :class:`UnknownColumnError` for a name the table does not hold."""
    for name in names:
        table.column(name)


def unknown_table(name: str, known: Sequence[str]) -> UnknownTableError:
    """Build the error for a table name the bank does not hold."""
    return UnknownTableError(f"unknown table {name!r}; the bank holds tables {sorted(known)}")


def check_max_staleness(table: str, max_staleness: float | None) -> None:
    """Raise :class:`InvalidBatchError` unless ``max_staleness`` is None or a number of seconds >= 0."""
    if max_staleness is not None and not (float(max_staleness) >= 0):
        raise InvalidBatchError(f"table {table!r}: max_staleness must be >= 0 seconds, got {max_staleness!r}")


def check_update(
    spec: TableSpec, n: int, values: Any, model_step: Any, maker: Any
) -> dict[str, np.ndarray]:
    """Validate an ``update`` batch of ``n`` keys; returns each column's values cast to its dtype.

    Raises
    ------
    InvalidBatchError
        If ``values`` is not a non-empty mapping, or values hold NaN/Inf or are out of range.
    UnknownColumnError
        For a column the table does not hold.
    InvalidShapeError, InvalidDTypeError
        For values of the wrong shape or dtype, a ``model_step`` that is not an int or a ``maker``
        that is not a str.
    """
    table = spec.name
    if not isinstance(values, Mapping) or not values:
        raise InvalidBatchError(
            f"table {table!r}: values must be a non-empty dict of column -> array, got {type(values).__name__}"
        )
    checked = {name: coerce_column_values(table, spec.column(name), v, n) for name, v in values.items()}
    check_provenance(table, model_step, maker)
    return checked


def check_counts(table: str, counts: Any, n: int) -> np.ndarray:
    """Validate a lookup's ``counts`` (how often each of ``n`` keys counts in its frequency): ``int64[n]``, each >= 1.

    Raises
    ------
    InvalidShapeError
        For counts of another length or shape.
    InvalidDTypeError
        For counts that are not integers.
    InvalidBatchError
        For a count below 1.
    """
    c = np.asarray(counts)
    if c.shape != (n,):
        raise InvalidShapeError(f"table {table!r}: counts of shape {c.shape}; expected ({n},), one per key")
    if c.size and c.dtype.kind not in "iu":
        raise InvalidDTypeError(f"table {table!r}: counts of dtype {c.dtype}; expected integers")
    c = np.ascontiguousarray(c, dtype=np.int64)
    if c.size and int(c.min()) < 1:
        raise InvalidBatchError(f"table {table!r}: counts hold {int(c.min())}; expected every count >= 1")
    return c


def check_provenance(table: str, model_step: Any, maker: Any, *, optional: bool = False) -> None:
    """Check a write's provenance: ``model_step`` an int and ``maker`` a str (either may be None when ``optional``).

    Raises
    ------
    InvalidDTypeError
        For a ``model_step`` that is not an int or a ``maker`` that is not a str.
    """
    if not (optional and model_step is None) and (
            isinstance(model_step, bool) or not isinstance(model_step, int | np.integer)):
        raise InvalidDTypeError(f"table {table!r}: model_step must be an int, got {model_step!r}")
    if not (optional and maker is None) and not isinstance(maker, str):
        raise InvalidDTypeError(f"table {table!r}: maker must be a str, got {type(maker).__name__}")


def check_learning_rate(table: str, learning_rate: Any) -> float:
    """Return ``learning_rate`` as a float; raise :class:`InvalidBatchError` unless it is finite and > 0."""
    try:
        lr = float(learning_rate)
    except (TypeError, ValueError):
        lr = math.nan
    if not (lr > 0) or not math.isfinite(lr):
        raise InvalidBatchError(f"table {table!r}: learning_rate must be a finite number > 0, got {learning_rate!r}")
    return lr


def gradient_dtype(col: Column) -> np.dtype[Any]:
    """The dtype gradients of ``col`` are checked and applied in (see :func:`~carls_dask.bank.optimizers.compute_dtype`)."""
    return compute_dtype(col.np_dtype)


def check_gradients(
    spec: TableSpec, n: int, grads: Any, column: str = "embedding", learning_rate: float | None = None
) -> tuple[dict[str, np.ndarray], float]:
    """Validate an ``apply_gradients`` batch of ``n`` keys.

    ``grads`` is a mapping of column -> array, or one array for ``column``. ``learning_rate`` None
    takes the table's.

    Returns
    -------
    tuple
        Each column's gradients (cast to :func:`gradient_dtype`) and the learning rate to apply.

    Raises
    ------
    InvalidBatchError
        If the table has no optimizer, no gradients are given, or the learning rate is not finite and > 0.
    InvalidDTypeError
        For gradients of a non-float column, or of a dtype that cannot be cast.
    InvalidShapeError
        For gradients of the wrong shape.
    """
    table = spec.name
    if spec.optimizer is None:
        raise InvalidBatchError(f"table {table!r} has no optimizer; create it with optimizer='sgd', 'adagrad' or 'adam'")
    g = grads if isinstance(grads, Mapping) else {column: grads}
    if not g:
        raise InvalidBatchError(f"table {table!r}: gradients must be a non-empty dict of column -> array")
    checked: dict[str, np.ndarray] = {}
    for name, v in g.items():
        col = spec.column(name)
        if not col.is_float:
            raise InvalidDTypeError(
                f"table {table!r}, column {name!r}: gradients need a float column, but it is {col.dtype}"
            )
        checked[name] = coerce_column_values(table, col, v, n, what="gradients", dtype=gradient_dtype(col))
    lr = check_learning_rate(table, spec.learning_rate if learning_rate is None else learning_rate)
    return checked, lr


def check_sample_size(table: str, n: Any) -> int:
    """Return the sample size ``n`` as an int; raise unless it is an int within ``carls.bank.max-batch-keys``."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise InvalidDTypeError(f"table {table!r}: sample size must be an int, got {n!r}")
    check_batch_size(table, "samples", int(n))
    return int(n)


def check_top_k_query(spec: TableSpec, query: Any, k: Any, column: str = "embedding",
                      metric: str = "dot") -> np.ndarray:
    """Validate a top-k query ``float[q, d]`` of ``spec``'s ``column``; returns it as ``float32[q, d]``.

    Raises
    ------
    InvalidBatchError
        For an unknown metric, a ``k`` that is not a positive int, a query with NaN/Inf, or more
        than ``carls.bank.max-batch-keys`` results.
    InvalidShapeError
        If the column is not a float vector column, or the query is not ``(q > 0, d)``.
    InvalidDTypeError
        For a non-numeric query.
    """
    table = spec.name
    col = spec.column(column)
    if metric not in METRICS:
        raise InvalidBatchError(f"table {table!r}: metric {metric!r} is unknown; expected one of {METRICS}")
    if len(col.shape) != 1 or not col.is_float:
        raise InvalidShapeError(
            f"table {table!r}, column {column!r}: top_k needs a float vector column, got {col.dtype}{list(col.shape)}"
        )
    q = np.asarray(query)
    if q.ndim != 2 or q.shape[1] != col.shape[0] or q.shape[0] == 0:
        raise InvalidShapeError(
            f"table {table!r}, column {column!r}: query has shape {q.shape}; expected (q>0, {col.shape[0]})"
        )
    if q.dtype.kind not in "iuf":
        raise InvalidDTypeError(f"table {table!r}: query of dtype {q.dtype} is not numeric")
    q = q.astype(np.float32)
    check_finite(table, column, "query", q)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or int(k) <= 0:
        raise InvalidBatchError(f"table {table!r}: k must be a positive int, got {k!r}")
    check_batch_size(table, "top-k results (queries x k)", q.shape[0] * int(k))
    return q
