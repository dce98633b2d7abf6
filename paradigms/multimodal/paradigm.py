"""The multimodal paradigm as the runner sees it: settings, variants, tables, loops and figures.

Variants (``carls-dask run multimodal --variant NAME``):

``in-batch``
    The baseline: each pair's negatives are the other pairs of its batch only.
``uniform`` (default)
    In-batch negatives plus ``n_negatives`` corpus keys sampled uniformly from the bank, encoded
    by the current model (the settings ``benchmarks/multimodal.py`` chose on the validation split).
``log-uniform``
    As ``uniform``, the keys sampled log-uniformly by frequency rank.
``hard``
    In-batch negatives plus each query's top-k corpus rows by the maker's bank embeddings.

Every variant runs the :class:`~carls_dask.paradigms.multimodal.loops.CorpusMaker` (the bank
holds the corpus embeddings of each published encoder) and, with ``classifier_steps``, the
:class:`~carls_dask.paradigms.multimodal.loops.ConceptClassifierTrainer` beside the primary
:class:`~carls_dask.paradigms.multimodal.loops.ContrastiveTrainer`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from carls_dask.errors import ConfigError
from carls_dask.locations import cache_dir
from carls_dask.paradigms.data.sentences import SENTENCE_DIM
from carls_dask.paradigms.multimodal.loops import (
    NEGATIVES,
    ConceptClassifierTrainer,
    ContrastiveTrainer,
    CorpusMaker,
    CorpusSpec,
    corpus_tables,
    initialise_bank,
    load_corpus,
)
from carls_dask.paradigms.multimodal.text import TEXT_ENCODERS, resolve_text_encoder
from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.paradigm import Paradigm

__all__ = ["RECALLS", "Multimodal", "MultimodalSettings"]

logger = logging.getLogger(__name__)

#: The subfolder of ``carls.data.cache`` holding rendered images and frozen features (without a cache_dir setting).
MULTIMODAL_CACHE = "multimodal"
TRAINER = "trainer"
CLASSIFIER = "classifier"
MAKER = "corpus-maker"
RECALLS = ("i2t_r@1", "i2t_r@5", "t2i_r@1", "t2i_r@5")


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
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"multimodal settings: {msg}")
        if self.image_size > 512:
            raise ConfigError(f"multimodal settings: image_size={self.image_size!r}; expected an int in [8, 512]")
        if self.limit is not None and self.test_concepts + self.n_val >= self.limit:
            raise ConfigError(f"multimodal settings: n_test={self.test_concepts} and n_val={self.n_val} held out of "
                              f"limit={self.limit} concepts; expected n_test + n_val < limit")

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


class Multimodal(Paradigm):
    """Image-text contrastive learning on OpenMoji pairs with bank negatives and bank-held classes."""

    name = "multimodal"
    description = "CLIP-style image-text retrieval on OpenMoji with corpus embeddings and negatives from the bank"
    settings_type = MultimodalSettings
    variants = {
        "in-batch": {"negatives": "in_batch"},
        "uniform": {"negatives": "uniform"},
        "log-uniform": {"negatives": "log_uniform"},
        "hard": {"negatives": "hard"},
    }
    default_variant = "uniform"
    cumulative = ("maker_rounds",)
    headline = (*RECALLS, *(f"val_{m}" for m in RECALLS), "classifier_top1")
    unprefixed = {"trainer": RECALLS, "maker": ("text_drift",)}

    def prepare(self, settings: MultimodalSettings) -> MultimodalSettings:
        """Resolve the cache folder and the text encoder here (so every loop gets them explicitly) and load
        the corpus once.

        Loading renders the images and computes the frozen features when they are not cached yet,
        so the loops only read the caches, and a bad split fails before any cluster starts.
        """
        folder = str(cache_dir(MULTIMODAL_CACHE, settings.cache_dir))
        settings = dataclasses.replace(settings, cache_dir=folder,
                                       text_encoder=resolve_text_encoder(settings.text_encoder))
        corpus = load_corpus(settings.corpus())
        logger.info("multimodal corpus: %d train pairs, %d validation and %d test concepts (cache %s)",
                    len(corpus.train), len(corpus.val), len(corpus.test), folder)
        return settings

    def tables(self, settings: MultimodalSettings) -> Sequence[Any]:
        minilm = resolve_text_encoder(settings.text_encoder) == "minilm"
        return corpus_tables(settings.dim, settings.dim if settings.classifier_steps else None,
                             SENTENCE_DIM if minilm else None)

    def initialise(self, bank: Any, settings: MultimodalSettings) -> None:
        """Write the frozen pretrained features of the train corpus into ``images.pretrained`` (and, with the
        MiniLM text encoder, ``texts.pretrained``)."""
        written = initialise_bank(bank, settings.corpus())
        logger.info("pretrained features written for %d corpus rows", written)

    def loops(self, settings: MultimodalSettings) -> Sequence[Any]:
        s, corpus = settings, settings.corpus()
        out: list[Any] = [ContrastiveTrainer(
            corpus, negatives=s.negatives, n_negatives=s.n_negatives, n_hard=s.n_hard, reencode=s.reencode,
            logq_correction=s.logq_correction, batch_size=s.batch_size, lr=s.lr, dim=s.dim, hidden=s.hidden,
            weight_decay=s.weight_decay, seed=s.seed, bank_wait_s=s.bank_wait_s, name=TRAINER, max_steps=s.steps,
            publish_every=s.publish_every, eval_every=s.eval_every, temperature=s.temperature,
            learn_temperature=s.learn_temperature)]
        if s.classifier_steps:
            out.append(ConceptClassifierTrainer(corpus, dim=s.dim, hidden=s.hidden, seed=s.seed, name=CLASSIFIER,
                                                n_sampled=s.classifier_sampled, max_steps=s.classifier_steps,
                                                eval_every=s.eval_every))
        out.append(CorpusMaker(corpus, dim=s.dim, hidden=s.hidden, name=MAKER, source=TRAINER))
        return out

    def summarize(self, settings: MultimodalSettings, results: Mapping[str, LoopResult]) -> dict[str, Any]:
        """The figures of a run; a figure that is not defined (no maker round, no bank step) is ``None``.

        Test recalls (``i2t_r@1`` ... ``t2i_r@5``), with ``n_val`` the same on the validation split
        (``val_...``), the split sizes, ``bank_steps`` (steps that used bank negatives),
        ``mean_bank_age_s`` (with stored embeddings), ``steps`` and ``steps_per_s`` of the trainer;
        ``maker_rounds`` and ``mean_staleness_s`` of the corpus maker; with a classifier its
        ``classifier_top1``, ``classifier_top5``, ``classifier_classes`` (every CLDR concept),
        ``classifier_sampled`` (classes per step), ``classifier_step_ms`` and ``classifier_steps``.
        """
        trainer = results[TRAINER]
        out: dict[str, Any] = {k: _number(v) for k, v in dict(trainer.value or {}).items()}
        out["steps"] = trainer.step
        out["steps_per_s"] = _number(trainer.metrics.get("steps_per_s"))
        maker = results.get(MAKER)
        rounds = maker.rounds if maker is not None else []
        out["maker_rounds"] = len(rounds)
        out["mean_staleness_s"] = _number(sum(r.staleness for r in rounds) / len(rounds)) if rounds else None
        classifier = results.get(CLASSIFIER)
        if classifier is not None:
            value = dict(classifier.value or {})
            for key in ("top1", "top5", "classes", "sampled", "step_ms"):
                out[f"classifier_{key}"] = _number(value.get(key))
            out["classifier_steps"] = classifier.step
        return out


def _number(value: Any) -> float | None:
    """``value`` as a float, or ``None`` when it is missing or not finite (strict JSON)."""
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None
