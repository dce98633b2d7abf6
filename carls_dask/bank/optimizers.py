"""Shard-side optimizers for ``apply_gradients``: SGD, Adagrad and Adam on gathered rows.

Each optimizer is a pure function of (weights, summed gradients, slots, step) that returns new
weights and new slots; the shard gathers the rows of a batch, calls it once and scatters back.
Numbers follow CARLS (SGD: ``w -= lr * g``; Adagrad: ``acc += g**2`` first, then
``w -= lr * g / sqrt(acc)``, the accumulator starting at ``initial_accumulator``) and Adam as in
Kingma & Ba with bias correction by the shard's step count of the column.
"""

from __future__ import annotations

import numpy as np

__all__ = ["apply_optimizer", "initial_slots"]


def initial_slots(optimizer: str | None, shape: tuple[int, ...], initial_accumulator: float) -> dict[str, np.ndarray]:
    """Slot arrays of freshly allocated rows (``shape`` is ``[n, *column_shape]``)."""
    if optimizer == "adagrad":
        return {"accumulator": np.full(shape, initial_accumulator, dtype=np.float32)}
    if optimizer == "adam":
        return {"m": np.zeros(shape, dtype=np.float32), "v": np.zeros(shape, dtype=np.float32)}
    return {}


def apply_optimizer(
    optimizer: str,
    weights: np.ndarray,
    grads: np.ndarray,
    slots: dict[str, np.ndarray],
    *,
    learning_rate: float,
    step: int,
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
        The optimizer's slot rows (see :func:`initial_slots`).
    learning_rate
        Step size.
    step
        1-based count of steps this column has taken (Adam's bias correction).

    Returns
    -------
    tuple
        New weights (the weights' dtype) and new slots.
    """
    w = weights.astype(np.float32, copy=False)
    g = grads.astype(np.float32, copy=False)
    lr = np.float32(learning_rate)
    if optimizer == "sgd":
        return (w - lr * g).astype(weights.dtype, copy=False), {}
    if optimizer == "adagrad":
        acc = slots["accumulator"] + g * g
        step_ = np.sqrt(acc)
        np.divide(g, step_, out=step_)
        step_ *= lr
        return (w - step_).astype(weights.dtype, copy=False), {"accumulator": acc}
    if optimizer == "adam":
        b1, b2 = np.float32(betas[0]), np.float32(betas[1])
        m = b1 * slots["m"] + (np.float32(1) - b1) * g
        v = b2 * slots["v"] + (np.float32(1) - b2) * g * g
        t = max(int(step), 1)
        lr_t = np.float32(learning_rate * np.sqrt(1.0 - betas[1] ** t) / (1.0 - betas[0] ** t))
        new_w = w - lr_t * m / (np.sqrt(v) + np.float32(epsilon))
        return new_w.astype(weights.dtype, copy=False), {"m": m, "v": v}
    raise ValueError(f"unknown optimizer {optimizer!r}; expected sgd, adagrad or adam")
