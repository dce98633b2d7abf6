"""Embedding layers whose table lives in the knowledge bank: :class:`BankEmbedding` and :class:`BankEmbeddingBag`.

They are :class:`torch.nn.Embedding` and :class:`torch.nn.EmbeddingBag` with the weight matrix replaced by
a float column of a bank table, as CARLS's ``DynamicEmbeddingLookup`` replaces a Keras embedding:

- **forward, training** (``module.training`` and gradients enabled): the keys are looked up with insert,
  so the table's initializer allocates unseen keys and every occurrence of a key counts in its
  frequency (what the bank's ``log_uniform`` negative sampler ranks by);
- **forward, evaluation** (``module.eval()``, ``torch.no_grad()`` or ``torch.inference_mode()``): a read
  only; an unseen key reads the value the initializer would give it and nothing is inserted or counted.
  CARLS's kernel inserts on every lookup, evaluation included; here evaluation leaves the bank as it was;
- **backward**: the gradient of the rows the batch touched, duplicates summed, goes to the table's
  server-side optimizer (``bank.apply_gradients``: SGD, Adagrad or Adam on the shards) through a custom
  autograd function. The module holds no parameter for the table, so a torch optimizer over
  ``model.parameters()`` trains the rest of the model and the bank trains the table.

On a CUDA model (``model.to("cuda")``) the rows of a batch move to the device once per forward and their
summed gradients back once per backward. :meth:`prefetch` and ``pipeline=True`` overlap the bank's calls
with the training step, within a bound on staleness (see :mod:`carls_dask.nn.pipeline`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from carls_dask.bank.gradsum import sum_by_row
from carls_dask.errors import ConfigError, InvalidBatchError, InvalidShapeError
from carls_dask.nn import record
from carls_dask.nn.keys import LayerKeys, as_keys, padding_key_of
from carls_dask.nn.pipeline import PipelineStats, RowPipeline
from carls_dask.nn.table import BankColumn

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["BankEmbedding", "BankEmbeddingBag", "BankLayer"]

BAG_MODES = ("sum", "mean", "max")


class _Rows:
    """What the autograd function carries from forward to backward (not a tensor, so autograd ignores it)."""

    __slots__ = ("keys", "layer", "rows", "unique")

    def __init__(self, layer: BankLayer, keys: np.ndarray, rows: torch.Tensor, unique: bool = False) -> None:
        self.layer = layer
        self.keys = keys
        self.rows = rows
        self.unique = unique


class _Pending:
    """A layer's read asked for and not finished: the keys, the padding mask, the distinct keys read (and where
    each key's row is among them) and the read itself."""

    __slots__ = ("flat", "inverse", "pad", "read", "uniq", "use")

    def __init__(self, flat: np.ndarray, pad: np.ndarray | None, use: np.ndarray, uniq: np.ndarray,
                 inverse: np.ndarray, read: Any) -> None:
        self.flat = flat
        self.pad = pad
        self.use = use
        self.uniq = uniq
        self.inverse = inverse
        self.read = read




class _BankRowsFunction(torch.autograd.Function):
    """Identity on rows read from the bank; its backward sends their gradient to the bank's optimizer.

    The ``anchor`` input is an empty tensor that requires grad, so autograd calls :meth:`backward`
    (CARLS's ``grad_placeholder`` plays the same part); it receives no gradient.
    """

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, payload: _Rows) -> torch.Tensor:
        ctx.payload = payload
        return payload.rows

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        payload: _Rows = ctx.payload
        payload.layer._push_gradient(payload.keys, grad, payload.unique)
        return None, None


class BankLayer(nn.Module):
    """What :class:`BankEmbedding` and :class:`BankEmbeddingBag` share: a bank column read and trained.

    Parameters
    ----------
    bank
        A :class:`~carls_dask.bank.KnowledgeBank`: Dask actors (the layer pickles into a trainer's task
        with it) or in-process shards (:meth:`KnowledgeBank.local <carls_dask.bank.KnowledgeBank.local>`).
    table
        The bank table holding the embeddings.
    column
        Its float column (``"embedding"`` by default).
    padding_key
        A key (int, or str hashed as the bank hashes it) that stands for padding: it is never looked up
        or inserted, reads zeros and receives no gradient (CARLS gives the empty string a zero row; pass
        ``padding_key=""`` for that).
    learning_rate
        Learning rate of the gradient pushes (``None``: the table's). An attribute, so a schedule may
        change it between steps.
    trainable
        Send gradients to the bank (needs a table with an optimizer); ``False`` reads only.
    pipeline
        When a forward is served from a :meth:`prefetch`, send what the bank's queue holds (the previous
        step's gradient pushes, the next prefetches) in the background, so it overlaps the step (the
        default; in-process shards run every call inline). Without prefetches the order is exact either
        way: a forward's read travels behind the previous step's pushes (see :mod:`carls_dask.nn.pipeline`).
    staleness
        Most updates of its own a row served from a prefetch may have missed (0: exact order, rows over
        the bound are read again).
    timeout
        Seconds one wait for the bank may take (default four times the bank's call timeout).
    """

    _anchor: torch.Tensor

    def __init__(self, bank: KnowledgeBank, table: str, column: str = "embedding", *, padding_key: int | str | None = None,
                 learning_rate: float | None = None, trainable: bool = True, pipeline: bool = True,
                 staleness: int = 1, timeout: float | None = None) -> None:
        super().__init__()
        owner = f"{type(self).__name__}(table {table!r})"
        self.source = BankColumn(bank, table, column, owner, trainable=trainable)
        self.padding_key = padding_key
        self._pad = padding_key_of(padding_key, owner)
        if learning_rate is not None and not (float(learning_rate) > 0):
            raise ConfigError(f"{owner}: learning_rate={learning_rate!r}; expected a number > 0 or None")
        self.learning_rate = learning_rate
        self.trainable = bool(trainable)
        self.pipeline = bool(pipeline)
        self.rows = RowPipeline(self.source, staleness=staleness, asynchronous=pipeline, timeout=timeout)
        # moves with model.to(device) / .double(): the device and dtype rows are handed out in
        self.register_buffer("_anchor", torch.empty(0, dtype=_torch_dtype(self.source.dtype)), persistent=False)
        self.register_load_state_dict_pre_hook(record.load_hook)

    # -- properties ---------------------------------------------------------------------------------
    @property
    def bank(self) -> Any:
        """The knowledge bank."""
        return self.source.bank

    @property
    def table(self) -> str:
        """The bank table."""
        return self.source.table

    @property
    def column(self) -> str:
        """The bank column."""
        return self.source.column

    @property
    def embedding_dim(self) -> int:
        """Elements of one row."""
        return self.source.row_width

    @property
    def staleness(self) -> int:
        """The bound on the updates a prefetched row may have missed."""
        return self.rows.staleness

    @property
    def _owner(self) -> str:
        return self.source.owner

    def inserting(self) -> bool:
        """Whether a forward now looks up with insert (training mode and gradients enabled)."""
        return bool(self.training and torch.is_grad_enabled())

    # -- the one read path ------------------------------------------------------------------------------
    def lookup(self, keys: Any, *, insert: bool | None = None) -> torch.Tensor:
        """Rows of ``keys`` as a ``[*keys.shape, *row]`` tensor on the layer's device (padding reads zeros).

        ``insert=None`` follows the module (:meth:`inserting`); ``insert=False`` reads without
        allocating or counting even in training (e.g. sampled candidates). The rows carry the bank
        gradient path when the layer is trainable and gradients are enabled.
        """
        k = keys if isinstance(keys, LayerKeys) else as_keys(keys, self._owner)
        rows = self._flat_rows(k.flat, self.inserting() if insert is None else bool(insert))
        return rows.reshape(*k.shape, *self.source.row_shape)

    def _flat_rows(self, flat: np.ndarray, insert: bool) -> torch.Tensor:
        """``[n, *row]`` rows of ``flat`` keys, padding keys as zero rows, on the bank gradient path."""
        return self.finish_rows(self.begin_rows(flat, insert))

    def begin_rows(self, flat: np.ndarray, insert: bool) -> _Pending:
        """Ask for the rows of ``flat`` keys (padding left out): matched to a prefetch or held in the bank's
        queue, not sent yet. :meth:`finish_rows` sends and waits; a collection begins every table's read
        before it finishes one, so they travel together.

        Each distinct key is read once (with insert, it counts once per occurrence all the same), so a
        batch's repeated keys neither travel nor come back twice; backward sums their gradients into the
        distinct rows, as ``torch.nn.Embedding``'s sparse gradient does before its optimizer steps.
        """
        pad = None if self._pad is None else flat == self._pad
        use = flat if pad is None or not pad.any() else flat[~pad]
        if not use.size:
            return _Pending(flat, pad, use, use, use, None)
        uniq, inverse, counts = self.rows.distinct(use)
        read = self.rows.begin_read(uniq, insert, counts if insert and uniq.shape[0] < use.shape[0] else None)
        return _Pending(flat, pad, use, uniq, inverse, read)

    def finish_unique(self, p: _Pending) -> tuple[torch.Tensor, np.ndarray]:
        """The ``[u, *row]`` rows of the distinct keys :meth:`begin_rows` asked for, on the bank gradient path,
        and where each (non-padding) key's row is among them."""
        got = self._tensor(self.rows.end_read(p.read))
        return self.track(p.uniq, got, unique=True), p.inverse

    def finish_rows(self, p: _Pending) -> torch.Tensor:
        """The ``[n, *row]`` rows :meth:`begin_rows` asked for, padding keys as zero rows, on the bank gradient path."""
        n = int(p.flat.shape[0])
        if p.read is None:
            return torch.zeros((n, *self.source.row_shape), dtype=self._anchor.dtype, device=self._anchor.device)
        u, inverse = self.finish_unique(p)
        t = u if p.uniq.shape[0] == p.use.shape[0] and _identity(inverse) else \
            u.index_select(0, torch.from_numpy(inverse).to(u.device))
        if p.pad is None or p.use is p.flat:
            return t
        where = torch.from_numpy(np.flatnonzero(~p.pad)).to(t.device)
        return t.new_zeros((n, *self.source.row_shape)).index_copy(0, where, t)

    def read(self, keys: np.ndarray, insert: bool) -> torch.Tensor:
        """``[n, *row]`` rows of ``int64`` ``keys`` on the layer's device and dtype, outside autograd."""
        return self._tensor(self.rows.read(keys, insert))

    def _tensor(self, got: np.ndarray) -> torch.Tensor:
        if not (got.flags.writeable and got.flags.c_contiguous):  # torch shares memory only with writable arrays
            got = np.array(got, order="C")
        return torch.from_numpy(got).to(device=self._anchor.device, dtype=self._anchor.dtype, non_blocking=True)

    def track(self, keys: np.ndarray, rows: torch.Tensor, *, unique: bool = False) -> torch.Tensor:
        """``rows`` of ``keys`` put on the bank gradient path: their gradient is pushed in backward.

        Returns ``rows`` unchanged when the layer is not trainable, is in eval mode, or gradients are
        disabled. Rows read separately (say, with and without insert) and tracked together are pushed as
        one update, duplicates summed (``unique=True`` says ``keys`` holds none).
        """
        if not (self.trainable and self.training and torch.is_grad_enabled()):
            return rows
        anchor_leaf = torch.empty(0, device=rows.device, requires_grad=True)
        out: torch.Tensor = _BankRowsFunction.apply(anchor_leaf, _Rows(self, keys, rows, unique))
        return out

    def _push_gradient(self, keys: np.ndarray, grad: torch.Tensor, unique: bool = False) -> None:
        """Sum the gradient of duplicate keys, move it to the host once, push it.

        On the host the sum is the bank's own (:func:`~carls_dask.bank.gradsum.sum_by_row`: one compiled
        pass, each key's gradients added in batch order); on a GPU the rows are summed there, so only
        the unique rows travel back.
        """
        n = int(keys.shape[0])
        g = grad.detach().reshape(n, -1)
        if unique:
            uniq, inverse = keys, None
        else:
            uniq, inverse = np.unique(keys, return_inverse=True)
            inverse = inverse.reshape(-1)
        if inverse is None or uniq.shape[0] == n:
            out_keys, host = keys, g.to("cpu").numpy()
        elif g.device.type == "cpu":
            first, host = sum_by_row(inverse, g.numpy())
            out_keys = uniq[first]
        else:
            idx = torch.from_numpy(inverse).to(g.device)
            summed = torch.zeros((uniq.shape[0], g.shape[1]), dtype=g.dtype, device=g.device).index_add_(0, idx, g)
            out_keys, host = uniq, summed.to("cpu").numpy()
        target = np.promote_types(self.source.dtype, np.float32)
        self.rows.push(out_keys, host.reshape(-1, *self.source.row_shape).astype(target, copy=False),
                       self.learning_rate)

    # -- pipelining ----------------------------------------------------------------------------------------
    def prefetch(self, input: Any, *, insert: bool | None = None) -> None:
        """Start reading the rows ``forward(input)`` will need, so the read overlaps the current step.

        The next forward with the same keys (and the same ``insert``, by default the module's mode now)
        uses them; a row they share with a batch whose gradient was pushed after the read misses that
        update, within the layer's ``staleness`` bound. Input as for :meth:`forward`; it is checked here.
        """
        flat = self._bag_keys(input).flat
        if self._pad is not None:
            flat = flat[flat != self._pad]
        if flat.size:
            ins = self.inserting() if insert is None else bool(insert)
            uniq, _, counts = self.rows.distinct(flat, keep=True)
            self.rows.prefetch(uniq, ins, counts if ins and uniq.shape[0] < flat.shape[0] else None)

    def _bag_keys(self, input: Any) -> LayerKeys:
        """``input`` as keys (the bag also checks its shape)."""
        return as_keys(input, self._owner)

    def flush(self) -> None:
        """Send the bank queue's held calls (the last step's gradient push among them) and wait until they have
        landed (raises a push's error)."""
        self.rows.flush()

    def prefetch_state(self) -> list[dict[str, Any]]:
        """The prefetched rows not used yet (see :meth:`RowPipeline.export_prefetches
        <carls_dask.nn.pipeline.RowPipeline.export_prefetches>`), for a trainer's checkpoint."""
        return self.rows.export_prefetches()

    def load_prefetch_state(self, reads: list[dict[str, Any]]) -> None:
        """Queue prefetched rows from :meth:`prefetch_state` (a trainer resumed from its checkpoint)."""
        self.rows.import_prefetches(reads)

    def close(self) -> None:
        """Flush (the bank stays open; its queue's thread stops when the bank closes)."""
        self.rows.close()

    def pipeline_stats(self, reset: bool = False) -> PipelineStats:
        """Staleness and waiting counters of the layer's reads (see :class:`~carls_dask.nn.pipeline.PipelineStats`)."""
        return self.rows.reset_stats() if reset else self.rows.stats

    def get_extra_state(self) -> dict[str, Any]:
        """The layer's record in ``state_dict()``: its bank, table, column and the bank snapshot of the
        checkpoint's step (see :mod:`carls_dask.nn.checkpoint`)."""
        return record.layer_record(self)

    def set_extra_state(self, state: Any) -> None:
        """Check a loaded record against the layer's bank (see :func:`carls_dask.nn.record.check_record`)."""
        record.check_record(self, state)

    def extra_repr(self) -> str:
        parts = [f"table={self.table!r}", f"column={self.column!r}", f"embedding_dim={self.embedding_dim}",
                 f"optimizer={self.source.spec.optimizer!r}"]
        if self.padding_key is not None:
            parts.append(f"padding_key={self.padding_key!r}")
        if self.learning_rate is not None:
            parts.append(f"learning_rate={self.learning_rate}")
        if not self.trainable:
            parts.append("trainable=False")
        if not self.pipeline:
            parts.append("pipeline=False")
        if self.staleness != 1:
            parts.append(f"staleness={self.staleness}")
        return ", ".join(parts)


class BankEmbedding(BankLayer):
    """:class:`torch.nn.Embedding` over a bank table: keys of any shape to rows of shape ``[..., D]``.

    Parameters are those of :class:`BankLayer`. Keys are an integer tensor or array of any shape, or
    (nested) lists of ints or strings; strings are hashed as the bank hashes them, so
    ``layer(["cat"])`` reads the row ``bank.lookup(table, ["cat"])`` reads.

    Examples
    --------
    >>> emb = BankEmbedding(bank, "words")                 # doctest: +SKIP
    >>> emb(torch.tensor([[1, 2], [3, 1]])).shape           # doctest: +SKIP
    torch.Size([2, 2, 64])
    """

    def forward(self, input: Any) -> torch.Tensor:
        """Rows of ``input``'s keys, shape ``[*input.shape, *row]``."""
        return self.lookup(input)


class BankEmbeddingBag(BankLayer):
    """:class:`torch.nn.EmbeddingBag` over a bank table: bags of keys pooled by sum, mean or max.

    Parameters
    ----------
    bank, table, column
        As for :class:`BankLayer`.
    mode
        ``"sum"``, ``"mean"`` (default, as in torch) or ``"max"``.
    include_last_offset
        As in torch: ``offsets`` has one more entry, the end of the last bag.
    **kwargs
        ``padding_key``, ``learning_rate``, ``trainable``, ``pipeline``, ``staleness``, ``timeout``
        (see :class:`BankLayer`). Padding keys are left out of their bag (a ``mean`` does not count them;
        a bag of padding only is zeros), as torch's ``padding_idx``.
    """

    def __init__(self, bank: KnowledgeBank, table: str, column: str = "embedding", mode: str = "mean", *,
                 include_last_offset: bool = False, **kwargs: Any) -> None:
        super().__init__(bank, table, column, **kwargs)
        if mode not in BAG_MODES:
            raise ConfigError(f"{self._owner}: mode={mode!r}; expected one of {BAG_MODES}")
        if len(self.source.row_shape) != 1:
            raise InvalidShapeError(f"{self._owner}: column {self.column!r} has rows of shape {self.source.row_shape}; "
                                    "expected 1-D rows to pool")
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)

    def _bag_keys(self, input: Any) -> LayerKeys:
        k = as_keys(input, self._owner)
        if len(k.shape) not in (1, 2):
            raise InvalidShapeError(f"{self._owner}: input has shape {k.shape}; expected 1-D keys with offsets, "
                                    "or 2-D [bags, keys per bag]")
        return k

    def _offsets(self, k: LayerKeys, offsets: Any) -> torch.Tensor:
        """Checked ``int64`` offsets of the bags (start of each bag, as torch takes them)."""
        n = k.size
        if len(k.shape) == 2:
            if offsets is not None:
                raise InvalidShapeError(f"{self._owner}: offsets given with a 2-D input of shape {k.shape}; "
                                        "expected offsets=None (each row is a bag)")
            bags, width = k.shape
            off = np.arange(bags + int(self.include_last_offset), dtype=np.int64) * width
            return torch.from_numpy(off)
        if offsets is None:
            raise InvalidShapeError(f"{self._owner}: 1-D input of {n} keys without offsets; expected offsets "
                                    "(the start of each bag) or a 2-D input")
        o = offsets.detach().to("cpu").numpy() if isinstance(offsets, torch.Tensor) else np.asarray(offsets)
        if o.ndim != 1 or (o.size and o.dtype.kind not in "iu"):
            raise InvalidShapeError(f"{self._owner}: offsets of shape {o.shape} and dtype {o.dtype}; expected a 1-D "
                                    "integer tensor")
        o = o.astype(np.int64)
        if o.size == 0 or int(o[0]) != 0:
            raise InvalidBatchError(f"{self._owner}: offsets {o[:8].tolist()}...; expected offsets[0] == 0 "
                                    "(the first bag starts at the first key)")
        if np.any(np.diff(o) < 0) or int(o[-1]) > n:
            raise InvalidBatchError(f"{self._owner}: offsets {o[:8].tolist()}... for {n} keys; expected "
                                    f"non-decreasing offsets within [0, {n}]")
        if self.include_last_offset and int(o[-1]) != n:
            raise InvalidBatchError(f"{self._owner}: include_last_offset=True but offsets end at {int(o[-1])}; "
                                    f"expected the last offset to be the number of keys, {n}")
        return torch.from_numpy(o)

    def forward(self, input: Any, offsets: Any = None, per_sample_weights: Any = None) -> torch.Tensor:
        """Pooled rows of each bag: ``[bags, D]``.

        Parameters
        ----------
        input
            1-D keys with ``offsets``, or 2-D ``[bags, keys per bag]`` (then ``offsets`` must be None).
        offsets
            Start of each bag in ``input`` (``int64``); with ``include_last_offset`` also the end of the last.
        per_sample_weights
            A float weight per key (same shape as ``input``), only with ``mode="sum"``.
        """
        return self.pool(self.begin_bags(input, offsets, per_sample_weights))

    def begin_bags(self, input: Any, offsets: Any = None, per_sample_weights: Any = None) -> _Bags:
        """Check the bags and ask for their rows (held in the bank's queue); :meth:`pool` sends, waits and pools."""
        k = self._bag_keys(input)
        off = self._offsets(k, offsets)
        anchor = self._anchor
        psw = None
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise ConfigError(f"{self._owner}: per_sample_weights are only supported with mode='sum' "
                                  f"(as in torch.nn.EmbeddingBag); the mode is {self.mode!r}")
            psw = torch.as_tensor(per_sample_weights)
            if tuple(psw.shape) != k.shape:
                raise InvalidShapeError(f"{self._owner}: per_sample_weights of shape {tuple(psw.shape)}; expected "
                                        f"the input's shape {k.shape}")
            psw = psw.reshape(-1).to(device=anchor.device, dtype=anchor.dtype)
        flat = k.flat
        pad = None if self._pad is None else flat == self._pad
        use_pos = np.arange(flat.shape[0]) if pad is None else np.flatnonzero(~pad)
        read = self.begin_rows(flat[use_pos], self.inserting()) if use_pos.size else None
        return _Bags(flat, off, psw, use_pos, read)

    def pool(self, b: _Bags) -> torch.Tensor:
        """The pooled ``[bags, D]`` rows of bags :meth:`begin_bags` asked for."""
        anchor = self._anchor
        width = self.embedding_dim
        # rows of the distinct non-padding keys, then one zero row that every padding entry points at
        if b.read is not None:
            rows, inverse = self.finish_unique(b.read)
        else:
            rows, inverse = torch.zeros((0, width), dtype=anchor.dtype, device=anchor.device), np.empty(0, np.int64)
        m = int(rows.shape[0])
        idx = np.full(b.flat.shape[0], m, dtype=np.int64)
        idx[b.use_pos] = inverse
        weight = torch.cat([rows.reshape(m, width), rows.new_zeros((1, width))], 0)
        return nn.functional.embedding_bag(
            torch.from_numpy(idx).to(anchor.device), weight, b.offsets.to(anchor.device), mode=self.mode,
            per_sample_weights=b.weights, include_last_offset=self.include_last_offset, padding_idx=m)

    def extra_repr(self) -> str:
        extra = f", mode={self.mode!r}"
        if self.include_last_offset:
            extra += ", include_last_offset=True"
        return super().extra_repr() + extra


class _Bags:
    """Bags asked for and not pooled yet: keys, offsets, weights, where the non-padding keys are, their read."""

    __slots__ = ("flat", "offsets", "read", "use_pos", "weights")

    def __init__(self, flat: np.ndarray, offsets: torch.Tensor, weights: torch.Tensor | None, use_pos: np.ndarray,
                 read: _Pending | None) -> None:
        self.flat = flat
        self.offsets = offsets
        self.weights = weights
        self.use_pos = use_pos
        self.read = read


def _identity(inverse: np.ndarray) -> bool:
    """Whether every key's row is its own (no key repeats and they come in order)."""
    return bool(inverse.shape[0] == 0 or (inverse[0] == 0 and np.all(np.diff(inverse) == 1)))


def _torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a NumPy float dtype."""
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
