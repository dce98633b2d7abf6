"""Difficulty scores of training examples from a model's logits (pure numpy; higher is harder).

A scorer takes ``logits[n, c]`` and the labels to judge against ``int64[n]`` and returns
``float32[n]``. The built-in ones are registered in :data:`SCORERS`; add your own with
:func:`register_scorer`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from carls_dask.errors import ConfigError, InvalidShapeError

__all__ = ["SCORERS", "Scorer", "confidence_score", "get_scorer", "loss_score", "margin_score", "register_scorer",
           "softmax"]

Scorer = Callable[[np.ndarray, np.ndarray], np.ndarray]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, computed stably in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out


def _check(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(logits)
    y = np.asarray(labels)
    if z.ndim != 2 or y.ndim != 1 or z.shape[0] != y.shape[0]:
        raise InvalidShapeError(f"difficulty scorer: logits {list(z.shape)} and labels {list(y.shape)}; "
                                "expected [n, classes] and [n]")
    if y.size and (y.min() < 0 or y.max() >= z.shape[1]):
        raise InvalidShapeError(f"difficulty scorer: labels span [{y.min()}, {y.max()}] but logits have "
                                f"{z.shape[1]} classes")
    return z, y.astype(np.int64)


def loss_score(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Cross-entropy of the label: ``-log p(label)`` (0 for a certain, correct prediction)."""
    z, y = _check(logits, labels)
    p = softmax(z)[np.arange(y.size), y]
    return (-np.log(np.maximum(p, 1e-12))).astype(np.float32)


def margin_score(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``(1 - (p(label) - max_other p)) / 2`` in [0, 1]: 0 when the label wins with certainty."""
    z, y = _check(logits, labels)
    p = softmax(z)
    rows = np.arange(y.size)
    own = p[rows, y]
    other = p.copy()
    other[rows, y] = -1.0
    return ((1.0 - (own - other.max(axis=1))) / 2.0).astype(np.float32)


def confidence_score(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``1 - p(label)`` in [0, 1]."""
    z, y = _check(logits, labels)
    return (1.0 - softmax(z)[np.arange(y.size), y]).astype(np.float32)


SCORERS: dict[str, Scorer] = {"loss": loss_score, "margin": margin_score, "confidence": confidence_score}


def register_scorer(name: str, scorer: Scorer, *, replace: bool = False) -> None:
    """Add a scorer under ``name``.

    Raises
    ------
    ConfigError
        If the name is taken (unless ``replace``) or ``scorer`` is not callable.
    """
    if not callable(scorer):
        raise ConfigError(f"register_scorer({name!r}): expected a callable, got {type(scorer).__name__}")
    if name in SCORERS and not replace:
        raise ConfigError(f"register_scorer: {name!r} is already registered; pass replace=True to override")
    SCORERS[name] = scorer


def get_scorer(name: str) -> Scorer:
    """The scorer registered as ``name``.

    Raises
    ------
    ConfigError
        If none is; the message lists the known names.
    """
    try:
        return SCORERS[name]
    except KeyError:
        raise ConfigError(f"unknown difficulty scorer {name!r}; expected one of {sorted(SCORERS)}") from None
