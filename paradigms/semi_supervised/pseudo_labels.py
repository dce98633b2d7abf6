"""Choosing pseudo labels by confidence, and measuring how good they are."""

from __future__ import annotations

import dataclasses

import numpy as np

from storage.errors import ConfigError, InvalidShapeError

__all__ = ["PseudoLabels", "pseudo_label_quality", "select_pseudo_labels"]


@dataclasses.dataclass(frozen=True)
class PseudoLabels:
    """Pseudo labels of the candidates whose confidence passed the threshold.

    Attributes
    ----------
    keys
        ``int64[m]`` node ids that got a label.
    labels
        ``int64[m]`` the predicted class.
    confidence
        ``float32[m]`` the predicted probability of that class.
    n_candidates
        How many nodes were considered (the denominator of coverage).
    """

    keys: np.ndarray
    labels: np.ndarray
    confidence: np.ndarray
    n_candidates: int


def select_pseudo_labels(probs: np.ndarray, candidates: np.ndarray, threshold: float) -> PseudoLabels:
    """Label each candidate whose top class probability is at least ``threshold`` (FixMatch-style).

    Parameters
    ----------
    probs
        ``float[n_nodes, n_classes]`` class probabilities of every node.
    candidates
        ``int64[m]`` nodes that may receive a label (the unlabelled ones).
    threshold
        Confidence cut in ``(0, 1]``.
    """
    if not 0.0 < float(threshold) <= 1.0:
        raise ConfigError(f"pseudo labels: threshold must be in (0, 1], got {threshold!r}")
    if probs.ndim != 2:
        raise InvalidShapeError(f"pseudo labels: probs must be [n_nodes, n_classes], got shape {probs.shape}")
    candidates = np.asarray(candidates, dtype=np.int64)
    if candidates.size and (candidates.min() < 0 or candidates.max() >= probs.shape[0]):
        raise InvalidShapeError(f"pseudo labels: candidate ids must lie in [0, {probs.shape[0]})")
    p = probs[candidates]
    conf = p.max(axis=1) if len(candidates) else np.zeros(0, dtype=np.float32)
    pred = p.argmax(axis=1) if len(candidates) else np.zeros(0, dtype=np.int64)
    keep = conf >= threshold
    return PseudoLabels(
        keys=candidates[keep],
        labels=pred[keep].astype(np.int64),
        confidence=conf[keep].astype(np.float32),
        n_candidates=len(candidates),
    )


def pseudo_label_quality(labels: PseudoLabels, truth: np.ndarray) -> dict[str, float]:
    """Precision (share of given labels that are right) and coverage (share of candidates labelled).

    ``truth`` is held-out ground truth used only for this measurement. Precision is NaN when no
    label was given.
    """
    n = len(labels.keys)
    correct = int((truth[labels.keys] == labels.labels).sum()) if n else 0
    return {
        "precision": correct / n if n else float("nan"),
        "coverage": n / labels.n_candidates if labels.n_candidates else 0.0,
        "count": float(n),
    }
