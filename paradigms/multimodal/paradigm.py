"""The multimodal paradigm as the runner sees it: variants, tables, loops and figures.

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
from typing import TYPE_CHECKING, Any

from carls_dask.locations import cache_dir
from carls_dask.paradigms.data.sentences import SENTENCE_DIM
from carls_dask.paradigms.multimodal.data import MULTIMODAL_CACHE, load_corpus
from carls_dask.paradigms.multimodal.loops import ConceptClassifierTrainer, ContrastiveTrainer, CorpusMaker
from carls_dask.paradigms.multimodal.settings import MultimodalSettings
from carls_dask.paradigms.multimodal.tables import corpus_tables, initialise_bank
from carls_dask.paradigms.multimodal.text import resolve_text_encoder
from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.paradigm import Paradigm

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["RECALLS", "Multimodal"]

logger = logging.getLogger(__name__)

TRAINER = "trainer"
CLASSIFIER = "classifier"
MAKER = "corpus-maker"
RECALLS = ("i2t_r@1", "i2t_r@5", "t2i_r@1", "t2i_r@5")


class Multimodal(Paradigm[MultimodalSettings]):
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

    def initialise(self, bank: KnowledgeBank, settings: MultimodalSettings) -> None:
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
