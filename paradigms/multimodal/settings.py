"""What one multimodal run is: :class:`MultimodalSettings`, validated on construction, and the corpus it names."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from carls_dask.paradigms.multimodal.data import CorpusSpec
from carls_dask.paradigms.multimodal.text import TEXT_ENCODERS
from carls_dask.runtime.settings import check_settings

__all__ = ["NEGATIVES", "MultimodalSettings"]

#: The values of ``MultimodalSettings.negatives`` (and of ``ContrastiveTrainer``'s ``negatives``).
NEGATIVES = ("in_batch", "uniform", "log_uniform", "hard")


@dataclasses.dataclass(frozen=True)
class MultimodalSettings:
    """Settings of a multimodal run; validated on construction.

    Attributes
    ----------
    negatives
        Negatives beside the in-batch ones: ``in_batch`` (none), ``uniform`` or ``log_uniform``
        (``n_negatives`` corpus keys sampled from the bank, with expected counts) or ``hard`` (each
        query's top-k corpus rows by the bank's embeddings).
    reencode
        Encode the bank-drawn negatives' frozen image features and text ids with the current model
        (fresh, with gradients); false uses the bank's stored embeddings as constants.
    logq_correction
        Subtract log(expected count) from the sampled negatives' logits.
    seed
        Seed of the model initialisation, the batches and the samples (and of the concepts, unless
        split_seed is given).
    split_seed
        Seed of the concept choice (with a limit) and of the test and validation split (none: seed);
        fixing it compares training seeds on one split.
    steps
        Steps of the contrastive trainer (the primary one).
    batch_size
        Image-text pairs per step (in-batch negatives: batch_size - 1).
    n_negatives
        Corpus keys sampled from the bank per step (``uniform`` and ``log_uniform``).
    n_hard
        Hard negatives per query (``hard``; its top-k takes n_hard + 4 rows, the positive's concept masked).
    lr
        AdamW learning rate of the dual encoder.
    weight_decay
        AdamW weight decay of the dual encoder.
    dim
        Embedding size of the dual encoder, the bank's corpus tables and the class embeddings.
    hidden
        Width of the encoder heads.
    limit
        Concepts kept (none: all of about 1,700).
    n_test
        Held-out test concepts, one pair each (none: 300, or limit // 5 and at least 2 with a limit).
    n_val
        Validation concepts held out of training, one pair each; 0 keeps them in training.
    image_size
        Side of the rendered emoji images in pixels.
    classifier_steps
        Steps of the concept classifier with bank-held class embeddings (0: no classifier).
    cache_dir
        Folder of the rendered-image and frozen-feature caches (none: carls.data.dir/multimodal,
        else ~/.cache/carls-dask/multimodal; resolved before the run starts).
    publish_every
        Trainer steps between model versions the corpus maker picks up.
    bank_wait_s
        Seconds the first step after the first published version may wait for the maker's first
        pass (once), so short runs use bank negatives for certain; 0 never waits.
    eval_every
        Steps between evaluations of the retrieval figures (none: only at the end).
    torch_threads
        Intra-op threads torch may use in each loop's process (none leaves torch's default).
    text_encoder
        ``minilm`` (frozen all-MiniLM-L6-v2 features, a trainable projection head), ``hashed`` (hashed
        words and character trigrams, no pretrained weights) or ``auto`` (MiniLM when its packages
        import, else hashed with a warning; resolved before the run starts).
    temperature
        Initial softmax temperature of the contrastive loss.
    learn_temperature
        Learn the temperature (false: it stays fixed).
    classifier_sampled
        Classes the concept classifier samples per step (at least the number of classes, with a
        ``uniform`` sampler, is the full softmax).
    """

    negatives: str = "uniform"
    reencode: bool = True
    logq_correction: bool = False
    seed: int = 0
    split_seed: int | None = None
    steps: int = 400
    batch_size: int = 32
    n_negatives: int = 1024
    n_hard: int = 8
    lr: float = 2e-3
    weight_decay: float = 1e-4
    dim: int = 64
    hidden: int = 128
    limit: int | None = None
    n_test: int | None = None
    n_val: int = 0
    image_size: int = 64
    classifier_steps: int = 300
    cache_dir: str | None = None
    publish_every: int = 20
    bank_wait_s: float = 0.0
    eval_every: int | None = 100
    torch_threads: int | None = 1
    text_encoder: str = "auto"
    temperature: float = 0.07
    learn_temperature: bool = True
    classifier_sampled: int = 64

    def __post_init__(self) -> None:
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def at_least(name: str, low: int, optional: bool = False) -> tuple[bool, str]:
            v = getattr(self, name)
            ok = (optional and v is None) or (is_int(v) and v >= low)
            return ok, f"{name}={v!r}; expected an int >= {low}" + (" or None" if optional else "")

        checks: list[tuple[bool, str]] = [
            (self.negatives in NEGATIVES, f"negatives={self.negatives!r}; expected one of {NEGATIVES}"),
            (isinstance(self.reencode, bool), f"reencode={self.reencode!r}; expected a bool"),
            (isinstance(self.logq_correction, bool), f"logq_correction={self.logq_correction!r}; expected a bool"),
            (self.text_encoder in TEXT_ENCODERS, f"text_encoder={self.text_encoder!r}; expected one of {TEXT_ENCODERS}"),
            (isinstance(self.learn_temperature, bool), f"learn_temperature={self.learn_temperature!r}; expected a bool"),
            (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)
             and 0.01 <= self.temperature <= 1, f"temperature={self.temperature!r}; expected a number in [0.01, 1]"),
            at_least("classifier_sampled", 1),
            at_least("seed", 0), at_least("split_seed", 0, True), at_least("steps", 1), at_least("batch_size", 2),
            at_least("n_negatives", 1), at_least("n_hard", 1), at_least("dim", 1), at_least("hidden", 1),
            at_least("limit", 3, True),
            at_least("n_test", 1, True), at_least("n_val", 0), at_least("image_size", 8),
            at_least("classifier_steps", 0), at_least("publish_every", 1), at_least("eval_every", 1, True),
            at_least("torch_threads", 1, True),
            (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0,
             f"lr={self.lr!r}; expected a finite number > 0"),
            (isinstance(self.weight_decay, int | float) and math.isfinite(self.weight_decay)
             and self.weight_decay >= 0, f"weight_decay={self.weight_decay!r}; expected a finite number >= 0"),
            (isinstance(self.bank_wait_s, int | float) and math.isfinite(self.bank_wait_s) and self.bank_wait_s >= 0,
             f"bank_wait_s={self.bank_wait_s!r}; expected a finite number >= 0"),
            (self.cache_dir is None or (isinstance(self.cache_dir, str) and bool(self.cache_dir)),
             f"cache_dir={self.cache_dir!r}; expected a folder or None"),
        ]
        check_settings("multimodal settings", checks)
        check_settings("multimodal settings", (
            (self.image_size <= 512, f"image_size={self.image_size!r}; expected an int in [8, 512]"),
            (self.limit is None or self.test_concepts + self.n_val < self.limit,
             f"n_test={self.test_concepts} and n_val={self.n_val} held out of limit={self.limit} concepts; "
             "expected n_test + n_val < limit"),
        ))

    @property
    def test_concepts(self) -> int:
        """``n_test``, or its default: 300, or ``limit // 5`` (at least 2) with a limit."""
        if self.n_test is not None:
            return self.n_test
        return 300 if self.limit is None else max(2, self.limit // 5)

    def corpus(self) -> CorpusSpec:
        """The :class:`CorpusSpec` of these settings (what every loop loads)."""
        return CorpusSpec(size=self.image_size, limit=self.limit, n_test=self.test_concepts, n_val=self.n_val,
                          seed=self.seed if self.split_seed is None else self.split_seed, cache_dir=self.cache_dir,
                          torch_threads=self.torch_threads, text_encoder=self.text_encoder)
