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

__all__ = ["UNPREFIXED", "Curriculum"]

TRAINER = "trainer"

#: Series the dashboards read without a loop prefix, by the kind of loop that reports them.
UNPREFIXED: dict[str, tuple[str, ...]] = {
    "trainer": ("pacing", "admitted_fraction", "sampled_fraction", "batch_rank", "label_accuracy", "test_accuracy"),
    "maker": ("pl_precision", "pl_coverage", "flag_precision", "flag_recall", "flagged_fraction"),
}

#: The trainer's final figures a run reports (NaN when the run did not measure one, e.g. no bank).
TRAINER_FIGURES = ("test_accuracy", "val_accuracy", "val_accuracy_clean", "noise_estimate", "train_accuracy_clean",
                   "flag_precision", "flag_recall", "flagged_fraction",
                   "label_accuracy", "scored_fraction", "scores_steps_behind")


def maker_name(i: int, makers: int) -> str:
    """The name of maker ``i`` of ``makers``: ``maker`` when there is one, else ``maker-<i>``."""
    return "maker" if makers == 1 else f"maker-{i}"


class Curriculum(Paradigm):
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
    headline = ("test_accuracy", "flag_precision", "flag_recall")
    unprefixed = UNPREFIXED

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
        np.savez(run_dir / "truth.npz", keys=np.arange(data.labels.clean.shape[0], dtype=np.int64),
                 labels=data.labels.clean)

    def summarize(self, settings: CurriculumSettings, results: Mapping[str, LoopResult]) -> dict[str, Any]:
        """Test and clean-train accuracy, detection precision and recall, label accuracy, maker rounds and staleness.

        ``trainer_steps`` counts the primary trainer's steps in this run (after a resume, the steps
        since the checkpoint); ``maker_rounds`` and ``maker_staleness_s_mean`` are summed and
        averaged over the makers (with several makers, ``<maker>_rounds`` gives each one's rounds).
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
