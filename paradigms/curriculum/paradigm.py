"""The curriculum paradigm as the runner sees it: variants, the bank table, loops and figures.

Variants (``carls-dask run curriculum --variant NAME``):

``uniform``
    Batches drawn uniformly from all examples with their given labels; no bank, no makers (the baseline).
``curriculum``
    The makers score every example with each new model version; after a warm-up on all examples the
    trainer draws from the easiest half of every class, growing to all of them by the pacing function.
``curriculum+clean`` (default)
    ``curriculum`` plus cleaning: examples whose given label the makers rejected with confidence in
    consecutive rounds are relabelled with the makers' prediction (``clean="downweight"`` stops drawing
    them instead).

The run folder also holds ``truth.npz``: the clean training labels (``keys``, ``labels``), which
training never reads, for the dashboards' accuracy-by-difficulty view.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from carls_dask.paradigms.curriculum.data import load_data
from carls_dask.paradigms.curriculum.loops import CurriculumTrainer, DifficultyMaker
from carls_dask.paradigms.curriculum.settings import CurriculumSettings
from carls_dask.paradigms.curriculum.tables import difficulty_table
from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.paradigm import Paradigm
from carls_dask.storage.runfolder import (
    ADMITTED_FRACTION,
    FLAG_PRECISION,
    FLAG_RECALL,
    FLAGGED_FRACTION,
    PACING,
    PL_COVERAGE,
    PL_PRECISION,
    SAMPLED_FRACTION,
    SCORED_FRACTION,
    RunFolder,
)

__all__ = ["UNPREFIXED", "Curriculum"]

TRAINER = "trainer"

#: Series the dashboards read without a loop prefix, by the kind of loop that reports them.
UNPREFIXED: dict[str, tuple[str, ...]] = {
    "trainer": (PACING, ADMITTED_FRACTION, SAMPLED_FRACTION, "batch_rank", "label_accuracy", "test_accuracy"),
    "maker": (PL_PRECISION, PL_COVERAGE, FLAG_PRECISION, FLAG_RECALL, FLAGGED_FRACTION),
}

#: The trainer's final figures a run reports (NaN when the run did not measure one, e.g. no bank).
TRAINER_FIGURES = ("test_accuracy", "val_accuracy", "val_accuracy_clean", "noise_estimate", "train_accuracy_clean",
                   FLAG_PRECISION, FLAG_RECALL, FLAGGED_FRACTION,
                   "label_accuracy", SCORED_FRACTION, "scores_steps_behind")
#: The trainer's figures that come from the makers' scores it reads from the bank.
BANK_FIGURES = (FLAG_PRECISION, FLAG_RECALL, FLAGGED_FRACTION, "label_accuracy", SCORED_FRACTION,
                "scores_steps_behind", "noise_estimate")


def maker_name(i: int, makers: int) -> str:
    """The name of maker ``i`` of ``makers``: ``maker`` when there is one, else ``maker-<i>``."""
    return "maker" if makers == 1 else f"maker-{i}"


class Curriculum(Paradigm[CurriculumSettings]):
    """Image classification under label noise with maker-scored difficulty, pacing and label cleaning."""

    name = "curriculum"
    description = ("image classification under label noise on Fashion-MNIST and scikit-learn's 8x8 digits: maker-scored "
                   "difficulty, paced sampling and label cleaning")
    settings_type = CurriculumSettings
    variants = {
        "uniform": {"pacing": "uniform", "clean": "none"},
        "curriculum": {"pacing": "linear", "clean": "none"},
        "curriculum+clean": {"pacing": "linear", "clean": "relabel"},
    }
    default_variant = "curriculum+clean"
    headline = ("test_accuracy", FLAG_PRECISION, FLAG_RECALL)
    unprefixed = UNPREFIXED
    cumulative = ("trainer_steps", "trainer_seconds", "maker_rounds", "*_rounds")

    def prepare(self, settings: CurriculumSettings) -> CurriculumSettings:
        """Load the data here, so a missing data set fails before a cluster starts."""
        load_data(settings)
        return settings

    def tables(self, settings: CurriculumSettings) -> Sequence[Any]:
        """The difficulty table when the variant paces or cleans; none for the uniform baseline."""
        return [difficulty_table()] if settings.uses_bank else []

    def loops(self, settings: CurriculumSettings) -> Sequence[Any]:
        """The trainer, then ``settings.makers`` difficulty makers each scoring its part of the examples."""
        out: list[Any] = [CurriculumTrainer(settings, name=TRAINER)]
        if settings.uses_bank:
            out += [DifficultyMaker(settings, name=maker_name(i, settings.makers), source=TRAINER, part=i,
                                    parts=settings.makers) for i in range(settings.makers)]
        return out

    def write_artifacts(self, settings: CurriculumSettings, run_dir: pathlib.Path) -> None:
        """``truth.npz``: the clean training labels (``keys``, ``labels``) the dashboards compare against."""
        data = load_data(settings)
        np.savez(RunFolder(run_dir).truth, keys=np.arange(data.labels.clean.shape[0], dtype=np.int64),
                 labels=data.labels.clean)

    def summarize(self, settings: CurriculumSettings, results: Mapping[str, LoopResult]) -> dict[str, Any]:
        """Test and clean-train accuracy, detection precision and recall, label accuracy, maker rounds and staleness.

        ``trainer_steps`` counts the primary trainer's steps in this segment of the run (after a resume,
        the steps since the checkpoint; ``result.json`` adds up the segments of an extended run);
        ``maker_rounds`` and ``maker_staleness_s_mean`` are summed and averaged over the makers (with
        several makers, ``<maker>_rounds`` gives each one's rounds).
        """
        trainer = results[TRAINER]
        value = dict(trainer.value or {})
        out: dict[str, Any] = {name: value.get(name, math.nan) for name in TRAINER_FIGURES}
        makers = [r for r in results.values() if r.kind == "maker"]
        staleness = [m.staleness for r in makers for m in r.rounds]
        out["trainer_steps"] = trainer.steps
        out["trainer_seconds"] = trainer.elapsed
        out["maker_rounds"] = sum(len(r.rounds) for r in makers)
        if len(makers) > 1:
            for r in makers:
                out[f"{r.name}_rounds"] = len(r.rounds)
        out["maker_staleness_s_mean"] = float(np.mean(staleness)) if staleness else math.nan
        return out

    def missing_reasons(self, settings: CurriculumSettings, results: Mapping[str, LoopResult],
                        missing: Sequence[str]) -> dict[str, str]:
        """Why a figure has no value: a variant without makers, or a run too short for the makers' scores and flags.

        The trainer reads the makers' scores every ``refresh_every`` steps; the makers score each version
        the trainer publishes every ``publish_every`` steps; a label is flagged after ``clean_rounds``
        rounds that reject it.
        """
        reasons = super().missing_reasons(settings, results, missing)
        if not settings.uses_bank:
            why = (f"not measured: the variant (pacing {settings.pacing!r}, clean {settings.clean!r}) runs no makers, "
                   "so nothing is scored or flagged")
            return {name: why for name in missing if name in BANK_FIGURES} | {
                k: v for k, v in reasons.items() if k not in BANK_FIGURES}
        trainer = results[TRAINER]
        rounds = sum(len(r.rounds) for r in results.values() if r.kind == "maker")
        steps = trainer.step
        took = f"{trainer.steps} steps" + (f" (from step {trainer.resumed_at})" if trainer.resumed_at else "")
        if steps < settings.refresh_every or rounds == 0:
            why = (f"not measured: in {took} the makers made {rounds} round(s) (they score each version the "
                   f"trainer publishes every {settings.publish_every} steps, publish_every) and the trainer read "
                   f"their scores every {settings.refresh_every} steps (refresh_every); run more steps or lower "
                   "publish_every and refresh_every")
            reasons.update({name: why for name in missing if name in BANK_FIGURES})
        elif settings.clean != "none":
            why = (f"no label was flagged: a label is flagged after {settings.clean_rounds} maker rounds that reject it "
                   f"with confidence {settings.clean_confidence} (clean_rounds, clean_confidence), and the makers made "
                   f"{rounds} round(s) in {took}; run more steps or lower publish_every")
            reasons.update({name: why for name in missing if name in (FLAG_PRECISION, FLAG_RECALL)})
        return reasons
