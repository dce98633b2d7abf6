"""Pacing functions: which training examples a curriculum admits at a step, from their difficulty.

Two families, both pure:

- :class:`FractionPacing` admits the easiest ``fraction(step)`` of the data, where the fraction grows
  from ``start`` to ``end`` over ``ramp_steps`` along a ``linear``, ``root`` or ``step`` schedule
  (``uniform`` keeps it at 1: every example, the baseline);
- :class:`SelfPacedPacing` admits every example whose difficulty is at most a threshold that grows
  from ``start`` to ``end`` (self-paced learning), with at least ``min_fraction`` of the data admitted.

Both admit all data during ``warmup_steps`` (the model that scores difficulty is the one being trained,
and needs a few steps before its scores mean anything), and all data while no scores exist.
Examples without a score (NaN) rank after every scored one.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from carls_dask.errors import ConfigError, HookNotImplementedError

__all__ = ["PACING_SCHEDULES", "FractionPacing", "Pacing", "SelfPacedPacing", "make_pacing"]

PACING_SCHEDULES = ("uniform", "linear", "root", "step", "self-paced")


def _non_negative_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 0:
        raise ConfigError(f"{what}: got {value!r}; expected a non-negative int")
    return int(value)


class Pacing:
    """Base class: :meth:`planned` fraction and :meth:`admit` mask at a step."""

    name = "pacing"
    warmup_steps = 0

    def planned(self, step: int) -> float:
        """The fraction of the data the schedule plans to admit at ``step`` (NaN when it plans none)."""
        raise HookNotImplementedError(f"{type(self).__name__} must implement planned()")

    def admit(self, difficulty: np.ndarray, step: int) -> np.ndarray:
        """``bool[n]``: which examples are admitted at ``step`` given their difficulty (NaN = unscored)."""
        raise HookNotImplementedError(f"{type(self).__name__} must implement admit()")

    def _all(self, difficulty: np.ndarray, step: int) -> bool:
        return step < self.warmup_steps or not bool(np.isfinite(difficulty).any())


def _easiest(difficulty: np.ndarray, count: int) -> np.ndarray:
    """Mask of the ``count`` easiest examples; ties broken by index, NaN last."""
    d = np.where(np.isfinite(difficulty), difficulty, np.inf)
    order = np.argsort(d, kind="stable")
    mask = np.zeros(d.shape[0], dtype=bool)
    mask[order[:count]] = True
    return mask


@dataclasses.dataclass(frozen=True)
class FractionPacing(Pacing):
    """Admit the easiest ``fraction(step)`` of the examples.

    Parameters
    ----------
    schedule
        ``"linear"`` (t), ``"root"`` (sqrt t: admits quickly, then slowly), ``"step"`` (``stages``
        equal jumps) or ``"uniform"`` (always everything).
    start, end
        Fractions admitted right after the warm-up and at the end of the ramp.
    ramp_steps
        Steps from ``start`` to ``end`` (after the warm-up).
    warmup_steps
        Steps at the beginning during which every example is admitted.
    stages
        Jumps of the ``step`` schedule.
    """

    schedule: str = "linear"
    start: float = 0.25
    end: float = 1.0
    ramp_steps: int = 1000
    warmup_steps: int = 0
    stages: int = 4

    def __post_init__(self) -> None:
        if self.schedule not in ("uniform", "linear", "root", "step"):
            raise ConfigError(f"FractionPacing: schedule={self.schedule!r}; expected 'uniform', 'linear', 'root' "
                              "or 'step'")
        if not (0.0 < float(self.start) <= 1.0 and 0.0 < float(self.end) <= 1.0 and self.start <= self.end):
            raise ConfigError(f"FractionPacing: start={self.start!r}, end={self.end!r}; expected 0 < start <= end <= 1")
        _non_negative_int(self.ramp_steps, "FractionPacing ramp_steps")
        _non_negative_int(self.warmup_steps, "FractionPacing warmup_steps")
        if _non_negative_int(self.stages, "FractionPacing stages") < 1:
            raise ConfigError(f"FractionPacing: stages={self.stages!r}; expected at least 1")

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.schedule

    def planned(self, step: int) -> float:
        if self.schedule == "uniform" or step < self.warmup_steps:
            return 1.0
        t = 1.0 if self.ramp_steps == 0 else min(1.0, max(0.0, (step - self.warmup_steps) / self.ramp_steps))
        if self.schedule == "root":
            t = math.sqrt(t)
        elif self.schedule == "step":
            t = math.floor(t * self.stages) / self.stages
        return float(self.start + (self.end - self.start) * t)

    def admit(self, difficulty: np.ndarray, step: int) -> np.ndarray:
        d = np.asarray(difficulty, dtype=np.float64)
        if self.schedule == "uniform" or self._all(d, step):
            return np.ones(d.shape[0], dtype=bool)
        return _easiest(d, max(1, math.ceil(self.planned(step) * d.shape[0] - 1e-9)))


@dataclasses.dataclass(frozen=True)
class SelfPacedPacing(Pacing):
    """Admit examples whose difficulty is at most a threshold growing from ``start`` to ``end``.

    Parameters
    ----------
    start, end
        Thresholds on the difficulty score right after the warm-up and at the end of the ramp.
    ramp_steps, warmup_steps
        As for :class:`FractionPacing`.
    min_fraction
        The easiest ``min_fraction`` of the data is admitted even above the threshold.
    """

    start: float = 0.5
    end: float = 3.0
    ramp_steps: int = 1000
    warmup_steps: int = 0
    min_fraction: float = 0.1

    name = "self-paced"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and math.isfinite(self.end) and self.start <= self.end):
            raise ConfigError(f"SelfPacedPacing: start={self.start!r}, end={self.end!r}; expected finite start <= end")
        _non_negative_int(self.ramp_steps, "SelfPacedPacing ramp_steps")
        _non_negative_int(self.warmup_steps, "SelfPacedPacing warmup_steps")
        if not 0.0 <= self.min_fraction <= 1.0:
            raise ConfigError(f"SelfPacedPacing: min_fraction={self.min_fraction!r}; expected a value in [0, 1]")

    def threshold(self, step: int) -> float:
        """The difficulty threshold at ``step``."""
        t = 1.0 if self.ramp_steps == 0 else min(1.0, max(0.0, (step - self.warmup_steps) / self.ramp_steps))
        return float(self.start + (self.end - self.start) * t)

    def planned(self, step: int) -> float:
        return 1.0 if step < self.warmup_steps else math.nan

    def admit(self, difficulty: np.ndarray, step: int) -> np.ndarray:
        d = np.asarray(difficulty, dtype=np.float64)
        if self._all(d, step):
            return np.ones(d.shape[0], dtype=bool)
        mask = np.isfinite(d) & (d <= self.threshold(step))
        floor = math.ceil(self.min_fraction * d.shape[0] - 1e-9)
        if int(mask.sum()) < floor:
            mask |= _easiest(d, floor)
        return mask


def make_pacing(schedule: str, *, start: float | None = None, end: float | None = None, ramp_steps: int = 1000,
                warmup_steps: int = 0, stages: int = 4, min_fraction: float = 0.1) -> Pacing:
    """Build a pacing function by name (one of :data:`PACING_SCHEDULES`).

    ``start``/``end`` are fractions for the fraction schedules (default 0.25 and 1.0) and difficulty
    thresholds for ``"self-paced"`` (default 0.5 and 3.0, suited to the ``loss`` scorer).
    """
    if schedule == "self-paced":
        return SelfPacedPacing(0.5 if start is None else float(start), 3.0 if end is None else float(end),
                               ramp_steps, warmup_steps, min_fraction)
    if schedule in PACING_SCHEDULES:
        return FractionPacing(schedule, 0.25 if start is None else float(start), 1.0 if end is None else float(end),
                              ramp_steps, warmup_steps, stages)
    raise ConfigError(f"unknown pacing schedule {schedule!r}; expected one of {list(PACING_SCHEDULES)}")
