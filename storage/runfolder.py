"""The run folder: every file and folder name a run writes, and the metric names its writers and readers share.

One run of ``carls-dask run`` (or ``carls-dask demo``, or :func:`carls_dask.runtime.runner.run_paradigm`
with a ``run_dir``) writes one folder::

    RUN/request.json            what was asked: paradigm, variant, settings, driver, the run's id and its
                                primary trainer (written when the run starts; read by --resume)
    RUN/run.json                what ran on a Workbench: loops, their states, the resolved configuration
    RUN/result.json             the figures of a finished run, one entry per segment (see the runner)
    RUN/metrics.zarr/           the metric store (:mod:`carls_dask.storage.metrics`)
    RUN/bank/                   the bank store: snapshots and delta log (:mod:`carls_dask.storage.manifest`)
    RUN/checkpoints/TRAINER/step-000000400.pt
                                each trainer's saved states (:mod:`carls_dask.runtime.checkpoints`)
    RUN/truth.npz               held-out labels (``keys``, ``labels``) the dashboards judge labels with,
                                written by the paradigms that have them
    RUN/report.html             the static report, when ``carls-dask report RUN -o RUN/report.html`` put it there

Files are written under a temporary name that starts with a dot and renamed, so a reader never sees
half a file; such names belong to the file they become. Writers (the runner, the Workbench, the
checkpointer, the paradigms) and readers (the dashboards, ``--resume``, the demo) take every name
from here, and so do the metric names below: the series trainers and makers report, the progress
sink writes, and the dashboards look for.

This module imports nothing else of the project but its errors, so every layer can use it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any

from carls_dask.errors import CorruptStoreError

__all__ = [
    "ACCURACY_BY_DIFFICULTY",
    "ADMITTED_FRACTION",
    "BANK",
    "BANK_KB_PER_STEP",
    "BANK_LOOKUPS",
    "BANK_MESSAGES_PER_STEP",
    "BANK_ROWS",
    "BANK_UPDATES",
    "BANK_WAIT_MS_PER_STEP",
    "CHECKPOINTS",
    "DIFFICULTY_HIST",
    "ENTRIES",
    "FLAGGED_FRACTION",
    "FLAG_PRECISION",
    "FLAG_RECALL",
    "MAKER_STALENESS_S",
    "MAKER_VERSION",
    "METRICS",
    "PACING",
    "PL_COUNT",
    "PL_COVERAGE",
    "PL_PRECISION",
    "REPORT",
    "REQUEST",
    "RESULT",
    "RUN_MARKERS",
    "RUN_RECORD",
    "SAMPLED_FRACTION",
    "SCORED_FRACTION",
    "STEPS_PER_S",
    "TRAINER_CPU_MS_PER_STEP",
    "TRAIN_LOSS",
    "TRUTH",
    "WALL_TIME",
    "RunFolder",
    "part_hint",
    "state_file",
    "state_step",
]

# ----------------------------------------------------------------------------------------- file names

#: What was asked (read by ``--resume``).
REQUEST = "request.json"
#: What ran on a Workbench.
RUN_RECORD = "run.json"
#: The figures of a finished run.
RESULT = "result.json"
#: The metric store.
METRICS = "metrics.zarr"
#: The bank store.
BANK = "bank"
#: The trainers' saved states, one folder per trainer.
CHECKPOINTS = "checkpoints"
#: Held-out labels for the dashboards.
TRUTH = "truth.npz"
#: The static report, when written into the run folder.
REPORT = "report.html"

#: Every entry of a run folder: name to ``"file"`` or ``"folder"``.
ENTRIES = {
    REQUEST: "file",
    RUN_RECORD: "file",
    RESULT: "file",
    METRICS: "folder",
    BANK: "folder",
    CHECKPOINTS: "folder",
    TRUTH: "file",
    REPORT: "file",
}

#: Entries that make a folder a run folder (possibly one still starting).
RUN_MARKERS = (METRICS, BANK, RESULT, REQUEST, RUN_RECORD)

_STATE = re.compile(r"^step-(\d+)\.pt$")
#: A name being written: ``.NAME.tmp`` or ``.NAME.<pid>.tmp``, renamed to ``NAME`` when complete.
_TEMPORARY = re.compile(r"^\.(?P<name>.+?)(\.\d+)?\.tmp$")


def state_file(step: int) -> str:
    """The file name of a trainer state saved at ``step`` (``step-000000400.pt``)."""
    return f"step-{int(step):09d}.pt"


def state_step(name: str) -> int | None:
    """The step of a trainer-state file name, or ``None`` when ``name`` is not one."""
    m = _STATE.match(name)
    return int(m.group(1)) if m else None


# ----------------------------------------------------------------------------------------- metric names

#: Unix time (seconds) of each metric row: a coordinate the metric store records itself.
WALL_TIME = "wall_time"
#: Training loss of the first trainer at the step (the progress sink's copy of its ``loss``).
TRAIN_LOSS = "train_loss"
#: Trainer throughput, steps per second.
STEPS_PER_S = "steps_per_s"
#: The first maker's newest model version (the progress sink's copy of its ``version``).
MAKER_VERSION = "maker_version"
#: Age of the model version the first maker used, in seconds (the sink's copy of its ``staleness_s``).
MAKER_STALENESS_S = "maker_staleness_s"
#: Messages a trainer's bank calls sent per step since its last report (one per shard a send involves).
BANK_MESSAGES_PER_STEP = "bank_messages_per_step"
#: Kilobytes of arrays a trainer's bank calls sent and received per step since its last report.
BANK_KB_PER_STEP = "bank_kb_per_step"
#: Milliseconds per step a trainer waited for the bank since its last report.
BANK_WAIT_MS_PER_STEP = "bank_wait_ms_per_step"
#: CPU milliseconds per step of the trainer's process since its last report.
TRAINER_CPU_MS_PER_STEP = "trainer_cpu_ms_per_step"
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
#: Number of rows carrying a pseudo label.
PL_COUNT = "pl_count"
#: Share of the labels a cleaning maker flagged that are really wrong.
FLAG_PRECISION = "flag_precision"
#: Share of the wrong labels a cleaning maker flagged.
FLAG_RECALL = "flag_recall"
#: Fraction of the training labels flagged.
FLAGGED_FRACTION = "flagged_fraction"
#: Curriculum pacing function: the fraction of the data the schedule admits at the step.
PACING = "pacing"
#: Fraction of the data actually admitted (sampled) up to the step.
ADMITTED_FRACTION = "admitted_fraction"
#: Fraction of the data the sampler actually drew from so far (realised sampling).
SAMPLED_FRACTION = "sampled_fraction"
#: Fraction of the data that has a difficulty score the sampler can rank by.
SCORED_FRACTION = "scored_fraction"
#: Histogram of difficulty scores over fixed bins, one vector per step (dimension ``difficulty_bin``).
DIFFICULTY_HIST = "difficulty_hist"
#: Accuracy per difficulty bin, one vector per step (dimension ``difficulty_bin``).
ACCURACY_BY_DIFFICULTY = "accuracy_by_difficulty"


# ----------------------------------------------------------------------------------------- the folder


def part_hint(path: str | os.PathLike[str], part: str) -> str:
    """A hint for an error about ``path``, where the store ``part`` (:data:`BANK`, :data:`METRICS`) was meant.

    When ``path`` is a run folder that holds ``part``, the hint names ``path/part``; otherwise it is empty.
    """
    p = pathlib.Path(path)
    inner = p / part
    if p.name != part and inner.exists():
        return f"; {p} is a run folder: its {'bank store' if part == BANK else 'metric store'} is {inner}"
    return ""


class RunFolder:
    """The paths of one run folder, and what it holds; reads only.

    Parameters
    ----------
    path
        The run folder (it need not exist).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    # -- paths ------------------------------------------------------------------------------------
    @property
    def request(self) -> pathlib.Path:
        """``RUN/request.json``."""
        return self.path / REQUEST

    @property
    def run_record(self) -> pathlib.Path:
        """``RUN/run.json``."""
        return self.path / RUN_RECORD

    @property
    def result(self) -> pathlib.Path:
        """``RUN/result.json``."""
        return self.path / RESULT

    @property
    def metrics(self) -> pathlib.Path:
        """``RUN/metrics.zarr``."""
        return self.path / METRICS

    @property
    def bank(self) -> pathlib.Path:
        """``RUN/bank``."""
        return self.path / BANK

    @property
    def checkpoints(self) -> pathlib.Path:
        """``RUN/checkpoints``."""
        return self.path / CHECKPOINTS

    @property
    def truth(self) -> pathlib.Path:
        """``RUN/truth.npz``."""
        return self.path / TRUTH

    @property
    def report(self) -> pathlib.Path:
        """``RUN/report.html``."""
        return self.path / REPORT

    def state_dir(self, trainer: str) -> pathlib.Path:
        """``RUN/checkpoints/TRAINER``: the saved states of ``trainer``."""
        return self.checkpoints / trainer

    def temporary(self, name: str) -> pathlib.Path:
        """The name ``name`` (an entry of the folder) is written under before it is renamed."""
        return self.path / f".{name}.tmp"

    # -- what it holds ----------------------------------------------------------------------------
    def is_run(self) -> bool:
        """Whether the folder exists and holds a metric store, a bank or a run record."""
        return self.path.is_dir() and any((self.path / m).exists() for m in RUN_MARKERS)

    def finished(self) -> bool:
        """Whether the run ended normally: it wrote ``result.json``."""
        return self.result.exists()

    def read_json(self, name: str) -> dict[str, Any] | None:
        """The JSON object in entry ``name`` (:data:`REQUEST`, :data:`RESULT`, ...), or ``None`` when it is absent.

        Raises
        ------
        CorruptStoreError
            If the file is there but is not a JSON object.
        """
        p = self.path / name
        try:
            text = p.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CorruptStoreError(f"run folder {self.path}: {name} cannot be read ({exc})") from exc
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise CorruptStoreError(f"run folder {self.path}: {name} is not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise CorruptStoreError(f"run folder {self.path}: {name} holds a JSON {type(obj).__name__}; "
                                    "expected a JSON object")
        return obj

    def state_steps(self, trainer: str) -> list[int]:
        """The steps of ``trainer``'s saved states, oldest first."""
        folder = self.state_dir(trainer)
        if not folder.is_dir():
            return []
        return sorted(s for p in folder.iterdir() if (s := state_step(p.name)) is not None)

    def unknown(self) -> list[str]:
        """Entries (relative paths) of the folder that are no part of a run folder; empty for a clean one.

        Looks at the top level and at ``checkpoints/`` (one folder per trainer, holding state files); the
        inside of ``bank/`` and ``metrics.zarr/`` belongs to their stores.
        """
        if not self.path.is_dir():
            return []
        odd = []
        for entry in sorted(self.path.iterdir()):
            name = entry.name
            m = _TEMPORARY.match(name)
            kind = ENTRIES.get(m.group("name") if m else name)
            if kind is None or (kind == "folder") != entry.is_dir():
                odd.append(name)
        if self.checkpoints.is_dir():
            for trainer in sorted(self.checkpoints.iterdir()):
                if not trainer.is_dir():
                    odd.append(f"{CHECKPOINTS}/{trainer.name}")
                    continue
                for f in sorted(trainer.iterdir()):
                    m = _TEMPORARY.match(f.name)
                    if state_step(m.group("name") if m else f.name) is None:
                        odd.append(f"{CHECKPOINTS}/{trainer.name}/{f.name}")
        return odd
