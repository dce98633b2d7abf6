"""The data a curriculum run reads: the images and the noisy training labels its settings name."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from carls_dask.paradigms.curriculum.noise import NoisyLabels, symmetric_noise
from carls_dask.paradigms.curriculum.settings import CurriculumSettings
from carls_dask.paradigms.data.fashion_mnist import ImageData, load_images

__all__ = ["CurriculumData", "load_data"]


@dataclasses.dataclass(frozen=True)
class CurriculumData:
    """The images and the noisy training labels of a run.

    With a ``holdout``, ``images`` and ``labels`` hold the training part only and ``val`` the held-out
    images with their noisy labels (``val.labels``) and true ones (``val.clean``, for reports only).
    """

    images: ImageData
    labels: NoisyLabels
    x_val: np.ndarray | None = None
    val: NoisyLabels | None = None


@functools.lru_cache(maxsize=4)
def _load(dataset: str, n_train: int | None, n_test: int | None, seed: int, data_dir: str | None) -> ImageData:
    return load_images(dataset, n_train=n_train, n_test=n_test, seed=seed, data_dir=data_dir)


def load_data(s: CurriculumSettings) -> CurriculumData:
    """Load the images and inject the training-label noise (same settings, same result).

    ``seed`` picks the image subset and, through a derived seed, which labels are flipped, so
    runs with different seeds differ in both: each seed is a full repetition.
    """
    images = _load(s.dataset, s.n_train, s.n_test, s.seed, s.data_dir)
    noisy = symmetric_noise(images.y_train, s.noise, images.n_classes, seed=10_007 + s.seed)
    if s.holdout == 0.0:
        return CurriculumData(images, noisy)
    n = noisy.labels.shape[0]
    order = np.random.default_rng(20_011 + s.seed).permutation(n)
    n_val = max(1, round(s.holdout * n))
    val, train = np.sort(order[:n_val]), np.sort(order[n_val:])

    def part(idx: np.ndarray) -> NoisyLabels:
        return NoisyLabels(noisy.labels[idx], noisy.clean[idx], noisy.flipped[idx], noisy.rate)

    return CurriculumData(dataclasses.replace(images, x_train=images.x_train[train], y_train=images.y_train[train]),
                          part(train), images.x_train[val], part(val))
