"""Names of the metric series the dashboards look for in a run's metric store.

Trainers, makers and paradigms append these with ``MetricWriter.append(step, **values)``; every one
is optional, and a view shows a message for a series that a run does not write.
"""

from __future__ import annotations

__all__ = [
    "ACCURACY_BY_DIFFICULTY",
    "ADMITTED_FRACTION",
    "BANK_LOOKUPS",
    "BANK_ROWS",
    "BANK_UPDATES",
    "DIFFICULTY_HIST",
    "PACING",
    "PL_COVERAGE",
    "PL_PRECISION",
    "SAMPLED_FRACTION",
    "STEPS_PER_S",
    "TRAIN_LOSS",
    "WALL_TIME",
]

#: Unix time (seconds) of each row: a coordinate the metric store records itself; turns counters into rates.
WALL_TIME = "wall_time"
#: Training loss of the trainer at the step.
TRAIN_LOSS = "train_loss"
#: Trainer throughput, steps per second.
STEPS_PER_S = "steps_per_s"
#: Cumulative count of bank rows looked up (a counter; the dashboard shows its rate).
BANK_LOOKUPS = "bank_lookups"
#: Cumulative count of bank rows updated (a counter; the dashboard shows its rate).
BANK_UPDATES = "bank_updates"
#: Rows held by the bank.
BANK_ROWS = "bank_rows"
#: Pseudo-label precision against held-out truth, as measured by the run.
PL_PRECISION = "pl_precision"
#: Fraction of rows carrying a pseudo label.
PL_COVERAGE = "pl_coverage"
#: Curriculum pacing function: the fraction of the data the schedule admits at the step.
PACING = "pacing"
#: Fraction of the data actually admitted (sampled) up to the step.
ADMITTED_FRACTION = "admitted_fraction"
#: Fraction of the data the sampler actually drew from so far (realised sampling).
SAMPLED_FRACTION = "sampled_fraction"
#: Histogram of difficulty scores over fixed bins, one vector per step (dimension ``difficulty_bin``).
DIFFICULTY_HIST = "difficulty_hist"
#: Accuracy per difficulty bin, one vector per step (dimension ``difficulty_bin``).
ACCURACY_BY_DIFFICULTY = "accuracy_by_difficulty"
