"""A Gaussian memory held in a knowledge-bank table: persisted, logged and restored with the bank.

The memory's whole state lives in one bank table (:func:`memory_table`): row ``k`` (``0 <= k <
max_num_clusters``) holds cluster ``k``'s input buffer and ring position, and the row :data:`META_KEY`
holds the settings, the number of clusters and the count of update/grow calls. So a bank snapshot, its
delta log and ``KnowledgeBank.restore`` keep the memory exactly, counters included, on any shard count.

:class:`BankGaussianMemory` is the thin shell: each lookup reads the table's rows in one batched bank call,
runs the pure :func:`carls_dask.memory.gaussian.memory_lookup` on them and, in modes 2 and 3, writes the
clusters and counters back in one batched ``update``. One process should write a memory at a time
(the trainer that owns it); any number may read it with mode 1.

>>> from carls_dask.bank import KnowledgeBank
>>> cfg = MemoryConfig(dim=2, per_cluster_buffer_size=2, max_num_clusters=4, min_variance=1.0)
>>> with KnowledgeBank.local([memory_table("dm", cfg)]) as bank:
...     mem = BankGaussianMemory(bank, "dm", cfg)
...     r = mem.lookup([[1.0, 2.0]], mode=2)
...     (r.mean.tolist(), r.variance.tolist(), r.distance.tolist())
([[1.0, 2.0]], [[1.0, 1.0]], [1.0])
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from carls_dask.bank.schema import Column, TableSpec
from carls_dask.errors import ConfigError, InvalidBatchError
from carls_dask.memory.gaussian import (
    LookupMode,
    MemoryConfig,
    MemoryLookupResult,
    MemoryState,
    memory_lookup,
)

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["META_KEY", "BankGaussianMemory", "memory_table"]

logger = logging.getLogger(__name__)

META_KEY = -1
_CONFIG_SIZE = 7


def memory_table(name: str, config: MemoryConfig) -> TableSpec:
    """The bank table that holds a memory of ``config`` (pass it to ``KnowledgeBank.create``).

    Parameters
    ----------
    name
        Table name (one table per memory).
    config
        The memory's settings; they fix the column shapes.
    """
    b, d = config.per_cluster_buffer_size, config.dim
    return TableSpec(name, columns=(
        Column("buffer", dtype="float64", shape=(b, d), dims=("slot", "dim"), initializer="zeros"),
        Column("fill", dtype="int64", shape=(), dims=()),
        Column("head", dtype="int64", shape=(), dims=()),
        Column("config", dtype="float64", shape=(_CONFIG_SIZE,), dims=("setting",), initializer="zeros"),
        Column("n_clusters", dtype="int64", shape=(), dims=()),
        Column("steps", dtype="int64", shape=(), dims=()),
    ), optimizer=None, initializer="zeros")


class BankGaussianMemory:
    """CARLS's dynamic Gaussian memory, its state in the bank table ``table``.

    Parameters
    ----------
    bank
        A :class:`carls_dask.bank.KnowledgeBank` (actor or in-process) that has the table
        ``memory_table(table, config)``.
    table
        The table's name.
    config
        The settings. A new memory stores them in the table; an existing one (a restored bank) must have
        been made with the same settings. ``None`` reads them from the table (:meth:`open`).

    Raises
    ------
    ConfigError
        If the table does not fit ``config``, holds a memory of other settings, or (``config=None``)
        holds no memory.
    """

    def __init__(self, bank: KnowledgeBank, table: str, config: MemoryConfig | None = None) -> None:
        self.bank = bank
        self.table = table
        shapes = {c.name: (c.dtype, c.shape) for c in bank.spec(table).columns}

        def check_columns(cfg: MemoryConfig) -> None:
            wanted = {c.name: (c.dtype, c.shape) for c in memory_table(table, cfg).columns}
            if shapes != wanted:
                raise ConfigError(f"BankGaussianMemory: table {table!r} has columns {shapes}; expected {wanted} "
                                  f"(made with memory_table({table!r}, config))")

        if config is not None:
            check_columns(config)
        elif "config" not in shapes:
            raise ConfigError(f"BankGaussianMemory: table {table!r} has columns {sorted(shapes)}; it holds no "
                              "memory (expected a table made with memory_table)")
        stored = self._stored_config()
        if config is None:
            if stored is None:
                raise ConfigError(f"BankGaussianMemory: table {table!r} holds no memory yet; pass its MemoryConfig")
            config = stored
            check_columns(config)
        if stored is not None and stored != config:
            raise ConfigError(f"BankGaussianMemory: table {table!r} holds a memory made with {stored}; "
                              f"given {config}")
        self.config = config
        if stored is None:
            self._write(MemoryState.empty(config), range(0), model_step=0)

    @classmethod
    def open(cls, bank: KnowledgeBank, table: str) -> BankGaussianMemory:
        """The memory already held in ``table`` (e.g. after ``KnowledgeBank.restore``), with its settings."""
        return cls(bank, table, None)

    def _stored_config(self) -> MemoryConfig | None:
        r = self.bank.lookup(self.table, np.array([META_KEY], np.int64), columns=["config"])
        if not r.found[0]:
            return None
        try:
            return MemoryConfig.from_vector(r.values["config"][0])
        except (ConfigError, IndexError, ValueError) as exc:
            raise ConfigError(f"BankGaussianMemory: table {self.table!r} holds unreadable settings "
                              f"{r.values['config'][0].tolist()}: {exc}") from exc

    def state(self) -> MemoryState:
        """The memory's state as stored in the bank now (one batched lookup)."""
        c = self.config.max_num_clusters
        keys = np.concatenate([[META_KEY], np.arange(c)]).astype(np.int64)
        r = self.bank.lookup(self.table, keys, columns=["buffer", "fill", "head", "n_clusters", "steps"])
        if not r.found[0]:
            raise InvalidBatchError(f"BankGaussianMemory: table {self.table!r} lost its memory row {META_KEY}")
        found = r.found[1:]
        state = MemoryState(
            buffers=np.where(found[:, None, None], r.values["buffer"][1:], 0.0).astype(np.float64),
            fill=np.where(found, r.values["fill"][1:], 0).astype(np.int64),
            head=np.where(found, r.values["head"][1:], 0).astype(np.int64),
            n_clusters=int(r.values["n_clusters"][0]),
            steps=int(r.values["steps"][0]),
        )
        state.check(self.config, f"BankGaussianMemory {self.table!r}")
        return state

    def _write(self, state: MemoryState, clusters: Any, model_step: int) -> None:
        idx = np.asarray(list(clusters), dtype=np.int64)
        n = len(idx) + 1
        keys = np.concatenate([[META_KEY], idx]).astype(np.int64)
        b, d = self.config.per_cluster_buffer_size, self.config.dim
        values = {
            "buffer": np.concatenate([np.zeros((1, b, d)), state.buffers[idx]]),
            "fill": np.concatenate([[0], state.fill[idx]]).astype(np.int64),
            "head": np.concatenate([[0], state.head[idx]]).astype(np.int64),
            "config": np.repeat(self.config.as_vector()[None, :], n, axis=0),
            "n_clusters": np.full(n, state.n_clusters, np.int64),
            "steps": np.full(n, state.steps, np.int64),
        }
        self.bank.update(self.table, keys, values, model_step=model_step, maker="gaussian-memory")

    def lookup(self, inputs: Any, mode: int | LookupMode = LookupMode.LOOKUP, *,
               model_step: int = 0) -> MemoryLookupResult:
        """CARLS's ``MemoryLookup``: the nearest cluster of each input; modes 2 and 3 also learn from them.

        Parameters
        ----------
        inputs
            ``[..., dim]`` finite numbers.
        mode
            1 (lookup only), 2 (lookup and update) or 3 (lookup, update and grow).
        model_step
            Provenance of the write (modes 2 and 3).

        Raises
        ------
        ConfigError, InvalidShapeError, InvalidBatchError
            For a mode outside 1-3, inputs not shaped ``[..., dim]``, NaN/inf inputs, or mode 1 on an
            empty memory; nothing is written.
        """
        state = self.state()
        before = state.copy()
        result = memory_lookup(state, self.config, inputs, mode)
        if int(mode) != LookupMode.LOOKUP and (state.steps != before.steps):
            changed = np.flatnonzero((state.fill != before.fill) | (state.head != before.head)
                                     | np.any(state.buffers != before.buffers, axis=(1, 2)))
            self._write(state, changed, model_step)
        return result

    def __repr__(self) -> str:
        return f"BankGaussianMemory(table={self.table!r}, {self.config})"
