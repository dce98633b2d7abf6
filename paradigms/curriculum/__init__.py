"""Paradigm 2, curriculum learning: maker-scored difficulty, pacing, and learning under label noise.

Knowledge makers score every training example with the newest trainer version and write the
scores to the bank (:mod:`~carls_dask.paradigms.curriculum.loops`); the trainer samples by a pacing function
over those scores through a PyTorch sampler (:mod:`~carls_dask.paradigms.curriculum.pacing`,
:mod:`~carls_dask.paradigms.curriculum.sampler`) and relabels or down-weights examples whose given label the
makers consistently reject (:mod:`~carls_dask.paradigms.curriculum.cleaning`). :class:`Curriculum`
(:mod:`~carls_dask.paradigms.curriculum.paradigm`) is the paradigm ``carls-dask run curriculum`` runs
on a Dask cluster, as :func:`carls_dask.runtime.run_paradigm` does;
:func:`carls_dask.runtime.run_inline` runs it in one process, deterministically.
"""

from __future__ import annotations

from carls_dask.paradigms.curriculum.cleaning import (
    CLEAN_MODES,
    CleaningRule,
    clean_targets,
    detection_quality,
)
from carls_dask.paradigms.curriculum.loops import (
    BANK_COLUMNS,
    CurriculumTrainer,
    DifficultyMaker,
    difficulty_table,
)
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
from carls_dask.paradigms.curriculum.settings import (
    TABLE,
    CurriculumData,
    CurriculumSettings,
    load_data,
    make_model,
)

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
