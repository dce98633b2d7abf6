"""Paradigm 2, curriculum learning: maker-scored difficulty, pacing, and learning under label noise.

Knowledge makers score every training example with the newest trainer version and write the
scores to the bank; the trainer samples by a pacing function over those scores through a PyTorch
sampler and relabels or down-weights examples whose given label the makers consistently reject.

- :mod:`~carls_dask.paradigms.curriculum.settings`: :class:`CurriculumSettings`, what one run is;
- :mod:`~carls_dask.paradigms.curriculum.paradigm`: :class:`Curriculum`, the paradigm ``carls-dask run
  curriculum`` runs on a Dask cluster, as :func:`carls_dask.runtime.run_paradigm` does
  (:func:`carls_dask.runtime.run_inline` runs it in one process, deterministically);
- :mod:`~carls_dask.paradigms.curriculum.loops`: the trainer and the difficulty maker;
- :mod:`~carls_dask.paradigms.curriculum.models`: the MLP or CNN classifier;
- :mod:`~carls_dask.paradigms.curriculum.data`: the images and noisy labels a run reads;
- :mod:`~carls_dask.paradigms.curriculum.tables`: the bank table of per-example scores;
- topic modules: :mod:`~carls_dask.paradigms.curriculum.pacing`, :mod:`~carls_dask.paradigms.curriculum.sampler`,
  :mod:`~carls_dask.paradigms.curriculum.scoring`, :mod:`~carls_dask.paradigms.curriculum.cleaning`,
  :mod:`~carls_dask.paradigms.curriculum.noise`, :mod:`~carls_dask.paradigms.curriculum.augment` and
  :mod:`~carls_dask.paradigms.curriculum.feed` (the loops' data feed, shared between loops of a node).
"""

from __future__ import annotations

from carls_dask.paradigms.curriculum.cleaning import (
    CLEAN_MODES,
    CleaningRule,
    clean_targets,
    detection_quality,
)
from carls_dask.paradigms.curriculum.data import CurriculumData, load_data
from carls_dask.paradigms.curriculum.loops import CurriculumTrainer, DifficultyMaker
from carls_dask.paradigms.curriculum.models import make_model
from carls_dask.paradigms.curriculum.noise import NoisyLabels, symmetric_noise
from carls_dask.paradigms.curriculum.pacing import (
    PACING_SCHEDULES,
    FractionPacing,
    Pacing,
    SelfPacedPacing,
    make_pacing,
)
from carls_dask.paradigms.curriculum.paradigm import Curriculum
from carls_dask.paradigms.curriculum.sampler import CurriculumSampler
from carls_dask.paradigms.curriculum.scoring import SCORERS, get_scorer, register_scorer
from carls_dask.paradigms.curriculum.settings import CurriculumSettings
from carls_dask.paradigms.curriculum.tables import BANK_COLUMNS, TABLE, difficulty_table

__all__ = [
    "BANK_COLUMNS",
    "CLEAN_MODES",
    "PACING_SCHEDULES",
    "SCORERS",
    "TABLE",
    "CleaningRule",
    "Curriculum",
    "CurriculumData",
    "CurriculumSampler",
    "CurriculumSettings",
    "CurriculumTrainer",
    "DifficultyMaker",
    "FractionPacing",
    "NoisyLabels",
    "Pacing",
    "SelfPacedPacing",
    "clean_targets",
    "detection_quality",
    "difficulty_table",
    "get_scorer",
    "load_data",
    "make_model",
    "make_pacing",
    "register_scorer",
    "symmetric_noise",
]
