"""Many bank tables in one module: every table's rows in one message per shard, TorchRec's collections for the bank.

:class:`BankEmbeddingBagCollection` is ``torchrec.EmbeddingBagCollection`` over bank tables: one input
holds every sparse feature's keys (a :class:`~carls_dask.nn.jagged.KeyedJaggedTensor`, or a dict of
feature name to keys), each table serves one or more features, and the output is one pooled ``[batch,
dim]`` block per feature (a :class:`~carls_dask.nn.jagged.KeyedTensor`). :class:`BankEmbeddingCollection`
is ``torchrec.EmbeddingCollection``: rows per key, unpooled.

A forward asks for every table's rows before it waits for one, so they travel together: one message to
each shard, behind the previous step's gradient pushes (see :mod:`carls_dask.nn.pipeline`), and the
backward's pushes of every table travel together with the next send. :meth:`prefetch` reads the next
batch's rows of every table in the same way. Each table is a :class:`~carls_dask.nn.BankEmbeddingBag`
(or :class:`~carls_dask.nn.BankEmbedding`) inside, with its checks, padding and optimizer; the
collection only groups their calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from carls_dask.errors import ConfigError, HookNotImplementedError, InvalidBatchError
from carls_dask.nn.embedding import BankEmbedding, BankEmbeddingBag, BankLayer
from carls_dask.nn.jagged import JaggedTensor, KeyedTensor, as_jagged_features
from carls_dask.nn.keys import as_keys
from carls_dask.nn.pipeline import PipelineStats

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["BankEmbeddingBagCollection", "BankEmbeddingCollection", "BankTableConfig"]


@dataclasses.dataclass(frozen=True)
class BankTableConfig:
    """One bank table of a collection and the features it serves (TorchRec's ``EmbeddingBagConfig``).

    The table's rows, dimension and optimizer are the bank table's own (:class:`~carls_dask.bank.TableSpec`).

    Parameters
    ----------
    table
        The bank table.
    feature_names
        The input features whose keys index it (default: one feature named as the table).
    column
        Its float column.
    pooling
        ``"sum"`` (TorchRec's default), ``"mean"`` or ``"max"``: how a bag collection pools a sample's keys.
    learning_rate, padding_key, trainable
        As for :class:`~carls_dask.nn.BankLayer`.
    """

    table: str
    feature_names: tuple[str, ...] = ()
    column: str = "embedding"
    pooling: str = "sum"
    learning_rate: float | None = None
    padding_key: int | str | None = None
    trainable: bool = True

    @property
    def features(self) -> tuple[str, ...]:
        """The features it serves."""
        return tuple(self.feature_names) or (self.table,)


def _check_configs(owner: str, tables: Sequence[BankTableConfig]) -> None:
    if not tables:
        raise ConfigError(f"{owner}: no tables given; expected at least one BankTableConfig")
    names = [t.table for t in tables]
    if len(set(names)) != len(names):
        raise ConfigError(f"{owner}: tables {names} repeat; expected each bank table once (list every feature "
                          "it serves in its feature_names)")
    features = [f for t in tables for f in t.features]
    if len(set(features)) != len(features):
        raise ConfigError(f"{owner}: features {features} repeat; expected each feature served by one table")


class _Collection(nn.Module):
    """What both collections share: one layer per table, the features each serves, grouped calls."""

    layers: nn.ModuleList

    def __init__(self, bank: KnowledgeBank, tables: Sequence[BankTableConfig], *, pipeline: bool, staleness: int,
                 timeout: float | None) -> None:
        super().__init__()
        self.configs = list(tables)
        _check_configs(type(self).__name__, self.configs)
        # a list, not a ModuleDict: table names such as "items" or "keys" are ModuleDict's own attributes
        self.layers = nn.ModuleList([self._layer(bank, c, pipeline=pipeline, staleness=staleness, timeout=timeout)
                                     for c in self.configs])
        self._at = {c.table: i for i, c in enumerate(self.configs)}

    def _layer(self, bank: KnowledgeBank, c: BankTableConfig, **kw: Any) -> BankLayer:
        raise HookNotImplementedError(f"{type(self).__name__} must implement _layer()")

    def layer(self, table: str) -> BankLayer:
        """The layer of ``table``."""
        if table not in self._at:
            raise InvalidBatchError(f"{type(self).__name__}: no table {table!r}; tables are {list(self._at)}")
        layer = self.layers[self._at[table]]
        assert isinstance(layer, BankLayer)
        return layer

    @property
    def feature_names(self) -> list[str]:
        """Every feature, in the order of the tables and their ``feature_names``."""
        return [f for c in self.configs for f in c.features]

    def _features(self, features: Any) -> dict[str, JaggedTensor]:
        got = as_jagged_features(features, type(self).__name__)
        missing = [f for f in self.feature_names if f not in got]
        if missing:
            raise InvalidBatchError(f"{type(self).__name__}: the input has no feature {missing}; features are "
                                    f"{sorted(got)}, expected {self.feature_names}")
        batch = {got[f].lengths().numel() for f in self.feature_names}
        if len(batch) != 1:
            raise InvalidBatchError(f"{type(self).__name__}: features of {sorted(batch)} samples; expected one batch")
        return got

    @staticmethod
    def _joined(jts: Sequence[JaggedTensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The keys of several features of one table as one bag input: values, offsets, weights."""
        values = torch.cat([jt.values() for jt in jts]) if len(jts) > 1 else jts[0].values()
        lengths = torch.cat([jt.lengths() for jt in jts]) if len(jts) > 1 else jts[0].lengths()
        offsets = torch.zeros(lengths.numel(), dtype=torch.int64)
        if lengths.numel() > 1:
            torch.cumsum(lengths[:-1].to(torch.int64), 0, out=offsets[1:])
        ws = [jt.weights_or_none() for jt in jts]
        weights = None if all(w is None for w in ws) else torch.cat(
            [w if w is not None else torch.ones(jt.values().shape[0]) for w, jt in zip(ws, jts, strict=True)])
        return values, offsets, weights

    def prefetch(self, features: Any, *, insert: bool | None = None) -> None:
        """Start reading the rows ``forward(features)`` will need, every table's in one message per shard."""
        got = self._features(features)
        for c in self.configs:
            values, _, _ = self._joined([got[f] for f in c.features])
            self.layer(c.table).prefetch(values, insert=insert)

    def flush(self) -> None:
        """Send what the bank's queue holds (the last step's pushes) and wait until it has landed."""
        for layer in self.bank_layers():
            layer.flush()

    def pipeline_stats(self, reset: bool = False) -> dict[str, PipelineStats]:
        """Each table's staleness and waiting counters."""
        return {c.table: self.layer(c.table).pipeline_stats(reset) for c in self.configs}

    def prefetch_state(self) -> dict[str, list[dict[str, Any]]]:
        """Each table's prefetched rows not used yet, for a trainer's checkpoint."""
        return {c.table: self.layer(c.table).prefetch_state() for c in self.configs}

    def load_prefetch_state(self, state: Mapping[str, list[dict[str, Any]]]) -> None:
        """Hold prefetched rows from :meth:`prefetch_state`."""
        for t, reads in state.items():
            self.layer(t).load_prefetch_state(list(reads))

    def bank_layers(self) -> Iterable[BankLayer]:
        """The layer of each table."""
        return [self.layer(c.table) for c in self.configs]


class BankEmbeddingBagCollection(_Collection):
    """``torchrec.EmbeddingBagCollection`` over bank tables: pooled rows of every feature, every table in one message.

    Parameters
    ----------
    bank
        The :class:`~carls_dask.bank.KnowledgeBank` holding the tables.
    tables
        One :class:`BankTableConfig` per table.
    pipeline, staleness, timeout
        As for :class:`~carls_dask.nn.BankLayer` (every table's layer takes them).

    Examples
    --------
    >>> ebc = BankEmbeddingBagCollection(bank, [BankTableConfig("users"), BankTableConfig("items",   # doctest: +SKIP
    ...     feature_names=("item", "history"), pooling="mean")])
    >>> out = ebc({"users": user_ids, "item": item_ids, "history": history_ids})  # doctest: +SKIP
    >>> out["history"].shape                                                       # doctest: +SKIP
    torch.Size([1024, 32])
    """

    def __init__(self, bank: KnowledgeBank, tables: Sequence[BankTableConfig], *, pipeline: bool = True, staleness: int = 1,
                 timeout: float | None = None) -> None:
        super().__init__(bank, tables, pipeline=pipeline, staleness=staleness, timeout=timeout)

    def _layer(self, bank: KnowledgeBank, c: BankTableConfig, **kw: Any) -> BankLayer:
        return BankEmbeddingBag(bank, c.table, c.column, mode=c.pooling, padding_key=c.padding_key,
                                learning_rate=c.learning_rate, trainable=c.trainable, **kw)

    def forward(self, features: Any) -> KeyedTensor:
        """Pooled rows of each feature: a :class:`KeyedTensor` of ``[batch, dim]`` blocks in :attr:`feature_names` order."""
        got = self._features(features)
        asked = []
        for c in self.configs:  # every table's read held before any is sent: they travel together
            layer = self.layer(c.table)
            values, offsets, weights = self._joined([got[f] for f in c.features])
            asked.append((c, layer.begin_bags(values, offsets, weights)))  # type: ignore[operator]
        blocks: list[torch.Tensor] = []
        widths: list[int] = []
        for c, bags in asked:
            layer = self.layer(c.table)
            pooled = layer.pool(bags)  # type: ignore[operator]
            blocks.extend(torch.chunk(pooled, len(c.features), dim=0) if len(c.features) > 1 else [pooled])
            widths.extend([layer.embedding_dim] * len(c.features))
        return KeyedTensor(self.feature_names, widths, torch.cat(blocks, dim=1))


class BankEmbeddingCollection(_Collection):
    """``torchrec.EmbeddingCollection`` over bank tables: the row of every key of every feature, every table in one message.

    Input as for :class:`BankEmbeddingBagCollection`; a feature given as a plain tensor of keys (any shape)
    comes back as a ``[*shape, dim]`` tensor, one given as a :class:`JaggedTensor` (or in a
    :class:`KeyedJaggedTensor`) as a :class:`JaggedTensor` of rows. ``pooling`` of the configs is ignored.
    """

    def __init__(self, bank: KnowledgeBank, tables: Sequence[BankTableConfig], *, pipeline: bool = True, staleness: int = 1,
                 timeout: float | None = None) -> None:
        super().__init__(bank, tables, pipeline=pipeline, staleness=staleness, timeout=timeout)

    def _layer(self, bank: KnowledgeBank, c: BankTableConfig, **kw: Any) -> BankLayer:
        return BankEmbedding(bank, c.table, c.column, padding_key=c.padding_key, learning_rate=c.learning_rate,
                             trainable=c.trainable, **kw)

    def _keys_by_feature(self, features: Any) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]] | None,
                                                       dict[str, torch.Tensor] | None]:
        """Each feature's keys, flat; their shapes (plain tensor input) or their lengths (jagged input)."""
        owner = type(self).__name__
        if isinstance(features, Mapping) and not any(isinstance(v, JaggedTensor) for v in features.values()):
            missing = [f for f in self.feature_names if f not in features]
            if missing:
                raise InvalidBatchError(f"{owner}: the input has no feature {missing}; features are "
                                        f"{sorted(features)}, expected {self.feature_names}")
            keys = {f: as_keys(features[f], owner) for f in self.feature_names}
            return {f: k.flat for f, k in keys.items()}, {f: k.shape for f, k in keys.items()}, None
        got = self._features(features)
        return ({f: as_keys(got[f].values(), owner).flat for f in self.feature_names}, None,
                {f: got[f].lengths() for f in self.feature_names})

    def _table_keys(self, c: BankTableConfig, flat: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([flat[f] for f in c.features]) if len(c.features) > 1 else flat[c.features[0]]

    def prefetch(self, features: Any, *, insert: bool | None = None) -> None:
        """Start reading the rows ``forward(features)`` will need, every table's in one message per shard."""
        flat, _, _ = self._keys_by_feature(features)
        for c in self.configs:
            self.layer(c.table).prefetch(self._table_keys(c, flat), insert=insert)

    def forward(self, features: Any) -> dict[str, Any]:
        """Rows of every key, by feature (tensors for tensor input, :class:`JaggedTensor` s for jagged input)."""
        flat, shapes, lengths = self._keys_by_feature(features)
        asked = []
        for c in self.configs:  # every table's read held before any is sent
            layer = self.layer(c.table)
            asked.append((c, layer.begin_rows(self._table_keys(c, flat), layer.inserting())))
        out: dict[str, Any] = {}
        for c, pending in asked:
            rows = self.layer(c.table).finish_rows(pending)
            sizes = [int(flat[f].shape[0]) for f in c.features]
            for f, part in zip(c.features, torch.split(rows, sizes), strict=True):
                if shapes is not None:
                    out[f] = part.reshape(*shapes[f], *part.shape[1:])
                else:
                    assert lengths is not None
                    out[f] = JaggedTensor(part, lengths=lengths[f])
        return out
