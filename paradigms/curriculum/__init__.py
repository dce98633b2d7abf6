"""Paradigm 2, curriculum learning: maker-scored difficulty, pacing, and learning under label noise.

Knowledge makers score every training example with the newest trainer version and write the
scores to the bank (:mod:`~paradigms.curriculum.loops`); the trainer samples by a pacing function
over those scores through a PyTorch sampler (:mod:`~paradigms.curriculum.pacing`,
:mod:`~paradigms.curriculum.sampler`) and relabels or down-weights examples whose given label the
makers consistently reject (:mod:`~paradigms.curriculum.cleaning`). ``carls-dask run curriculum``
runs it on a Dask cluster (:mod:`~paradigms.curriculum.run`); :func:`run_inline` runs it in one
process, deterministically.
"""

from __future__ import annotations

from paradigms.curriculum.cleaning import CLEAN_MODES, CleaningRule, clean_targets, detection_quality
from paradigms.curriculum.inline import InlineResult, LocalBank, run_inline
from paradigms.curriculum.loops import BANK_COLUMNS, CurriculumTrainer, DifficultyMaker, difficulty_table
from paradigms.curriculum.noise import NoisyLabels, symmetric_noise
from paradigms.curriculum.pacing import PACING_SCHEDULES, FractionPacing, Pacing, SelfPacedPacing, make_pacing
from paradigms.curriculum.sampler import CurriculumSampler
from paradigms.curriculum.scoring import SCORERS, get_scorer, register_scorer
from paradigms.curriculum.settings import TABLE, CurriculumData, CurriculumSettings, load_data, make_model

__all__ = [
    "BANK_COLUMNS",
    "CLEAN_MODES",
    "PACING_SCHEDULES",
    "SCORERS",
    "TABLE",
    "CleaningRule",
    "CurriculumData",
    "CurriculumSampler",
    "CurriculumSettings",
    "CurriculumTrainer",
    "DifficultyMaker",
    "FractionPacing",
    "InlineResult",
    "LocalBank",
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
    "run_inline",
    "symmetric_noise",
]
