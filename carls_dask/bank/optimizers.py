"""Shard-side optimizers for ``apply_gradients``: SGD, Adagrad and Adam on gathered rows.

Each optimizer is a pure function of (weights, summed gradients, slots) that returns new weights and
new slots; the shard gathers the rows of a batch, calls it once and scatters back. Numbers follow
CARLS (SGD: ``w -= lr * g``; Adagrad: ``acc += g**2`` first, then ``w -= lr * g / sqrt(acc)``, the
accumulator starting at ``initial_accumulator``) and Adam as in Kingma & Ba.

Everything a row's next update depends on is a slot of that row, so a row restored from a snapshot or
the delta log (on any shard count) continues exactly as the live one would:

* Adagrad keeps ``accumulator`` (the column's shape);
* Adam keeps ``m`` and ``v`` (the column's shape) and ``step`` (``int64``, one per row): how many
  updates the row has received. Adam's bias correction uses the row's own count, which is also the
  right correction for a sparse row that is updated less often than the table as a whole.

Arithmetic runs in the column's dtype (see :func:`compute_dtype`), and float slots have that dtype, so a
float64 column is updated in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from carls_dask.errors import ConfigError, InvalidDTypeError

__all__ = ["STEP_SLOT", "apply_optimizer", "compute_dtype", "initial_slots", "slot_names"]

#: Name of Adam's per-row update counter (``int64``, one value per row).
STEP_SLOT = "step"


def compute_dtype(dtype: Any) -> np.dtype[Any]:
    """Dtype of an optimizer's arithmetic, gradients and float slots for a column of ``dtype``.

    float32 and float64 columns compute in their own dtype; float16 columns compute (and keep their
    slots) in float32, since half precision cannot hold Adam's second moment or epsilon.
    """
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise InvalidDTypeError(f"optimizers need a float column, got {dt}")
    return np.promote_types(dt, np.float32)


def slot_names(optimizer: str | None) -> tuple[str, ...]:
    """Names of the slots each float column keeps under ``optimizer``."""
    return {"adagrad": ("accumulator",), "adam": ("m", "v", STEP_SLOT)}.get(str(optimizer), ())


def initial_slots(
    optimizer: str | None,
    n: int,
    shape: tuple[int, ...],
    dtype: Any,
    initial_accumulator: float,
) -> dict[str, np.ndarray]:
    """Slot arrays of ``n`` freshly allocated rows of a column of row ``shape`` and ``dtype``.

    Float slots are ``[n, *shape]`` of :func:`compute_dtype`; Adam's ``step`` is ``int64[n]`` zeros.
    """
    full = (int(n), *shape)
    if optimizer == "adagrad":
        return {"accumulator": np.full(full, initial_accumulator, dtype=compute_dtype(dtype))}
    if optimizer == "adam":
        dt = compute_dtype(dtype)
        return {"m": np.zeros(full, dtype=dt), "v": np.zeros(full, dtype=dt),
                STEP_SLOT: np.zeros(int(n), dtype=np.int64)}
    return {}


def apply_optimizer(
    optimizer: str,
    weights: np.ndarray,
    grads: np.ndarray,
    slots: dict[str, np.ndarray],
    *,
    learning_rate: float,
    betas: tuple[float, float] = (0.9, 0.999),
    epsilon: float = 1e-8,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One optimizer step on a block of rows.

    Parameters
    ----------
    optimizer
        ``"sgd"``, ``"adagrad"`` or ``"adam"``.
    weights
        Current rows, ``float[m, ...]``.
    grads
        Gradients summed per unique key, same shape as ``weights``.
    slots
        The optimizer's slot rows (see :func:`initial_slots`); Adam's ``step`` holds the updates each
        row has received so far.
    learning_rate
        Step size.

    Returns
    -------
    tuple
        New weights (the weights' dtype) and new slots (Adam's ``step`` one higher).

    Notes
    -----
    All-zero gradients are an update like any other (Adam's moments decay and its ``step`` counts
    them). Under Adagrad an entry whose accumulator is still zero has only ever seen zero gradients
    (possible with ``initial_accumulator=0``); its step ``g / sqrt(acc)`` is taken as 0 there, so the
    weight stays as it is instead of becoming NaN.
    """
    dt = compute_dtype(weights.dtype)
    w = weights.astype(dt, copy=False)
    g = grads.astype(dt, copy=False)
    lr = dt.type(learning_rate)
    if optimizer == "sgd":
        return (w - lr * g).astype(weights.dtype, copy=False), {}
    if optimizer == "adagrad":
        acc = slots["accumulator"].astype(dt, copy=False) + g * g
        step_ = np.sqrt(acc)
        # a zero accumulator means only zero gradients so far: dividing by the smallest normal number
        # instead gives 0 there and changes no other entry (a non-zero root is at least sqrt of the
        # smallest subnormal, far above it)
        np.maximum(step_, np.finfo(dt).tiny, out=step_)
        np.divide(g, step_, out=step_)
        step_ *= lr
        return (w - step_).astype(weights.dtype, copy=False), {"accumulator": acc}
    if optimizer == "adam":
        b1, b2 = dt.type(betas[0]), dt.type(betas[1])
        one = dt.type(1)
        m = b1 * slots["m"].astype(dt, copy=False) + (one - b1) * g
        v = b2 * slots["v"].astype(dt, copy=False) + (one - b2) * g * g
        t = slots[STEP_SLOT].astype(np.int64) + 1
        # bias correction per row, from the row's own step count (worked out in float64, then rounded)
        tf = t.astype(np.float64)
        corr = np.sqrt(1.0 - np.power(float(betas[1]), tf)) / (1.0 - np.power(float(betas[0]), tf))
        lr_t = (float(learning_rate) * corr).astype(dt).reshape((-1,) + (1,) * (w.ndim - 1))
        new_w = w - lr_t * m / (np.sqrt(v) + dt.type(epsilon))
        return new_w.astype(weights.dtype, copy=False), {"m": m, "v": v, STEP_SLOT: t}
    raise ConfigError(f"unknown optimizer {optimizer!r}; expected sgd, adagrad or adam")
