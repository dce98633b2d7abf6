"""What one curriculum run is: :class:`CurriculumSettings`, validated on construction."""

from __future__ import annotations

import dataclasses

from carls_dask.errors import ConfigError
from carls_dask.paradigms.curriculum.cleaning import CLEAN_MODES, CleaningRule
from carls_dask.paradigms.curriculum.pacing import PACING_SCHEDULES, Pacing, make_pacing
from carls_dask.paradigms.curriculum.scoring import SCORERS
from carls_dask.runtime.settings import check_settings

__all__ = ["LOADING_MODES", "CurriculumSettings"]

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
        The images: "fashion-mnist" (Fashion-MNIST, 28x28, 10 classes) or "digits" (scikit-learn's 8x8 digits).
    n_train
        Training images, a seeded subset (none: all).
    n_test
        Test images, a seeded subset (none: all).
    noise
        Symmetric label-noise rate injected into the training labels.
    seed
        Seed of the subset, the noise, the model initialisation and the batches.
    holdout
        Fraction of the training images held out as a validation split (with their noisy labels, as
        a user with noisy data would have them); the trainer reports its accuracy as val_accuracy.
        Hyper-parameters are chosen on it. 0: train on every training image.
    model
        The classifier: "mlp" (layers hidden layers of hidden units) or "cnn" (two conv layers).
    hidden
        Hidden units of the model's hidden layers.
    layers
        Hidden layers of the MLP.
    dropout
        Dropout rate after each hidden layer.
    steps
        Trainer steps.
    batch_size
        Training examples per trainer step.
    lr
        Learning rate of the trainer's Adam optimizer.
    weight_decay
        Adam's L2 weight decay.
    lr_schedule
        "constant" or "cosine" (decays the learning rate to 0 over steps).
    pacing
        Pacing schedule: "uniform" (no curriculum), "linear", "root", "step" or "self-paced".
    pacing_start
        Where the schedule starts: the fraction of the examples admitted (a difficulty threshold for
        "self-paced"); none: the schedule's default.
    pacing_end
        Where the schedule ends, as pacing_start; none: the schedule's default.
    ramp
        Fraction of steps (after the warm-up) over which the schedule ramps.
    warmup
        Fraction of steps trained on all data before pacing starts.
    balanced
        Pace each class separately (the easiest share of every class), so early batches keep all classes.
    scorer
        How the makers score an example's difficulty: "loss", "confidence" or "margin".
    clean
        What happens to examples whose given label the makers reject: "none", "relabel" (use the
        makers' prediction) or "downweight" (weigh them flagged_weight in the loss).
    clean_confidence
        Confidence the makers' prediction needs to count as rejecting an example's given label.
    clean_rounds
        Consecutive maker rounds that must reject a label before the example is flagged.
    flagged_weight
        Loss weight of flagged examples under clean "downweight".
    noise_limit
        Small-loss selection: after the warm-up, admit at most the easiest 1 - r share of each
        class, where r is the noise rate the makers estimate (the share of examples whose used
        label the newest model rejects). As cleaning relabels, r falls and more is admitted.
    publish_every
        Trainer steps between model versions (the makers rescore after each).
    refresh_every
        Trainer steps between reads of the bank's scores.
    eval_every
        Trainer steps between test-accuracy measurements (0: only at the end).
    makers
        Knowledge makers sharing the scoring: maker i scores the examples whose index modulo makers is i.
    data_dir
        Folder of the Fashion-MNIST files (none: the default places).
    threads
        Torch intra-op threads the trainer and maker set in their process (torch.set_num_threads,
        which applies to the whole worker process); none leaves torch's default. The models here
        are small, and one thread is fastest on a shared or busy machine.
    augment
        Augment the training images: each epoch (batch_size * steps examples per pass over the
        training set) every image is shifted by up to 2 pixels and mirrored with probability 1/2, a
        pure function of (seed, epoch, example).
        Makers score the augmented images of the epoch of the model version they score.
    shared_loading
        "auto" (the default), "on" or "off" (true and false stand for "on" and "off"). With "on", the
        loops on one node read the data and each epoch's augmented images from one shared loader
        (carls_dask.loading) instead of each loading and augmenting its own; the run's
        results are the same. "auto" does so when the run augments and has makers (more than one loop
        transforms the same images) and the node has a writable /dev/shm, and loads separately, with
        a warning, when the node's shared memory cannot hold the loader; "on" makes either an error.
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
        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        check_settings("CurriculumSettings", (
            (self.dataset in ("fashion-mnist", "digits"), f"dataset={self.dataset!r}; expected 'fashion-mnist' or 'digits'"),
            (self.model in ("mlp", "cnn"), f"model={self.model!r}; expected 'mlp' or 'cnn'"),
            (self.pacing in PACING_SCHEDULES, f"pacing={self.pacing!r}; expected one of {list(PACING_SCHEDULES)}"),
            (self.scorer in SCORERS, f"scorer={self.scorer!r}; expected one of {sorted(SCORERS)}"),
            (self.clean in CLEAN_MODES, f"clean={self.clean!r}; expected one of {list(CLEAN_MODES)}"),
            *((is_int(v := getattr(self, name)) and v >= 1, f"{name}={v!r}; expected a positive int")
              for name in ("steps", "batch_size", "publish_every", "refresh_every", "hidden", "makers", "layers")),
            (self.threads is None or (is_int(self.threads) and self.threads >= 1),
             f"threads={self.threads!r}; expected a positive int or None"),
            (is_int(self.eval_every) and self.eval_every >= 0, f"eval_every={self.eval_every!r}; expected an int >= 0"),
            (0.0 <= self.noise < 1.0, f"noise={self.noise!r}; expected a rate in [0, 1)"),
            (self.lr_schedule in ("constant", "cosine"),
             f"lr_schedule={self.lr_schedule!r}; expected 'constant' or 'cosine'"),
            (0.0 <= self.holdout < 1.0, f"holdout={self.holdout!r}; expected a fraction in [0, 1)"),
            (0.0 <= self.dropout < 1.0, f"dropout={self.dropout!r}; expected a rate in [0, 1)"),
            (self.weight_decay >= 0.0, f"weight_decay={self.weight_decay!r}; expected a value >= 0"),
            *((0.0 <= getattr(self, name) <= 1.0, f"{name}={getattr(self, name)!r}; expected a fraction of steps")
              for name in ("ramp", "warmup")),
            (isinstance(self.augment, bool), f"augment={self.augment!r}; expected True or False"),
            (self.lr > 0, f"lr={self.lr!r}; expected a positive learning rate"),
        ))
        object.__setattr__(self, "shared_loading", _loading_mode(self.shared_loading))
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
