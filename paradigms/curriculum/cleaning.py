"""Label cleaning: find training examples whose given label the makers consistently reject (pure numpy).

Each maker round compares the model's prediction with the given label. A round *disagrees* with an
example when the prediction differs from its given label with confidence >= ``confidence``; the
count of consecutive disagreeing rounds is kept in the bank (column ``disagree_rounds``), so it
survives restarts and is versioned like every other score. An example is *flagged* once that count
reaches ``rounds``. A trainer then either relabels flagged examples with the maker's prediction
(``"relabel"``) or down-weights their loss (``"downweight"``); ``"none"`` ignores the flags.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from carls_dask.errors import ConfigError, InvalidShapeError

__all__ = ["CLEAN_MODES", "CleaningRule", "clean_targets", "detection_quality"]

CLEAN_MODES = ("none", "relabel", "downweight")


@dataclasses.dataclass(frozen=True)
class CleaningRule:
    """When the makers' disagreement with a given label counts as consistent.

    Parameters
    ----------
    confidence
        Least confidence (top softmax probability) of a disagreeing prediction.
    rounds
        Consecutive disagreeing maker rounds that flag an example.
    """

    confidence: float = 0.8
    rounds: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.confidence) <= 1.0:
            raise ConfigError(f"CleaningRule: confidence={self.confidence!r}; expected a probability in [0, 1]")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ConfigError(f"CleaningRule: rounds={self.rounds!r}; expected an int >= 1")

    def disagree_rounds(self, given: np.ndarray, predicted: np.ndarray, confidence: np.ndarray,
                        previous: np.ndarray) -> np.ndarray:
        """The new count of consecutive disagreeing rounds: ``previous + 1`` where this round disagrees, else 0."""
        g, p, c, prev = (np.asarray(a) for a in (given, predicted, confidence, previous))
        if not (g.shape == p.shape == c.shape == prev.shape and g.ndim == 1):
            raise InvalidShapeError(f"CleaningRule.disagree_rounds: shapes given {g.shape}, predicted {p.shape}, "
                                    f"confidence {c.shape}, previous {prev.shape}; expected four equal [n]")
        disagree = (p != g) & (c >= self.confidence)
        return np.where(disagree, prev.astype(np.int64) + 1, 0).astype(np.int64)

    def flagged(self, disagree_rounds: np.ndarray) -> np.ndarray:
        """``bool[n]``: examples whose count reached ``rounds``."""
        return np.asarray(disagree_rounds) >= self.rounds


def clean_targets(given: np.ndarray, predicted: np.ndarray, flagged: np.ndarray, mode: str,
                  flagged_weight: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The labels and per-example loss weights a trainer uses.

    Parameters
    ----------
    given, predicted
        ``int64[n]`` given labels and the makers' predictions.
    flagged
        ``bool[n]`` examples whose given label is rejected.
    mode
        ``"none"`` (given labels, weight 1), ``"relabel"`` (predictions where flagged) or
        ``"downweight"`` (given labels, ``flagged_weight`` where flagged).
    flagged_weight
        Loss weight of flagged examples under ``"downweight"``.
    """
    if mode not in CLEAN_MODES:
        raise ConfigError(f"clean_targets: mode={mode!r}; expected one of {list(CLEAN_MODES)}")
    if not 0.0 <= float(flagged_weight) <= 1.0:
        raise ConfigError(f"clean_targets: flagged_weight={flagged_weight!r}; expected a weight in [0, 1]")
    g = np.asarray(given, dtype=np.int64)
    f = np.asarray(flagged, dtype=bool)
    weights = np.ones(g.shape[0], dtype=np.float32)
    if mode == "relabel":
        return np.where(f, np.asarray(predicted, dtype=np.int64), g), weights
    if mode == "downweight":
        weights[f] = float(flagged_weight)
    return g.copy(), weights


def detection_quality(flagged: np.ndarray, noisy: np.ndarray) -> dict[str, float]:
    """Precision, recall and F1 of ``flagged`` against the known noisy examples, and the flagged fraction.

    Precision is NaN when nothing is flagged; recall is NaN when nothing is noisy.
    """
    f = np.asarray(flagged, dtype=bool)
    t = np.asarray(noisy, dtype=bool)
    if f.shape != t.shape:
        raise InvalidShapeError(f"detection_quality: flagged {f.shape} and noisy {t.shape}; expected equal shapes")
    hits = float((f & t).sum())
    precision = hits / f.sum() if f.any() else float("nan")
    recall = hits / t.sum() if t.any() else float("nan")
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else float("nan")
    return {"precision": float(precision), "recall": float(recall), "f1": float(f1),
            "flagged_fraction": float(f.mean()) if f.size else 0.0}
