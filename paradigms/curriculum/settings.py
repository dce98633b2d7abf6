"""What one curriculum run is: :class:`CurriculumSettings`, the data it builds and its model."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError
from carls_dask.paradigms.curriculum.cleaning import CLEAN_MODES, CleaningRule
from carls_dask.paradigms.curriculum.noise import NoisyLabels, symmetric_noise
from carls_dask.paradigms.curriculum.pacing import PACING_SCHEDULES, Pacing, make_pacing
from carls_dask.paradigms.curriculum.scoring import SCORERS
from carls_dask.paradigms.data.fashion_mnist import ImageData, load_images

__all__ = ["LOADING_MODES", "TABLE", "CurriculumData", "CurriculumSettings", "load_data", "make_model"]

#: The bank table of per-example knowledge (keys are training-example indices). The dashboards
#: read the table named ``nodes`` by default, so the curriculum uses that name too.
TABLE = "nodes"


#: The values of ``CurriculumSettings.shared_loading``, and the spellings that stand for them.
LOADING_MODES = ("auto", "on", "off")
_LOADING_WORDS = {True: "on", False: "off", "true": "on", "yes": "on", "false": "off", "no": "off"}


def _loading_mode(value: object) -> str:
    """``value`` of ``shared_loading`` as one of :data:`LOADING_MODES`."""
    if isinstance(value, bool):
        return _LOADING_WORDS[value]
    if isinstance(value, str):
        word = value.strip().lower()
        word = _LOADING_WORDS.get(word, word)
        if word in LOADING_MODES:
            return word
    raise ConfigError(f"CurriculumSettings: shared_loading={value!r}; expected 'auto', 'on' or 'off' "
                      "(or True / False)")


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
    holdout
        Fraction of the training images held out as a validation split (with their noisy labels, as
        a user with noisy data would have them); the trainer reports its accuracy as ``val_accuracy``.
        Hyper-parameters are chosen on it. 0: train on every training image.
    model
        ``"mlp"`` (``layers`` hidden layers of ``hidden`` units) or ``"cnn"`` (two conv layers).
    hidden
        Hidden units of the model's hidden layers.
    layers
        Hidden layers of the MLP.
    dropout
        Dropout rate after each hidden layer.
    steps
        Trainer steps.
    batch_size, lr
        Batch size and Adam learning rate.
    weight_decay
        Adam's L2 weight decay.
    lr_schedule
        ``"constant"`` or ``"cosine"`` (decays the learning rate to 0 over ``steps``).
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
    noise_limit
        Small-loss selection: after the warm-up, admit at most the easiest ``1 - r`` share of each
        class, where ``r`` is the noise rate the makers estimate (the share of examples whose used
        label the newest model rejects). As cleaning relabels, ``r`` falls and more is admitted.
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
    augment
        Augment the training images: each epoch (``batch_size * steps`` examples per pass over the
        training set) every image is shifted by up to 2 pixels and mirrored with probability 1/2, a
        pure function of (seed, epoch, example) (:mod:`~carls_dask.paradigms.curriculum.augment`).
        Makers score the augmented images of the epoch of the model version they score.
    shared_loading
        ``"auto"`` (the default), ``"on"`` or ``"off"`` (``True`` and ``False`` stand for ``"on"`` and
        ``"off"``). With ``"on"``, the loops on one node read the data and each epoch's augmented images
        from one shared loader (:mod:`carls_dask.loading.shared`) instead of each loading and augmenting
        its own; the run's results are the same. ``"auto"`` does so when the run augments and has makers
        (more than one loop transforms the same images) and the node has a writable ``/dev/shm``, and loads separately, with
        a warning, when the node's shared memory cannot hold the loader; ``"on"`` makes either an error.
    """

    dataset: str = "fashion-mnist"
    n_train: int | None = None
    n_test: int | None = None
    noise: float = 0.3
    seed: int = 0
    holdout: float = 0.0
    model: str = "mlp"
    hidden: int = 256
    layers: int = 1
    dropout: float = 0.0
    steps: int = 7035
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    pacing: str = "linear"
    pacing_start: float | None = 0.5
    pacing_end: float | None = None
    ramp: float = 0.5
    warmup: float = 0.1
    balanced: bool = True
    scorer: str = "loss"
    clean: str = "relabel"
    clean_confidence: float = 0.9
    clean_rounds: int = 3
    flagged_weight: float = 0.0
    noise_limit: bool = False
    publish_every: int = 469
    refresh_every: int = 469
    eval_every: int = 0
    makers: int = 1
    data_dir: str | None = None
    threads: int | None = 1
    augment: bool = False
    shared_loading: str = "auto"

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
        for name in ("steps", "batch_size", "publish_every", "refresh_every", "hidden", "makers", "layers"):
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
        if self.lr_schedule not in ("constant", "cosine"):
            raise ConfigError(f"CurriculumSettings: lr_schedule={self.lr_schedule!r}; expected 'constant' or 'cosine'")
        if not 0.0 <= self.holdout < 1.0:
            raise ConfigError(f"CurriculumSettings: holdout={self.holdout!r}; expected a fraction in [0, 1)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"CurriculumSettings: dropout={self.dropout!r}; expected a rate in [0, 1)")
        if not self.weight_decay >= 0.0:
            raise ConfigError(f"CurriculumSettings: weight_decay={self.weight_decay!r}; expected a value >= 0")
        for name in ("ramp", "warmup"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"CurriculumSettings: {name}={getattr(self, name)!r}; expected a fraction of steps")
        if not isinstance(self.augment, bool):
            raise ConfigError(f"CurriculumSettings: augment={self.augment!r}; expected True or False")
        object.__setattr__(self, "shared_loading", _loading_mode(self.shared_loading))
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


def make_model(s: CurriculumSettings, image_shape: tuple[int, ...], n_classes: int) -> Any:
    """The classifier: an MLP or a small CNN; its last layer maps ``s.hidden`` features to the classes."""
    import torch
    from torch import nn

    torch.manual_seed(s.seed)
    c, h, w = image_shape

    def hidden(n_in: int) -> list[nn.Module]:
        out: list[nn.Module] = [nn.Linear(n_in, s.hidden), nn.ReLU()]
        return [*out, nn.Dropout(s.dropout)] if s.dropout > 0 else out

    if s.model == "mlp":
        body: list[nn.Module] = [nn.Flatten()]
        for i in range(s.layers):
            body += hidden(c * h * w if i == 0 else s.hidden)
        return nn.Sequential(*body, nn.Linear(s.hidden, n_classes))
    return nn.Sequential(
        nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), *hidden(32 * (h // 4) * (w // 4)), nn.Linear(s.hidden, n_classes),
    )

