"""Synthetic label noise, injected reproducibly into a training set."""

from __future__ import annotations

import dataclasses

import numpy as np

from carls_dask.errors import ConfigError

__all__ = ["NoisyLabels", "symmetric_noise"]


@dataclasses.dataclass(frozen=True)
class NoisyLabels:
    """Training labels after noise injection.

    Attributes
    ----------
    labels
        ``int64[n]`` the labels a trainer is given.
    clean
        ``int64[n]`` the true labels.
    flipped
        ``bool[n]`` where ``labels != clean``.
    rate
        The requested noise rate.
    """

    labels: np.ndarray
    clean: np.ndarray
    flipped: np.ndarray
    rate: float

    @property
    def realised_rate(self) -> float:
        """Fraction of labels actually changed."""
        return float(self.flipped.mean()) if self.flipped.size else 0.0


def symmetric_noise(labels: np.ndarray, rate: float, n_classes: int, seed: int = 0) -> NoisyLabels:
    """Flip exactly ``round(rate * n)`` labels, chosen at random, each to a uniformly drawn *other* class.

    The same ``labels``, ``rate``, ``n_classes`` and ``seed`` always give the same noisy labels.

    Raises
    ------
    ConfigError
        If ``rate`` is outside [0, 1), ``n_classes`` < 2, or a label is outside ``[0, n_classes)``.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise ConfigError(f"symmetric_noise: labels must be a 1-d integer array, got {y.dtype}{list(y.shape)}")
    if isinstance(n_classes, bool) or not isinstance(n_classes, int | np.integer) or n_classes < 2:
        raise ConfigError(f"symmetric_noise: n_classes={n_classes!r}; expected an int >= 2")
    if not (isinstance(rate, float | int) and 0.0 <= float(rate) < 1.0):
        raise ConfigError(f"symmetric_noise: rate={rate!r}; expected a fraction in [0, 1)")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ConfigError(f"symmetric_noise: labels span [{y.min()}, {y.max()}]; expected [0, {n_classes})")
    y = y.astype(np.int64)
    rng = np.random.default_rng(seed)
    n_flip = round(float(rate) * y.size)
    which = rng.permutation(y.size)[:n_flip]
    noisy = y.copy()
    # an offset in [1, n_classes) moves every chosen label to a different class, uniformly
    noisy[which] = (y[which] + rng.integers(1, n_classes, size=n_flip)) % n_classes
    return NoisyLabels(noisy, y.copy(), noisy != y, float(rate))
