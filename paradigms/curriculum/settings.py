"""What one curriculum run is: :class:`CurriculumSettings`, the data it builds and its model."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from carls_dask.paradigms.curriculum.cleaning import CLEAN_MODES, CleaningRule
from carls_dask.paradigms.curriculum.noise import NoisyLabels, symmetric_noise
from carls_dask.paradigms.curriculum.pacing import PACING_SCHEDULES, Pacing, make_pacing
from carls_dask.paradigms.curriculum.scoring import SCORERS
from carls_dask.paradigms.data.fashion_mnist import ImageData, load_images
from carls_dask.storage.errors import ConfigError

__all__ = ["TABLE", "CurriculumData", "CurriculumSettings", "load_data", "make_model"]

#: The bank table of per-example knowledge (keys are training-example indices). The dashboards
#: read the table named ``nodes`` by default, so the curriculum uses that name too.
TABLE = "nodes"


@dataclasses.dataclass(frozen=True)
class CurriculumSettings:
    """Every choice of a curriculum run (picklable; trainer and maker build the same data from it).

    Parameters
    ----------
    dataset
        ``"fashion-mnist"`` or ``"digits"``.
    n_train, n_test
        Training and test images (seeded subsets; ``None`` = all).
    noise
        Symmetric label-noise rate injected into the training labels.
    seed
        Seed of the subset, the noise, the model initialisation and the batches.
    model
        ``"mlp"`` (one hidden layer of ``hidden`` units) or ``"cnn"`` (two conv layers).
    hidden
        Hidden units of the model's last hidden layer.
    steps
        Trainer steps.
    batch_size, lr
        Batch size and Adam learning rate.
    pacing
        Pacing schedule (one of :data:`~carls_dask.paradigms.curriculum.pacing.PACING_SCHEDULES`).
    pacing_start, pacing_end
        Start and end of the schedule (fractions; thresholds for ``self-paced``); ``None`` = defaults.
    ramp
        Fraction of ``steps`` (after the warm-up) over which the schedule ramps.
    warmup
        Fraction of ``steps`` trained on all data before pacing starts.
    balanced
        Pace each class separately (the easiest share of every class), so early batches keep all classes.
    scorer
        Difficulty scorer name (see :data:`~carls_dask.paradigms.curriculum.scoring.SCORERS`).
    clean
        ``"none"``, ``"relabel"`` or ``"downweight"``.
    clean_confidence, clean_rounds
        The :class:`~carls_dask.paradigms.curriculum.cleaning.CleaningRule`.
    flagged_weight
        Loss weight of flagged examples under ``"downweight"``.
    publish_every
        Trainer steps between model versions (the makers rescore after each).
    refresh_every
        Trainer steps between reads of the bank's scores.
    eval_every
        Trainer steps between test-accuracy measurements (0: only at the end).
    makers
        Knowledge makers sharing the scoring: maker ``i`` scores the examples whose index
        ``% makers == i``.
    data_dir
        Folder of the Fashion-MNIST files (``None``: the default places).
    threads
        Torch intra-op threads the trainer and maker set in their process (``torch.set_num_threads``,
        which applies to the whole worker process); ``None`` leaves torch's default. The models here
        are small, and one thread is fastest on a shared or busy machine.
    """

    dataset: str = "fashion-mnist"
    n_train: int | None = 10_000
    n_test: int | None = 5_000
    noise: float = 0.3
    seed: int = 0
    model: str = "mlp"
    hidden: int = 256
    steps: int = 2000
    batch_size: int = 128
    lr: float = 1e-3
    pacing: str = "linear"
    pacing_start: float | None = None
    pacing_end: float | None = None
    ramp: float = 0.5
    warmup: float = 0.1
    balanced: bool = True
    scorer: str = "loss"
    clean: str = "downweight"
    clean_confidence: float = 0.6
    clean_rounds: int = 2
    flagged_weight: float = 0.0
    publish_every: int = 100
    refresh_every: int = 25
    eval_every: int = 0
    makers: int = 1
    data_dir: str | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.dataset not in ("fashion-mnist", "digits"):
            raise ConfigError(f"CurriculumSettings: dataset={self.dataset!r}; expected 'fashion-mnist' or 'digits'")
        if self.model not in ("mlp", "cnn"):
            raise ConfigError(f"CurriculumSettings: model={self.model!r}; expected 'mlp' or 'cnn'")
        if self.pacing not in PACING_SCHEDULES:
            raise ConfigError(f"CurriculumSettings: pacing={self.pacing!r}; expected one of {list(PACING_SCHEDULES)}")
        if self.scorer not in SCORERS:
            raise ConfigError(f"CurriculumSettings: scorer={self.scorer!r}; expected one of {sorted(SCORERS)}")
        if self.clean not in CLEAN_MODES:
            raise ConfigError(f"CurriculumSettings: clean={self.clean!r}; expected one of {list(CLEAN_MODES)}")
        for name in ("steps", "batch_size", "publish_every", "refresh_every", "hidden", "makers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"CurriculumSettings: {name}={v!r}; expected a positive int")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ConfigError(f"CurriculumSettings: threads={self.threads!r}; expected a positive int or None")
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 0:
            raise ConfigError(f"CurriculumSettings: eval_every={self.eval_every!r}; expected an int >= 0")
        if not 0.0 <= self.noise < 1.0:
            raise ConfigError(f"CurriculumSettings: noise={self.noise!r}; expected a rate in [0, 1)")
        for name in ("ramp", "warmup"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"CurriculumSettings: {name}={getattr(self, name)!r}; expected a fraction of steps")
        if not self.lr > 0:
            raise ConfigError(f"CurriculumSettings: lr={self.lr!r}; expected a positive learning rate")
        self.make_pacing()
        self.rule()

    @property
    def uses_bank(self) -> bool:
        """Whether the run needs the bank and its makers: paced sampling or label cleaning."""
        return self.pacing != "uniform" or self.clean != "none"

    def make_pacing(self) -> Pacing:
        """The pacing function over this run's steps."""
        warmup = round(self.warmup * self.steps)
        return make_pacing(self.pacing, start=self.pacing_start, end=self.pacing_end,
                           ramp_steps=max(1, round(self.ramp * self.steps)), warmup_steps=warmup)

    def rule(self) -> CleaningRule:
        """The label-cleaning rule."""
        return CleaningRule(self.clean_confidence, self.clean_rounds)


@dataclasses.dataclass(frozen=True)
class CurriculumData:
    """The images and the noisy training labels of a run."""

    images: ImageData
    labels: NoisyLabels


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
    return CurriculumData(images, noisy)


def make_model(s: CurriculumSettings, image_shape: tuple[int, ...], n_classes: int) -> Any:
    """The classifier: an MLP or a small CNN; its last layer maps ``s.hidden`` features to the classes."""
    import torch
    from torch import nn

    torch.manual_seed(s.seed)
    c, h, w = image_shape
    if s.model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, s.hidden), nn.ReLU(), nn.Linear(s.hidden, n_classes))
    return nn.Sequential(
        nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (h // 4) * (w // 4), s.hidden), nn.ReLU(), nn.Linear(s.hidden, n_classes),
    )

