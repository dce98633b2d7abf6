"""Choosing pseudo labels (by confidence, or class-balanced with neighbour votes) and measuring how good they are."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError, InvalidShapeError

__all__ = [
    "PseudoLabels",
    "correct_probabilities",
    "normalized_adjacency",
    "propagate_labels",
    "pseudo_label_quality",
    "select_balanced_pseudo_labels",
    "select_pseudo_labels",
    "sharpen",
    "soft_pseudo_labels",
]


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
    targets
        ``float32[m, C]`` soft targets (class distributions) of the labelled nodes, or ``None`` for
        hard labels (:func:`soft_pseudo_labels` gives them).
    """

    keys: np.ndarray
    labels: np.ndarray
    confidence: np.ndarray
    n_candidates: int
    targets: np.ndarray | None = None

    def target_rows(self, n_classes: int) -> np.ndarray:
        """``float32[m, n_classes]``: the soft targets, or one-hot rows of the hard labels."""
        if self.targets is not None:
            return np.asarray(self.targets, dtype=np.float32)
        out = np.zeros((len(self.keys), n_classes), dtype=np.float32)
        out[np.arange(len(self.keys)), self.labels] = 1.0
        return out


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


def normalized_adjacency(edges: np.ndarray, n_nodes: int, *, self_loops: bool = False) -> Any:
    """The symmetric normalised adjacency ``D^-1/2 A D^-1/2`` of an undirected graph (scipy CSR).

    Parameters
    ----------
    edges
        ``int64[2, m]`` node pairs, each undirected edge listed once or twice (duplicates count once).
    n_nodes
        Number of nodes; isolated nodes get an empty row (with ``self_loops`` only their own entry).
    self_loops
        Normalise ``A + I`` instead (every node its own neighbour, as GCN-style propagation does);
        self loops among ``edges`` are dropped either way.
    """
    import scipy.sparse as sp

    edges = np.asarray(edges, dtype=np.int64)
    if edges.ndim != 2 or edges.shape[0] != 2:
        raise InvalidShapeError(f"normalized adjacency: edges must be [2, m], got shape {edges.shape}")
    if edges.size and (edges.min() < 0 or edges.max() >= n_nodes):
        raise InvalidShapeError(f"normalized adjacency: edge ends must lie in [0, {n_nodes})")
    src = np.concatenate([edges[0], edges[1]])
    dst = np.concatenate([edges[1], edges[0]])
    keep = src != dst
    a = sp.coo_matrix((np.ones(int(keep.sum()), dtype=np.float32), (src[keep], dst[keep])), shape=(n_nodes, n_nodes)).tocsr()
    a.data[:] = 1.0  # duplicates summed by tocsr count once
    if self_loops:
        a = (a + sp.identity(n_nodes, dtype=np.float32, format="csr")).tocsr()
    deg = np.asarray(a.sum(1)).ravel()
    inv = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-12)), 0.0).astype(np.float32)
    return sp.diags(inv) @ a @ sp.diags(inv)


def _clamped_propagation(x0: np.ndarray, adjacency: Any, known: np.ndarray, alpha: float,
                         iterations: int) -> np.ndarray:
    """``X <- (1 - alpha) * X0 + alpha * A X`` for ``iterations`` rounds, the ``known`` rows kept at ``X0``'s
    (personalised-PageRank propagation with clamped rows)."""
    x = x0
    for _ in range(int(iterations)):
        x = (1.0 - alpha) * x0 + alpha * np.asarray(adjacency @ x, dtype=np.float32)
        x[known] = x0[known]
    return x


def correct_probabilities(probs: np.ndarray, adjacency: Any, known: np.ndarray, known_labels: np.ndarray,
                          alpha: float, iterations: int = 10, scale: float = 0.0) -> np.ndarray:
    """The "correct" step of correct-and-smooth: the model's errors on known nodes spread to their neighbours.

    The residual ``E0`` is ``onehot(known_labels) - probs`` on the ``known`` rows and 0 elsewhere; it is
    propagated as ``E <- (1 - alpha) * E0 + alpha * A E`` for ``iterations`` rounds with the known rows
    clamped to their residual (Huang et al. 2020). The propagated error of the other rows is scaled
    and added to ``probs``: with ``scale`` 0 ("autoscale") each row is rescaled so that its L1 norm
    is the mean L1 norm of the known rows' residuals; with ``scale`` > 0 it is multiplied by
    ``scale``. The sum is clipped at 0 and each row renormalised to sum to 1 (a row that would be
    all zeros keeps ``probs``); the known rows become their one-hot labels.

    Parameters
    ----------
    probs
        ``float[n, C]`` the model's class probabilities of every node.
    adjacency
        ``[n, n]`` normalised adjacency (:func:`normalized_adjacency`).
    known
        ``int64[m]`` nodes whose true label is given (the labelled-train split).
    known_labels
        ``int64[m]`` their labels.
    alpha
        Weight of the neighbours in ``[0, 1)``; 0 returns ``probs`` unchanged.
    iterations
        Propagation rounds, >= 0.
    scale
        0 for autoscale, else the fixed multiplier (> 0) of the propagated error.

    Raises
    ------
    ConfigError
        For ``alpha`` outside ``[0, 1)``, negative ``iterations`` or negative ``scale``.
    """
    if not 0.0 <= float(alpha) < 1.0:
        raise ConfigError(f"correct step: alpha must be in [0, 1), got {alpha!r}")
    if int(iterations) < 0:
        raise ConfigError(f"correct step: iterations must be >= 0, got {iterations!r}")
    if not float(scale) >= 0.0:
        raise ConfigError(f"correct step: scale must be >= 0 (0: autoscale), got {scale!r}")
    if probs.ndim != 2 or adjacency.shape != (probs.shape[0], probs.shape[0]):
        raise InvalidShapeError(
            f"correct step: probs {probs.shape} and adjacency {adjacency.shape} must be [n, C] and [n, n]"
        )
    p = np.asarray(probs, dtype=np.float32)
    if float(alpha) == 0.0:
        return p.copy()
    known = np.asarray(known, dtype=np.int64)
    e0 = np.zeros_like(p)
    e0[known, np.asarray(known_labels, dtype=np.int64)] = 1.0
    e0[known] -= p[known]
    e = _clamped_propagation(e0, adjacency, known, alpha, iterations)
    if float(scale) == 0.0:
        sigma = float(np.abs(e0[known]).sum(1).mean()) if len(known) else 0.0
        norm = np.abs(e).sum(1, keepdims=True)
        e = np.where(norm > 1e-12, e * (sigma / np.maximum(norm, 1e-12)), 0.0)
    else:
        e = e * float(scale)
    out = np.clip(p + e, 0.0, None)
    out[known] = e0[known] + p[known]
    total = out.sum(1, keepdims=True)
    return np.where(total > 1e-12, out / np.maximum(total, 1e-12), p).astype(np.float32)


def propagate_labels(probs: np.ndarray, adjacency: Any, known: np.ndarray, known_labels: np.ndarray,
                     alpha: float, iterations: int = 10) -> np.ndarray:
    """Neighbour votes: the model's class probabilities spread over the graph (label propagation).

    ``F <- (1 - alpha) * F0 + alpha * A F`` for ``iterations`` rounds, where ``F0`` is ``probs`` with
    the rows of ``known`` nodes replaced by their one-hot labels (clamped again after every round),
    as in personalised-PageRank propagation (APPNP, correct-and-smooth). Rows are renormalised to
    sum to 1, so each row is a distribution over classes.

    Parameters
    ----------
    probs
        ``float[n, C]`` the model's class probabilities of every node.
    adjacency
        ``[n, n]`` normalised adjacency (:func:`normalized_adjacency`).
    known
        ``int64[m]`` nodes whose true label is given (the labelled-train split).
    known_labels
        ``int64[m]`` their labels.
    alpha
        Weight of the neighbours in ``[0, 1)``; 0 returns ``probs`` (with the known rows clamped).
    iterations
        Propagation rounds.
    """
    if not 0.0 <= float(alpha) < 1.0:
        raise ConfigError(f"label propagation: alpha must be in [0, 1), got {alpha!r}")
    if probs.ndim != 2 or adjacency.shape != (probs.shape[0], probs.shape[0]):
        raise InvalidShapeError(
            f"label propagation: probs {probs.shape} and adjacency {adjacency.shape} must be [n, C] and [n, n]"
        )
    known = np.asarray(known, dtype=np.int64)
    f0 = np.asarray(probs, dtype=np.float32).copy()
    f0[known] = 0.0
    f0[known, np.asarray(known_labels, dtype=np.int64)] = 1.0
    f = _clamped_propagation(f0, adjacency, known, alpha, iterations)
    total = f.sum(1, keepdims=True)
    return np.where(total > 0, f / np.maximum(total, 1e-12), f0).astype(np.float32)


def select_balanced_pseudo_labels(probs: np.ndarray, votes: np.ndarray, candidates: np.ndarray,
                                  fraction: float, *, agreement: bool = True,
                                  min_confidence: float = 0.0) -> PseudoLabels:
    """Class-balanced pseudo labels: per class, the most confident candidates the model and the votes agree on.

    Each class may take at most ``round(fraction * len(candidates) / n_classes)`` candidates, so a
    class the model over-predicts cannot crowd out the others (FlexMatch / curriculum pseudo
    labelling). A candidate qualifies when the vote's top class is also the model's top class (with
    ``agreement``) and the vote's probability of it is at least ``min_confidence``; the label is the
    vote's top class, its confidence the vote's probability, and candidates are ranked by it.

    Parameters
    ----------
    probs
        ``float[n_nodes, C]`` the model's class probabilities.
    votes
        ``float[n_nodes, C]`` the neighbour votes (:func:`propagate_labels`).
    candidates
        ``int64[m]`` nodes that may receive a label.
    fraction
        Share of the candidates that may be labelled, in ``[0, 1]``.
    agreement
        Require the model's and the vote's top classes to agree.
    min_confidence
        Least vote probability of a label.
    """
    if not 0.0 <= float(fraction) <= 1.0:
        raise ConfigError(f"pseudo labels: fraction must be in [0, 1], got {fraction!r}")
    if probs.ndim != 2 or votes.shape != probs.shape:
        raise InvalidShapeError(f"pseudo labels: probs {probs.shape} and votes {votes.shape} must be equal [n, C] shapes")
    candidates = np.asarray(candidates, dtype=np.int64)
    if candidates.size and (candidates.min() < 0 or candidates.max() >= probs.shape[0]):
        raise InvalidShapeError(f"pseudo labels: candidate ids must lie in [0, {probs.shape[0]})")
    n_classes = probs.shape[1]
    v = votes[candidates]
    label = v.argmax(1) if len(candidates) else np.zeros(0, dtype=np.int64)
    conf = v.max(1) if len(candidates) else np.zeros(0, dtype=np.float32)
    ok = conf >= min_confidence
    if agreement and len(candidates):
        ok &= probs[candidates].argmax(1) == label
    quota = round(float(fraction) * len(candidates) / n_classes)
    chosen: list[np.ndarray] = []
    for c in range(n_classes):
        idx = np.flatnonzero(ok & (label == c))
        chosen.append(idx[np.argsort(-conf[idx], kind="stable")[:quota]])
    pick = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
    return PseudoLabels(
        keys=candidates[pick],
        labels=label[pick].astype(np.int64),
        confidence=conf[pick].astype(np.float32),
        n_candidates=len(candidates),
    )


def sharpen(probs: np.ndarray, temperature: float) -> np.ndarray:
    """Class distributions raised to ``1 / temperature`` and renormalised (below 1: sharper; 1: unchanged).

    Parameters
    ----------
    probs
        ``float[n, C]`` rows of class probabilities.
    temperature
        Sharpening temperature, > 0.
    """
    if not float(temperature) > 0.0:
        raise ConfigError(f"sharpen: temperature must be > 0, got {temperature!r}")
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2:
        raise InvalidShapeError(f"sharpen: probs must be [n, C], got shape {p.shape}")
    if temperature != 1.0:
        # in log space, so rows with tiny probabilities do not underflow to all zeros
        logp = np.log(np.clip(p, 1e-30, None)) / float(temperature)
        p = np.exp(logp - logp.max(1, keepdims=True))
    total = p.sum(1, keepdims=True)
    return (p / np.maximum(total, 1e-30)).astype(np.float32)


def soft_pseudo_labels(votes: np.ndarray, candidates: np.ndarray, temperature: float = 1.0) -> PseudoLabels:
    """Soft targets for every candidate: its (sharpened) neighbour vote, for distillation.

    Every candidate gets its row of ``votes`` (e.g. :func:`propagate_labels` of the model's
    predictions: a personalised-PageRank teacher) sharpened with ``temperature``; the label is the
    target's top class and the confidence its probability.

    Parameters
    ----------
    votes
        ``float[n_nodes, C]`` class distributions of every node.
    candidates
        ``int64[m]`` nodes that get a target.
    temperature
        Sharpening temperature of :func:`sharpen`.
    """
    if votes.ndim != 2:
        raise InvalidShapeError(f"pseudo labels: votes must be [n_nodes, n_classes], got shape {votes.shape}")
    candidates = np.asarray(candidates, dtype=np.int64)
    if candidates.size and (candidates.min() < 0 or candidates.max() >= votes.shape[0]):
        raise InvalidShapeError(f"pseudo labels: candidate ids must lie in [0, {votes.shape[0]})")
    targets = sharpen(votes[candidates], temperature)
    return PseudoLabels(
        keys=candidates,
        labels=targets.argmax(1).astype(np.int64) if len(candidates) else np.zeros(0, dtype=np.int64),
        confidence=targets.max(1).astype(np.float32) if len(candidates) else np.zeros(0, dtype=np.float32),
        n_candidates=len(candidates),
        targets=targets,
    )
