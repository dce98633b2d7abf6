"""Sampled softmax over a bank table: TensorFlow's ``sampled_softmax_loss`` with the bank's candidates.

The class weights (and optionally biases) are bank columns read through a :class:`~carls_dask.nn.BankLayer`,
so the classes can be far more than fit in the trainer and new classes are allocated on first sight. Each
call follows ``tf.nn.sampled_softmax_loss``:

1. the true classes' rows are looked up (with insert in training, so they exist and are counted);
2. one candidate set of ``num_sampled`` classes, shared by the whole batch, is drawn by the bank
   (``bank.sample_negatives``: ``log_uniform`` over frequency rank or ``uniform``), with the expected
   count of every candidate and of every true class;
3. logits are ``inputs . w + b``; ``log(expected count)`` is subtracted from true and sampled logits
   (``subtract_log_q``); a sampled class equal to one of the row's true classes gets ``-FLOAT_MAX`` added
   (``remove_accidental_hits``);
4. the loss is the softmax cross-entropy against labels ``1 / num_true`` on the true classes.

The gradient of the true and candidate rows goes to the table's optimizer in one push (duplicates
summed). PyTorch has no sampled softmax of its own (pytorch/pytorch#38185). For evaluation over every
class, :func:`top_k_classes` asks the bank for each input's best classes (``bank.top_k``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from carls_dask.bank.hashing import mix_seed
from carls_dask.bank.sampling import SAMPLERS, NegativeSample
from carls_dask.errors import ConfigError, InvalidBatchError, InvalidShapeError
from carls_dask.nn.embedding import BankLayer
from carls_dask.nn.keys import LayerKeys, as_keys

__all__ = ["SampledSoftmaxLoss", "sampled_softmax_logits", "sampled_softmax_loss", "top_k_classes"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_layer(layer: Any, what: str, width: int | None = None) -> BankLayer:
    if not isinstance(layer, BankLayer):
        raise ConfigError(f"sampled_softmax_loss: {what} must be a BankEmbedding over the class table, got "
                          f"{type(layer).__name__}")
    if width is not None and layer.embedding_dim != width:
        raise InvalidShapeError(f"sampled_softmax_loss: {what} rows have {layer.embedding_dim} elements; expected "
                                f"{width}")
    return layer


def sampled_softmax_logits(
    weights: BankLayer,
    inputs: torch.Tensor,
    labels: Any,
    num_sampled: int,
    *,
    biases: BankLayer | None = None,
    num_true: int | None = None,
    sampler: str = "log_uniform",
    unique: bool = True,
    remove_accidental_hits: bool = True,
    subtract_log_q: bool = True,
    seed: int | None = None,
    sampled_values: NegativeSample | None = None,
) -> tuple[torch.Tensor, torch.Tensor, NegativeSample]:
    """The logits and soft labels of sampled softmax (TensorFlow's ``_compute_sampled_logits``).

    Parameters are those of :func:`sampled_softmax_loss`.

    Returns
    -------
    logits
        ``[B, num_true + S]``: the true classes' logits, then the candidates'.
    targets
        ``[B, num_true + S]``: ``1 / num_true`` on the true classes, 0 elsewhere.
    sample
        The candidates and their expected counts.
    """
    _check_layer(weights, "weights")
    if not isinstance(inputs, torch.Tensor) or inputs.ndim != 2 or inputs.shape[1] != weights.embedding_dim:
        shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise InvalidShapeError(f"sampled_softmax_loss: inputs {shape}; expected a [batch, {weights.embedding_dim}] "
                                f"tensor (the width of table {weights.table!r})")
    if biases is not None:
        _check_layer(biases, "biases", 1)
    if sampler not in SAMPLERS:
        raise ConfigError(f"sampled_softmax_loss: sampler={sampler!r}; expected one of {SAMPLERS}")
    b = int(inputs.shape[0])
    k = as_keys(labels, f"sampled_softmax_loss(table {weights.table!r}) labels")
    if len(k.shape) == 1:
        k = LayerKeys(k.flat, (k.size, 1))
    if len(k.shape) != 2 or k.shape[0] != b or (num_true is not None and k.shape[1] != num_true):
        want = f"[{b}]" + (f" or [{b}, {num_true}]" if num_true is not None else f" or [{b}, num_true]")
        raise InvalidShapeError(f"sampled_softmax_loss: labels of shape {k.shape}; expected {want}")
    t = int(k.shape[1])
    if sampled_values is None:
        if isinstance(num_sampled, bool) or not isinstance(num_sampled, int | np.integer) or num_sampled < 1:
            raise ConfigError(f"sampled_softmax_loss: num_sampled={num_sampled!r}; expected a positive int")
    true_keys = k.flat
    insert = weights.inserting()
    true_rows = weights.read(true_keys, insert)  # in training, allocates unseen classes before the sampling
    if sampled_values is None:
        sample = weights.bank.sample_negatives(weights.table, int(num_sampled), sampler=sampler, unique=unique,
                                               true_keys=true_keys, seed=seed)
    else:
        sample = sampled_values
        if sample.true_expected_count.shape[0] != true_keys.shape[0]:
            raise InvalidShapeError(f"sampled_softmax_loss: sampled_values hold {sample.true_expected_count.shape[0]} "
                                    f"true expected counts; expected {true_keys.shape[0]} (one per label)")
    cand = np.asarray(sample.keys, dtype=np.int64)
    cand_rows = weights.read(cand, False)  # candidates are in the table already: not counted again
    both = weights.track(np.concatenate([true_keys, cand]), torch.cat([true_rows, cand_rows], 0))
    w_true, w_cand = both[: true_keys.shape[0]], both[true_keys.shape[0]:]
    x = inputs.to(both.dtype)
    true_logits = (x[:, None, :] * w_true.reshape(b, t, -1)).sum(-1)
    sampled_logits = x @ w_cand.reshape(cand.shape[0], -1).T
    if biases is not None:
        # a bias column of the weights' table: the labels were inserted (and counted) by the weights' read
        b_insert = insert and biases.table != weights.table
        b_true = biases.read(true_keys, b_insert)
        b_cand = biases.read(cand, False)
        b_both = biases.track(np.concatenate([true_keys, cand]), torch.cat([b_true, b_cand], 0)).reshape(-1)
        true_logits = true_logits + b_both[: true_keys.shape[0]].reshape(b, t).to(x.dtype)
        sampled_logits = sampled_logits + b_both[true_keys.shape[0]:].to(x.dtype)[None, :]
    if subtract_log_q:
        tiny = np.finfo(np.float64).tiny  # a true class the table lacks (read-only) has expected count 0
        true_logits = true_logits - torch.from_numpy(
            np.log(np.maximum(sample.true_expected_count, tiny)).reshape(b, t)).to(x)
        sampled_logits = sampled_logits - torch.from_numpy(np.log(np.maximum(sample.expected_count, tiny))).to(x)
    if remove_accidental_hits:
        hits = (cand[None, None, :] == true_keys.reshape(b, t)[:, :, None]).any(1)
        if hits.any():
            penalty = torch.from_numpy(hits).to(x.device, x.dtype) * -torch.finfo(x.dtype).max
            sampled_logits = sampled_logits + penalty
    logits = torch.cat([true_logits, sampled_logits], 1)
    targets = torch.cat([torch.full((b, t), 1.0 / t, dtype=x.dtype, device=x.device),
                         torch.zeros((b, cand.shape[0]), dtype=x.dtype, device=x.device)], 1)
    return logits, targets, sample


def sampled_softmax_loss(
    weights: BankLayer,
    inputs: torch.Tensor,
    labels: Any,
    num_sampled: int,
    *,
    biases: BankLayer | None = None,
    num_true: int | None = None,
    sampler: str = "log_uniform",
    unique: bool = True,
    remove_accidental_hits: bool = True,
    subtract_log_q: bool = True,
    seed: int | None = None,
    sampled_values: NegativeSample | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Sampled softmax loss of ``inputs`` against their ``labels``, classes held in a bank table.

    Parameters
    ----------
    weights
        A :class:`~carls_dask.nn.BankEmbedding` over the class table (rows as wide as ``inputs``).
    inputs
        ``[B, D]`` float tensor: the model's output for each example.
    labels
        ``[B]`` or ``[B, num_true]`` class keys (ints or strings, as the layer takes them).
    num_sampled
        Candidates drawn per call, shared by the batch.
    biases
        A layer over a one-element float column (of the same table or another) holding class biases.
    num_true
        Labels per example (checked against ``labels``' shape when given).
    sampler, unique
        The bank's candidate sampler (``"log_uniform"`` by frequency rank, or ``"uniform"``) and whether
        the candidates are distinct.
    remove_accidental_hits
        Add ``-FLOAT_MAX`` to the logit of a candidate that is one of the row's true classes.
    subtract_log_q
        Subtract ``log(expected count)`` from the logits (the logQ correction).
    seed
        Seed of the candidate draw (``None``: fresh randomness).
    sampled_values
        Candidates drawn beforehand (a :class:`~carls_dask.bank.NegativeSample` with a
        ``true_expected_count`` for every label), used instead of drawing.
    reduction
        ``"mean"`` (default), ``"sum"`` or ``"none"`` (the per-example losses ``[B]``), as torch's losses.

    Returns
    -------
    torch.Tensor
        The loss.
    """
    if reduction not in _REDUCTIONS:
        raise ConfigError(f"sampled_softmax_loss: reduction={reduction!r}; expected one of {_REDUCTIONS}")
    logits, targets, _ = sampled_softmax_logits(
        weights, inputs, labels, num_sampled, biases=biases, num_true=num_true, sampler=sampler, unique=unique,
        remove_accidental_hits=remove_accidental_hits, subtract_log_q=subtract_log_q, seed=seed,
        sampled_values=sampled_values)
    per_example = -(targets * torch.log_softmax(logits, 1)).sum(1)
    if reduction == "none":
        return per_example
    return per_example.mean() if reduction == "mean" else per_example.sum()


class SampledSoftmaxLoss(nn.Module):
    """:func:`sampled_softmax_loss` as a loss module that holds its class table's layer.

    Parameters
    ----------
    weights
        The class layer (a submodule, so ``model.to(device)`` moves it along).
    num_sampled
        Candidates per call.
    seed
        With a seed, call ``i`` draws its candidates with seed ``mix_seed(seed, i)``, so a run is
        repeatable; ``None`` draws fresh ones.
    **kwargs
        ``biases``, ``num_true``, ``sampler``, ``unique``, ``remove_accidental_hits``, ``subtract_log_q``
        and ``reduction``, as for :func:`sampled_softmax_loss`.
    """

    def __init__(self, weights: BankLayer, num_sampled: int, *, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.weights = _check_layer(weights, "weights")
        biases = kwargs.pop("biases", None)
        self.biases = None if biases is None else _check_layer(biases, "biases", 1)
        unknown = set(kwargs) - {"num_true", "sampler", "unique", "remove_accidental_hits", "subtract_log_q",
                                 "reduction"}
        if unknown:
            raise ConfigError(f"SampledSoftmaxLoss: unknown arguments {sorted(unknown)}")
        if isinstance(num_sampled, bool) or not isinstance(num_sampled, int) or num_sampled < 1:
            raise ConfigError(f"SampledSoftmaxLoss: num_sampled={num_sampled!r}; expected a positive int")
        self.num_sampled = num_sampled
        self.seed = seed
        self.calls = 0
        self.options = kwargs

    def forward(self, inputs: torch.Tensor, labels: Any) -> torch.Tensor:
        """The loss of ``inputs`` against ``labels``."""
        seed = None if self.seed is None else mix_seed(self.seed, self.calls) % (2**63 - 1)
        self.calls += 1
        return sampled_softmax_loss(self.weights, inputs, labels, self.num_sampled, biases=self.biases, seed=seed,
                                    **self.options)

    def extra_repr(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"num_sampled={self.num_sampled}, seed={self.seed}{opts}"


def top_k_classes(weights: BankLayer, inputs: torch.Tensor, k: int, *, metric: str = "dot",
                  method: str = "exact") -> tuple[np.ndarray, np.ndarray]:
    """Each input's ``k`` best classes of the whole table (``bank.top_k``): ``(keys[B, k], scores[B, k])``.

    The full-softmax evaluation of a model trained with sampled softmax: the class with the largest
    logit ``inputs . w`` is the softmax's most likely class. Biases are not part of the bank's search;
    a model with biases ranks with them in its own code.
    """
    _check_layer(weights, "weights")
    if not isinstance(inputs, torch.Tensor) or inputs.ndim != 2:
        raise InvalidShapeError(f"top_k_classes: inputs {getattr(inputs, 'shape', type(inputs).__name__)}; "
                                f"expected a [batch, {weights.embedding_dim}] tensor")
    if inputs.shape[0] == 0:
        raise InvalidBatchError("top_k_classes: no inputs; expected at least one row")
    q = inputs.detach().to("cpu").numpy().astype(weights.source.dtype, copy=False)
    keys, scores = weights.bank.top_k(weights.table, q, int(k), column=weights.column, metric=metric, method=method)
    return np.asarray(keys), np.asarray(scores)
